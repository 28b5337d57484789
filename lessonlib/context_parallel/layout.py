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
Every rank of a group must use the same layout, mask and documents: one that does not would
meet the others' chunks at the wrong places (or wait for a message nobody sends) and return a
wrong answer without any error, or hang; so ``check_same_layout`` all-gathers a small code
on every call.

Laptop:  ``python -c "from lessonlib.context_parallel.layout import chunks_of; \\
          print([chunks_of(r, 4, 'zigzag') for r in range(4)])"``
GPU box: the same; ``unshard_sequence`` all-gathers over NCCL there.
"""
from __future__ import annotations

import functools
import hashlib
from collections import defaultdict

import torch
import torch.distributed as dist

from lessonlib import comm, device
from lessonlib.argcheck import positive_int
from lessonlib.instruments.ledger import unrecorded

LAYOUTS = ("contiguous", "zigzag")


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


def doc_digest(doc_ids) -> int:
    """0 for no document mask, else a 56-bit digest of ``doc_ids``'s shape and values (+1)."""
    if doc_ids is None:
        return 0
    ids = doc_ids.detach().to("cpu", torch.int64).contiguous()
    data = str(tuple(ids.shape)).encode() + ids.numpy().tobytes()
    return int.from_bytes(hashlib.blake2b(data, digest_size=7).digest(), "little") + 1


def _said(code: int, digest: int) -> str:
    docs = f"#{digest - 1:014x}" if digest else "None"
    return f"layout={LAYOUTS[code // 2]!r} causal={bool(code % 2)} doc_ids={docs}"


def check_same_layout(group, layout: str, causal: bool, doc_ids=None) -> None:
    """ValueError on every rank if the ranks of ``group`` pass different layouts, masks or
    documents, naming the ranks and what each passed.

    Checked on every call, not only a group's first: the ranks all-gather two int64 each
    (the layout and mask as one code, a digest of ``doc_ids``), 16 bytes per rank per call,
    so every rank must make the call together, as it must make every call of the method.
    A check remembered after the first call would miss a later call where one rank changed
    its settings (only that rank would gather: a hang), and a check made only when a rank's
    settings change has the same flaw. The check's all-gather leaves a breadcrumb but no
    ledger event (``ledger.unrecorded``): a ledger counts the method's own messages, which the
    cost model predicts."""
    c = dist.get_world_size(group)
    if c == 1:
        return
    mine = torch.tensor([LAYOUTS.index(layout) * 2 + bool(causal), doc_digest(doc_ids)],
                        device=device.current_device())
    codes = torch.empty(2 * c, dtype=mine.dtype, device=mine.device)
    with unrecorded():
        comm.all_gather_into_tensor(codes, mine, group=group)
    codes = [tuple(pair) for pair in codes.view(c, 2).tolist()]
    if len(set(codes)) > 1:
        members = dist.get_process_group_ranks(group) if group is not None else range(c)
        ranks = defaultdict(list)
        for member, code in zip(members, codes):
            ranks[code].append(str(member))
        said = "; ".join(f"rank{'s' * (len(who) > 1)} {', '.join(who)}: {_said(*code)}"
                         for code, who in ranks.items())
        raise ValueError(f"the ranks of the context-parallel group disagree ({said}); every "
                         f"rank must pass the same layout, causal and doc_ids")
