"""How a sequence is split over the c ranks of a context-parallel group, and back.

What it teaches: context parallelism cuts the sequence dimension s. Cut into c contiguous
pieces, a causal mask makes the work uneven: the rank holding the last tokens attends to
every earlier token, the first only to its own, so the last rank does about 2c-1 times the
first's work. The zig-zag split (Llama 3, torchtitan; Brandon et al. 2023 stripe it) cuts the
sequence into 2c equal chunks and gives rank i chunks i and 2c-1-i: an early chunk and a late
one, so every rank does the same work.

    contiguous, c = 2:  rank 0 | chunk 0 |            rank 1 | chunk 1 |
    zig-zag,    c = 2:  rank 0 | 0 | 3 |              rank 1 | 1 | 2 |

``chunks_of`` names the chunks a rank holds (pure), ``positions_of`` their tokens' places in
the whole sequence (for the position embedding and the causal mask); ``shard_sequence`` takes
this rank's shard of a full tensor and ``unshard_sequence`` gathers the shards back into it.
Every rank of a group must use the same layout (and mask): one that does not would meet the
others' chunks at the wrong places and return a wrong answer without any error, so
``check_same_layout`` all-gathers a small code the first time a group meets a layout, once.

Laptop:  ``python -c "from lessonlib.context_parallel.layout import chunks_of; \\
          print([chunks_of(r, 4, 'zigzag') for r in range(4)])"``
GPU box: the same; ``unshard_sequence`` all-gathers over NCCL there.
"""
from __future__ import annotations

import functools
import weakref

import torch
import torch.distributed as dist

from lessonlib import comm, device
from lessonlib.argcheck import positive_int

LAYOUTS = ("contiguous", "zigzag")
_agreed: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # group -> {(layout, causal)}


def check_split_name(layout: str) -> str:
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r} is not a sequence layout; use one of {LAYOUTS}")
    return layout


def chunks_per_rank(layout: str) -> int:
    return 2 if check_split_name(layout) == "zigzag" else 1


def chunks_of(rank: int, c: int, layout: str = "zigzag") -> tuple[int, ...]:
    """The chunks rank ``rank`` of ``c`` holds, in order: (rank,) of c chunks for
    "contiguous", (rank, 2c-1-rank) of 2c chunks for "zigzag"."""
    c = positive_int("c", c, what="the ranks of the context-parallel group")
    if not (isinstance(rank, int) and 0 <= rank < c):
        raise ValueError(f"rank={rank!r} must be in 0..{c - 1} (a member of the group of c={c})")
    return (rank,) if check_split_name(layout) == "contiguous" else (rank, 2 * c - 1 - rank)


def check_split_divides(s: int, c: int, layout: str) -> int:
    """The chunk length; ValueError if s does not split into c (or 2c) equal chunks."""
    pieces = c * chunks_per_rank(layout)
    if s % pieces:
        fits = f"a multiple of {pieces}, e.g. {pieces * max(1, s // pieces)}"
        raise ValueError(f"s={s} tokens do not split into {pieces} equal chunks ({layout} layout "
                         f"over c={c} ranks); use s {fits}")
    return s // pieces


def positions_of(rank: int, c: int, s: int, layout: str = "zigzag", device=None) -> torch.Tensor:
    """Where this rank's s/c tokens sit in the whole sequence of s, in shard order."""
    n = check_split_divides(s, c, layout)
    return torch.cat([torch.arange(i * n, (i + 1) * n, device=device)
                      for i in chunks_of(rank, c, layout)])


@functools.lru_cache(maxsize=64)
def positions_on(rank: int, c: int, s: int, layout: str, device: torch.device) -> torch.Tensor:
    """``positions_of``, made once on ``device`` and kept: an embedding reads it every
    forward without a host-to-device copy (nothing may write into it)."""
    return positions_of(rank, c, s, layout, device)


def group_rank(group) -> tuple[int, int]:
    """(this rank's place in ``group``, the group's size); ValueError if it is not a member."""
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError(f"rank {dist.get_rank()} is not in the given group of ranks "
                         f"{dist.get_process_group_ranks(group)}; call it only on its members")
    return rank, dist.get_world_size(group)


def shard_sequence(x: torch.Tensor, group=None, layout: str = "zigzag", dim: int = 1):
    """This rank's shard of the full tensor ``x``: its chunks along ``dim``, concatenated."""
    rank, c = group_rank(group)
    n = check_split_divides(x.shape[dim], c, layout)
    return torch.cat([x.narrow(dim, i * n, n) for i in chunks_of(rank, c, layout)], dim=dim)


def unshard_sequence(x: torch.Tensor, group=None, layout: str = "zigzag", dim: int = 1):
    """The full tensor from every rank's shard (an all-gather, then the chunks put in order):
    the inverse of ``shard_sequence``."""
    _, c = group_rank(group)
    per = chunks_per_rank(layout)
    n = check_split_divides(x.shape[dim] * c, c, layout)
    shards = [torch.empty_like(x) for _ in range(c)]
    comm.all_gather(shards, x.contiguous(), group=group)
    placed = {}
    for r, shard in enumerate(shards):
        for j, i in enumerate(chunks_of(r, c, layout)):
            placed[i] = shard.narrow(dim, j * n, n)
    return torch.cat([placed[i] for i in range(c * per)], dim=dim)


def check_same_layout(group, layout: str, causal: bool) -> None:
    """ValueError on every rank if the ranks of ``group`` pass different layouts or masks.

    The first time a group meets a (layout, causal) pair its ranks all-gather one small
    code each (a few bytes, once; remembered afterwards), so every rank must make that first
    call together, as it must make every call of the ring."""
    key = dist.group.WORLD if group is None else group
    seen = _agreed.setdefault(key, set())
    c = dist.get_world_size(group)
    if (layout, causal) in seen or c == 1:
        return
    code = torch.tensor([LAYOUTS.index(layout) * 2 + bool(causal)], device=device.current_device())
    codes = torch.empty(c, dtype=code.dtype, device=code.device)
    comm.all_gather_into_tensor(codes, code, group=group)
    if len(set(codes.tolist())) > 1:
        said = ", ".join(f"rank {r} layout={LAYOUTS[x // 2]!r} causal={bool(x % 2)}"
                         for r, x in enumerate(codes.tolist()))
        raise ValueError(f"the ranks of the context-parallel group disagree on the ring ({said}); "
                         f"every rank must pass the same layout and causal")
    seen.add((layout, causal))
