"""The two all-to-alls of expert parallelism, differentiable: dispatch and its return trip.

What it teaches: with the experts split over e ranks, each rank's routed tokens must reach
the rank that holds their expert, and come back. Both trips are one ``all_to_all_single``:
rank r sends its i-th slice to rank i and receives rank i's slice for r. How many rows each
slice holds depends on the routing, so it changes step to step: the ranks first exchange
their counts per expert (a small all-to-all of E integers), then the tokens. The backward
of an all-to-all is the all-to-all with the splits swapped: gradients retrace the tokens'
path (GShard, Lepikhin et al. 2020, §2.2; Megatron-Core's and DeepSpeed's token
dispatchers exchange the counts the same way).

Laptop:  run through ``lessonlib.expert_parallel.layer_runs`` (``python labs/ep.py``).
GPU box: the same calls under NCCL; the counts live on the GPU and are read once per layer.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch
import torch.distributed as dist

from lessonlib import comm


@dataclass
class Splits:
    """What one rank sends and receives in the dispatch all-to-all, read to the host once."""
    send: list[int]       # rows to each rank of the group (its experts' tokens)
    recv: list[int]       # rows from each rank of the group
    counts: list          # (e, E/e): rows from each rank for each of this rank's experts
    kept: list[int]       # (E,) this rank's rows for each expert (what it sends)
    routed: list[int]     # (E,) this rank's choices per expert before the capacity cut
    on_device: torch.Tensor  # (E,) ``counts`` flattened, where the exchange left them


def check_counts(tokens_per_expert, e: int) -> None:
    """The counts ``exchange_counts`` sends: a 1-D integer tensor, E of them, E a multiple of
    e (its values, whole and >= 0, are checked once they are read to the host)."""
    t = tokens_per_expert
    if not (isinstance(t, torch.Tensor) and t.dim() == 1 and len(t) and len(t) % e == 0
            and not t.is_floating_point() and not t.is_complex() and t.dtype != torch.bool):
        _bad_counts(t, e)


def _bad_counts(t, e: int):
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


def exchange_counts(tokens_per_expert: torch.Tensor, routed_per_expert: torch.Tensor = None,
                    group=None) -> Splits:
    """All-to-all the per-expert counts (E,) so that each rank learns, for each of its E/e
    experts, how many rows every rank will send it: the splits of the token all-to-all.
    The one read back to the host of the layer's forward: these counts and this rank's
    own (kept and routed per expert, ``routed_per_expert`` defaulting to the kept), in one
    copy; a negative count is refused there, before any row moves."""
    e = dist.get_world_size(group)
    check_counts(tokens_per_expert, e)
    E = tokens_per_expert.numel()
    routed_per_expert = tokens_per_expert if routed_per_expert is None else routed_per_expert
    counts = torch.empty_like(tokens_per_expert)
    comm.all_to_all_single(counts, tokens_per_expert.contiguous(), group=group)
    host = torch.cat([counts, tokens_per_expert, routed_per_expert]).tolist()   # (3 E,)
    received, kept, routed = host[:E], host[E:2 * E], host[2 * E:]
    if min(kept) < 0:
        _bad_counts(tokens_per_expert, e)
    rows = [received[i * E // e:(i + 1) * E // e] for i in range(e)]           # (e, E/e)
    return Splits(send=[sum(kept[i * E // e:(i + 1) * E // e]) for i in range(e)],
                  recv=[sum(r) for r in rows], counts=rows, kept=kept, routed=routed,
                  on_device=counts)


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


def post_all_to_all(x: torch.Tensor, recv: list[int], send: list[int], group=None):
    """``all_to_all_rows``' exchange posted, not waited for: (out, work), ``out`` (sum(recv), h)
    filled once ``work.wait()`` returns. Outside autograd: its backward is the same call on
    the gradient with ``recv`` and ``send`` swapped, made by the caller
    (``expert_parallel.overlap`` posts both directions so, one micro-batch's behind the
    other's compute)."""
    out = x.new_empty(sum(recv), *x.shape[1:])                                 # (m, h)
    return out, comm.all_to_all_single(out, x.contiguous(), recv, send, group=group,
                                       async_op=True)


def all_to_all_rows(x: torch.Tensor, recv: list[int], send: list[int], group=None) -> torch.Tensor:
    """Differentiable ``all_to_all_single`` on rows: (sum(send), h) -> (sum(recv), h)."""
    e = dist.get_world_size(group)
    recv, send = check_splits("recv", recv, e), check_splits("send", send, e)
    if x.shape[0] != sum(send):
        raise ValueError(f"send={send} sends {sum(send)} rows but x has {x.shape[0]}; send must "
                         f"split x's rows over the e={e} ranks")
    return _AllToAll.apply(x, recv, send, group)
