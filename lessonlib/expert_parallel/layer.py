"""The expert-parallel MoE layer: the router on every rank, E/e experts on each.

What it teaches: GShard's MoE layer split over the e ranks of an expert-parallel group is
the one-process layer with an exchange in the middle. Each rank routes its own tokens (the
router is replicated; capacity counts this rank's batch, as GShard counts it per group),
sends each routed token to the rank of its expert, runs its E/e experts on what arrives,
and sends the results back to be combined:

    route -> dispatch all-to-all -> local experts -> return all-to-all -> combine

Dropless routing (``capacity_factor=None``) is the same code: no choice is cut, and the
all-to-all's splits, exchanged first, simply vary from step to step; the forward still
reads the device once, at that exchange.

``expert_parallel(moe, group)`` builds this rank's layer from the full layer's own weights,
so e = 1, 2, 4 are the same model and its ``forward(x)`` on this rank's tokens returns what
``moe(x)`` returns for them, with the same ``stats``.

Laptop:  see ``lessonlib.expert_parallel.layer_runs`` (``python labs/ep.py --world-size 4``).
GPU box: ``torchrun --nproc-per-node 8 labs/ep.py`` (NCCL; e up to the GPUs).
"""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import nn

from lessonlib.expert_parallel.dispatch import Splits, all_to_all_rows, exchange_counts
from lessonlib.models.moe import ROUTING, MoELayer, Routed, check_moe, combine, run_experts
from lessonlib.models.moe_routing import cut, queue


def check_split(n_experts: int, e: int, top_k: int = 1, capacity_factor=1.25,
                **routing) -> int:
    """E/e, after checking the settings (one line each): E divisible by e, k <= E, C > 0 or
    None, and the routing options (``moe_routing.check_routing``)."""
    n_experts, _, _ = check_moe(n_experts, top_k, capacity_factor, **routing)
    if e < 1 or n_experts % e:
        raise ValueError(f"n_experts={n_experts} must be divisible by the expert-parallel size "
                         f"e={e} (each rank holds E/e experts), e.g. e in "
                         f"{[d for d in range(1, n_experts + 1) if n_experts % d == 0]}")
    return n_experts // e


def run_local_experts(experts, received: torch.Tensor, splits: Splits) -> torch.Tensor:
    """This rank's experts on the rows that arrived, in arrival order (by source rank, then
    by expert): regroup them by expert, run each expert once, put them back in order. The
    sizes come from ``splits`` (read once), so nothing here waits for the device."""
    e, local = len(splits.counts), len(splits.counts[0])
    expert_of_row = torch.arange(local, device=received.device).repeat(e)
    expert_of_row = expert_of_row.repeat_interleave(splits.on_device,
                                                    output_size=received.shape[0])
    order = torch.sort(expert_of_row, stable=True).indices
    per_expert = [sum(col) for col in zip(*splits.counts)]
    out = run_experts(experts, received[order], per_expert)                    # (m, h)
    return out[torch.argsort(order)]


class ExpertParallelMoE(Routed):
    """This rank's share of an ``MoELayer``: ``router`` (replicated), ``experts`` (this
    rank's E/e), ``expert_ids`` (their global indices), ``shared`` (replicated, if any),
    the routing settings and the balancing bias (replicated: every rank chooses alike)."""

    def __init__(self, moe: MoELayer, group=None):
        super().__init__()
        e, rank = dist.get_world_size(group), dist.get_rank(group)
        local = check_split(moe.n_experts, e, moe.top_k, moe.capacity_factor)
        self.group = group
        for name in ROUTING:
            setattr(self, name, getattr(moe, name))
        self.register_buffer("expert_bias", None if moe.expert_bias is None
                             else moe.expert_bias.detach().clone())
        self.expert_ids = list(range(rank * local, (rank + 1) * local))
        self.router = copy.deepcopy(moe.router)
        self.experts = nn.ModuleList(copy.deepcopy(moe.experts[i]) for i in self.expert_ids)
        self.shared = copy.deepcopy(moe.shared)

    @staticmethod
    def _count(routed) -> dict:
        """The counts this forward already read to the host, and the rows each rank got."""
        routing, splits = routed
        counts = routing.stats(splits.kept, splits.routed)
        return {**{k: v for k, v in counts.items() if k != "aux_loss"},
                "sent_rows": splits.send, "received_rows": splits.recv,
                "received_per_expert": [sum(col) for col in zip(*splits.counts)]}

    def forward(self, x):
        b, s, h = x.shape
        tokens = x.reshape(b * s, h)                                            # (T, h)
        choices = queue(self.router(tokens), self.top_k, self.capacity_factor, self.aux_alpha,
                        **self.routing_options())
        splits = exchange_counts(choices.tokens_per_expert, choices.routed_per_expert,
                                 self.group)            # the forward's one read to the host
        routing = cut(choices, sum(splits.send))
        routed = tokens[routing.token]         # (n, h), grouped by expert, so by rank
        received = all_to_all_rows(routed, splits.recv, splits.send, self.group)     # (m, h)
        expert_out = run_local_experts(self.experts, received, splits)          # (m, h)
        returned = all_to_all_rows(expert_out, splits.send, splits.recv, self.group)  # (n, h)
        out = combine(returned, routing, b * s)                                 # (T, h)
        if self.shared is not None:
            out = out + self.shared(tokens)
        self.aux_loss, self._routed = routing.aux_loss, (routing, splits)
        return out.view(b, s, h)                                                # (b, s, h)


def expert_parallel(moe: MoELayer, group=None) -> ExpertParallelMoE:
    """This rank's expert-parallel copy of ``moe`` over ``group`` (None: the world)."""
    return ExpertParallelMoE(moe, group)


def apply_ep(block: nn.Module, ctx) -> nn.Module:
    """The hybrid builder's EP room: a ``Block``'s MoE layer made expert-parallel over the
    grid's ep axis (``ctx.axis("ep")``), its E experts E/e a rank; any other part as it is."""
    ep = ctx.axis("ep")
    if ep.size > 1 and isinstance(getattr(block, "mlp", None), MoELayer):
        block.mlp = expert_parallel(block.mlp, ep.group)
    return block


def expert_parallel_gpt(model: nn.Module, group=None) -> nn.Module:
    """A copy of an MoE GPT (``lessonlib.models.moe_gpt``) whose every block's MoE layer is
    expert-parallel over ``group``; attention, embeddings and the head stay replicated."""
    twin = copy.deepcopy(model)
    for block in twin.blocks:
        block.mlp = expert_parallel(block.mlp, group)
    return twin
