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

The averaging itself is the data-parallel ladder's flat rung, handed the experts
(``data_parallel.ladder.sync_gradients``).

Laptop:  see ``lessonlib.expert_parallel.layer_runs``.
GPU box: the same groups under NCCL; keep each expert-parallel group inside a server.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from lessonlib import bug_switches, comm
from lessonlib.argcheck import positive_int
from lessonlib.grid import Axis, ParallelContext, destroy_groups
from lessonlib.models.moe import moe_layers


@dataclass(frozen=True)
class ExpertParallelContext:
    """A view of ``ParallelContext``'s ep and edp axes with all d ranks data-parallel, under
    the grid's names: ``ep`` (this rank's expert-parallel group, e consecutive ranks) and
    ``edp`` (the d/e ranks e apart that hold the same experts), each an ``Axis`` (size,
    rank, group, ranks)."""
    d: int
    ep: Axis
    edp: Axis

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
        return cls(d, ctx.axis("ep"), ctx.axis("edp"))

    def destroy(self) -> None:
        destroy_groups([self.ep.group, self.edp.group])


def expert_parameters(module) -> list:
    """The parameters of ``module``'s expert-parallel MoE layers' own experts."""
    return [p for m in module.modules() if hasattr(m, "expert_ids")
            for p in m.experts.parameters()]


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
