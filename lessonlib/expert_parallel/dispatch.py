"""The two all-to-alls of expert parallelism, differentiable: dispatch and its return trip.

What it teaches: with the experts split over e ranks, each rank's routed tokens must reach
the rank that holds their expert, and come back. Both trips are one ``all_to_all_single``:
rank r sends its i-th slice to rank i and receives rank i's slice for r. How many rows each
slice holds depends on the routing, so it changes step to step: the ranks first exchange
their counts per expert (a small all-to-all of E integers), then the tokens. The backward
of an all-to-all is the all-to-all with the splits swapped: gradients retrace the tokens'
path (GShard, Lepikhin et al. 2020, §2.2; Megatron-Core's and DeepSpeed's token
dispatchers exchange the counts the same way).

Laptop:  run through ``lessonlib.expert_parallel.runs`` (``python labs/ep.py``).
GPU box: the same calls under NCCL; the counts live on the GPU and are read once.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch
import torch.distributed as dist

from lessonlib import comm


@dataclass
class Splits:
    """What one rank sends and receives in the dispatch all-to-all."""
    send: list[int]       # rows to each rank of the group (its experts' tokens)
    recv: list[int]       # rows from each rank of the group
    counts: torch.Tensor  # (e, E/e): rows from each rank for each of this rank's experts


def check_counts(tokens_per_expert, e: int) -> None:
    """The counts ``exchange_counts`` sends: one whole number >= 0 per expert, E of them."""
    t = tokens_per_expert
    if not (isinstance(t, torch.Tensor) and t.dim() == 1 and len(t) and len(t) % e == 0
            and not t.is_floating_point() and not t.is_complex() and t.dtype != torch.bool
            and not (t < 0).any()):
        got = (f"shape {tuple(t.shape)}, {str(t.dtype).replace('torch.', '')}"
               if isinstance(t, torch.Tensor) else f"{t!r:.40}")
        raise ValueError(f"tokens_per_expert must be a 1-D tensor of E whole counts >= 0, E a "
                         f"multiple of the group's e={e} ranks (E/e experts each); got {got}")


def check_splits(name: str, splits, e: int) -> list[int]:
    """Rows to or from each rank: e whole numbers >= 0; ValueError naming ``name`` if not."""
    splits = splits.tolist() if isinstance(splits, torch.Tensor) else splits
    if not (isinstance(splits, (list, tuple)) and len(splits) == e and all(
            isinstance(n, numbers.Integral) and not isinstance(n, bool) and n >= 0
            for n in splits)):
        raise ValueError(f"{name}={splits!r:.60} must be e={e} whole row counts >= 0, one per "
                         f"rank of the group")
    return [int(n) for n in splits]


def exchange_counts(tokens_per_expert: torch.Tensor, group=None) -> Splits:
    """All-to-all the per-expert counts (E,) so that each rank learns, for each of its E/e
    experts, how many rows every rank will send it: the splits of the token all-to-all."""
    e = dist.get_world_size(group)
    check_counts(tokens_per_expert, e)
    counts = torch.empty_like(tokens_per_expert)
    comm.all_to_all_single(counts, tokens_per_expert.contiguous(), group=group)
    counts = counts.view(e, -1)                                                  # (e, E/e)
    send = tokens_per_expert.view(e, -1).sum(1)
    return Splits(send=send.tolist(), recv=counts.sum(1).tolist(), counts=counts)


class _AllToAll(torch.autograd.Function):
    """Rows ``send[i]`` go to rank i, ``recv[i]`` arrive from it; backward swaps them."""

    @staticmethod
    def forward(ctx, x, recv, send, group):
        ctx.recv, ctx.send, ctx.group = recv, send, group
        out = x.new_empty(sum(recv), *x.shape[1:])
        comm.all_to_all_single(out, x.contiguous(), recv, send, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        back = grad.new_empty(sum(ctx.send), *grad.shape[1:])
        comm.all_to_all_single(back, grad.contiguous(), ctx.send, ctx.recv, group=ctx.group)
        return back, None, None, None


def all_to_all(x: torch.Tensor, recv: list[int], send: list[int], group=None) -> torch.Tensor:
    """Differentiable ``all_to_all_single`` on rows: (sum(send), h) -> (sum(recv), h)."""
    e = dist.get_world_size(group)
    recv, send = check_splits("recv", recv, e), check_splits("send", send, e)
    if x.shape[0] != sum(send):
        raise ValueError(f"send={send} sends {sum(send)} rows but x has {x.shape[0]}; send must "
                         f"split x's rows over the e={e} ranks")
    return _AllToAll.apply(x, recv, send, group)
