"""Expert parallelism inside data parallelism: which ranks average which gradients.

What it teaches: the world's d ranks are all data-parallel (each has its own batch), and
the expert-parallel groups of e consecutive ranks sit inside them, as Megatron-Core and
DeepSeek-V3 lay them out: rank r holds experts of block r mod e, and the d/e ranks with the
same r mod e hold copies of the same experts (the expert-data-parallel group). The loss is
the mean over all d ranks' batches, so

* a dense weight (router, shared expert), replicated on all d ranks: its gradient is summed
  over all d ranks and divided by d, as in plain data parallelism;
* an expert's weight: the return all-to-all has already summed what the e ranks of its
  group sent it, so its gradient is summed over the d/e ranks holding a copy and divided by
  d (not by d/e: each copy's gradient already holds e ranks' batches);
* DeepSeek-V3's balancing bias (a buffer, not a parameter): after the optimizer step every
  replica moves it by the load of the whole batch, each rank's load per expert all-reduced
  over the d ranks (one all-reduce for every MoE layer), so the replicas stay identical.

Laptop:  see ``lessonlib.expert_parallel.layer_runs``.
GPU box: the same groups under NCCL; keep each expert-parallel group inside a server.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from lessonlib import bug_switches, comm
from lessonlib.argcheck import positive_int
from lessonlib.data_parallel.ladder import (allreduce_flat_gradients, gradients,
                                            trainable_parameters)
from lessonlib.grid import ParallelContext
from lessonlib.models.moe import moe_layers


@dataclass(frozen=True)
class ExpertParallelContext:
    """This rank's expert-parallel group (e consecutive ranks) and expert-data-parallel
    group (the d/e ranks e apart that hold the same experts): a view of ``ParallelContext``'s
    ep and edp axes with all d ranks data-parallel."""
    e: int
    d: int
    ep_rank: int
    ep_group: object = field(repr=False)
    expert_dp_group: object = field(repr=False)
    ep_ranks: tuple = ()
    expert_dp_ranks: tuple = ()

    @classmethod
    def build(cls, e: int) -> "ExpertParallelContext":
        """Create the ep and edp groups alone (``ParallelContext.build``'s ``only``), on
        every rank in the same order, and keep this rank's."""
        d = dist.get_world_size()
        e = positive_int("e", e, most=d, what="ranks of an expert-parallel group")
        if d % e:
            raise ValueError(f"e={e!r} must divide the world size {d} (expert-parallel groups "
                             f"of e consecutive ranks inside the data-parallel ranks)")
        ctx = ParallelContext.build(dp=d, pp=1, tp=1, ep=e, only=("ep", "edp"))
        ep, edp = ctx.axis("ep"), ctx.axis("edp")
        return cls(e, d, ep.rank, ep.group, edp.group, ep.ranks, edp.ranks)

    def destroy(self) -> None:
        for group in (self.ep_group, self.expert_dp_group):
            dist.destroy_process_group(group)


def expert_parameters(module) -> list:
    """The parameters of ``module``'s expert-parallel MoE layers' own experts."""
    return [p for m in module.modules() if hasattr(m, "expert_ids")
            for p in m.experts.parameters()]


def sync_gradients(module, group=None, expert_group=None, d: int | None = None) -> None:
    """Average ``module``'s gradients over the ranks holding the same weights, in place, one
    flat all-reduce each (``allreduce_flat_gradients``): the dense weights over ``group``
    (divided by its ranks); an expert's, if any, over ``expert_group`` (the ranks holding a
    copy of it), divided by the d data-parallel ranks. The hybrid layouts call it with
    their dp (or dp*cp) and edp groups, the expert-parallel lesson with the world and
    ``ExpertParallelContext.expert_dp_group``."""
    experts = {id(p) for p in expert_parameters(module)}
    params = trainable_parameters(module)
    allreduce_flat_gradients(gradients(p for p in params if id(p) not in experts), group)
    if experts:
        if bug_switches.active("ep_expert_grads_wrong_group"):
            expert_group = group   # the bug: experts averaged like dense weights, over all d
        allreduce_flat_gradients(gradients(p for p in params if id(p) in experts),
                                 expert_group, d)


def update_biases(module, group=None) -> None:
    """After the optimizer step: every MoE layer's ``update_bias`` with its load of this step
    summed over the data-parallel ranks ``group`` (None: the world, all d ranks here), one
    all-reduce of L E counts for L layers."""
    layers = [m for m in moe_layers(module) if m.expert_bias is not None]
    if not layers:
        return
    dev = layers[0].expert_bias.device
    load = torch.tensor([m.stats["routed_per_expert"] for m in layers], device=dev)  # (L, E)
    # the bug skips the all-reduce: each replica moves its bias by its own batch's load
    if not bug_switches.active("ep_bias_load_not_all_reduced"):
        comm.all_reduce(load, group=group)
    for layer, layer_load in zip(layers, load):
        layer.update_bias(layer_load)
