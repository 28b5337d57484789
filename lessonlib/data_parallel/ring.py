"""The bandwidth-optimal ring all-reduce: reduce-scatter, then all-gather.

What it teaches: cut the tensor into n chunks; in n-1 steps of reduce-scatter each rank
ends up owning the full sum of one chunk, in n-1 steps of all-gather it passes the finished
chunks on (Baidu's ring all-reduce; MPICH's reduce-scatter + all-gather). Each rank sends
2(n-1)/n x S bytes: almost independent of n, which is why data parallelism scales. The two
halves are also what sharded data parallelism uses on their own.

Laptop:  ``python labs/allreduce.py --world-size 4 --size-mb 16``
GPU box: ``torchrun --nproc-per-node 8 labs/allreduce.py --size-mb 256`` (NCCL)
"""
from __future__ import annotations

import torch

from lessonlib import comm
from lessonlib.data_parallel.collectives import scratch
from lessonlib.data_parallel.collectives import (_prepare, naive_ring_all_reduce,
                                                 parameter_server_all_reduce)


# ---------------------------------------------------------------- bandwidth-optimal ring
def ring_chunks(flat: torch.Tensor, n: int) -> list[torch.Tensor]:
    """``flat`` cut into n views whose lengths differ by at most one (the first ones longer).

    Every rank cuts the same length the same way, so a chunk sent is the size expected."""
    return list(flat.tensor_split(n))


def _post_receives(buffers, src: int, group) -> list:
    """Post a receive for every buffer at once (None for empty ones, which nobody sends)."""
    return [comm.irecv(b, src=src, group=group) if b.numel() else None for b in buffers]


def _send(tensor, dst: int, group, sends: list) -> None:
    if tensor.numel():
        sends.append(comm.isend(tensor, dst=dst, group=group))


PIECES = 2                 # a large chunk travels in slices, so forwarding overlaps arriving
PIECE_MIN_BYTES = 2 ** 18  # below this a chunk goes whole: a second message would cost more


def ring_reduce_scatter(chunks, me: int, members: list[int], group=None,
                        pieces: int = PIECES) -> int:
    """The first half of the ring: n-1 steps in which rank ``me`` sends chunk (me - step) to
    its right and adds chunk (me - step - 1), arriving from its left, into its own copy.
    Afterwards chunk (me + 1) mod n holds the sum over all ranks; returns that index.

    Two refinements over the textbook loop (the notebook's exercise writes that loop):
    every receive is posted before the first send, into its own row of an inbox, so no
    rank waits for its neighbour to be ready; and each chunk travels in ``pieces`` slices,
    so a rank forwards the first slice it has summed while the next is still arriving
    (gloo and NCCL pipeline their rings the same way)."""
    n = len(members)
    right, left = members[(me + 1) % n], members[(me - 1) % n]
    incoming = [(me - step - 1) % n for step in range(n - 1)]          # chunk index per step
    inbox = scratch((n - 1) * chunks[0].numel(), chunks[0]).view(n - 1, -1)   # (n-1, S/n)
    rows = [inbox[step, :chunks[i].numel()].tensor_split(pieces)
            for step, i in enumerate(incoming)]
    receives, sends = [_post_receives(row, left, group) for row in rows], []
    for piece in chunks[me].tensor_split(pieces):
        _send(piece, right, group, sends)
    for step, i in enumerate(incoming):
        for mine, arrived, work in zip(chunks[i].tensor_split(pieces), rows[step],
                                       receives[step]):
            if work is not None:
                work.wait()
            mine.add_(arrived)
            if step < n - 2:                  # what was just summed travels on at once
                _send(mine, right, group, sends)
    for work in sends:
        work.wait()
    return (me + 1) % n


def ring_all_gather(chunks, me: int, members: list[int], group=None,
                    pieces: int = PIECES) -> None:
    """The second half: rank ``me`` owns finished chunk (me + 1) mod n; in n-1 steps each
    rank forwards the finished chunk it last got, and every rank ends with all of them.
    Receives land directly in their chunks, all posted before the first send."""
    n = len(members)
    right, left = members[(me + 1) % n], members[(me - 1) % n]
    slices = [chunks[(me - step) % n].tensor_split(pieces) for step in range(n - 1)]
    receives, sends = [_post_receives(row, left, group) for row in slices], []
    for piece in chunks[(me + 1) % n].tensor_split(pieces):
        _send(piece, right, group, sends)
    for step in range(n - 1):
        for piece, work in zip(slices[step], receives[step]):
            if work is not None:
                work.wait()
            if step < n - 2:
                _send(piece, right, group, sends)
    for work in sends:
        work.wait()


def ring_all_reduce(tensor, group=None, average: bool = False, check: bool = True):
    """Sum (or average) ``tensor`` over ``group`` in place: reduce-scatter, then all-gather.

    2(n-1) steps, each sending about S/n bytes: 2(n-1)/n x S per rank in all. Each chunk is
    summed once and then copied, so every rank ends with bit-identical values."""
    me, members, work = _prepare(tensor, group, average, check)
    n = len(members)
    if n == 1 or work.flat.numel() == 0:
        return work.finish()
    chunks = ring_chunks(work.flat, n)
    pieces = PIECES if chunks[0].numel() * chunks[0].element_size() >= PIECE_MIN_BYTES else 1
    owned = ring_reduce_scatter(chunks, me, members, group, pieces)
    if average:
        chunks[owned].div_(n)          # divide the one finished chunk, not the whole tensor
    ring_all_gather(chunks, me, members, group, pieces)
    return work.finish()


ALGORITHMS = {"ring": ring_all_reduce, "naive_ring": naive_ring_all_reduce,
              "parameter_server": parameter_server_all_reduce}
