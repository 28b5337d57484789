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

from collections import deque

import torch

from lessonlib import comm
from lessonlib.data_parallel.collectives import (naive_ring_all_reduce, pair_ops,
                                                 parameter_server_all_reduce, prepare, scratch)


# ---------------------------------------------------------------- bandwidth-optimal ring
def ring_chunks(flat: torch.Tensor, n: int) -> list[torch.Tensor]:
    """``flat`` cut into n views whose lengths differ by at most one (the first ones longer).

    Every rank cuts the same length the same way, so a chunk sent is the size expected."""
    return list(flat.tensor_split(n))


PIECES = 2                 # a large chunk travels in slices, so forwarding overlaps arriving
PIECE_MIN_BYTES = 2 ** 18  # below this a chunk goes whole: a second message would cost more


def ring_pass(outgoing, incoming, right: int, left: int, group=None, arrived=None) -> None:
    """n-1 ring steps: at step s, slice j of ``outgoing[s]`` goes right while slice j of
    ``incoming[s]`` comes from the left, the two posted as one batch (NCCL-safe: see
    ``collectives.exchange``). Slice j of step s+1 is posted as soon as slice j of step s
    has arrived and ``arrived(s, j)`` has run, so one slice travels while the next is
    summed (gloo and NCCL pipeline their own rings the same way). Every rank posts its
    batches in the same order, (step, slice), so the n-th batch of one rank always meets
    the n-th of its neighbours."""
    in_flight = deque((0, j, _post(outgoing[0][j], right, incoming[0][j], left, group))
                      for j in range(len(outgoing[0])))
    while in_flight:
        s, j, works = in_flight.popleft()
        for work in works:
            work.wait()
        if arrived is not None:
            arrived(s, j)
        if s + 1 < len(outgoing):
            in_flight.append((s + 1, j, _post(outgoing[s + 1][j], right, incoming[s + 1][j],
                                              left, group)))


def _post(send_buf, dst, recv_buf, src, group) -> list:
    return comm.batch_isend_irecv(pair_ops(send_buf, dst, recv_buf, src, group))


def ring_reduce_scatter(chunks, me: int, members: list[int], group=None,
                        pieces: int = PIECES) -> int:
    """The first half of the ring: n-1 steps in which rank ``me`` sends chunk (me - step) to
    its right and adds chunk (me - step - 1), arriving from its left, into its own copy.
    Afterwards chunk (me + 1) mod n holds the sum over all ranks; returns that index.

    Two refinements over the textbook loop (the notebook's exercise writes that loop):
    each step's send and receive are posted together, as one batch; and each chunk travels
    in ``pieces`` slices, so a rank forwards the first slice it has summed while the next
    is still arriving (``ring_pass``). Slice j arrives in slot j of an inbox of one chunk,
    the same slot at every step: slice j of the next step is posted only once this one has
    been added, and a small inbox the rank keeps reusing stays in the CPU's cache."""
    n = len(members)
    right, left = members[(me + 1) % n], members[(me - 1) % n]
    incoming = [(me - step - 1) % n for step in range(n - 1)]          # chunk index per step
    mine = [chunks[i].tensor_split(pieces) for i in incoming]            # where each adds
    slot = -(-chunks[0].numel() // pieces)                               # ceil(S/n / pieces)
    inbox = scratch(pieces * slot, chunks[0]).view(pieces, slot)         # slice j -> slot j
    rows = [[inbox[j, :piece.numel()] for j, piece in enumerate(step)] for step in mine]
    # what travels at step s is what was summed at step s - 1 (at step 0: my own chunk)
    sends = [chunks[me].tensor_split(pieces)] + mine[:-1]

    def add(step, j):
        mine[step][j].add_(rows[step][j])

    ring_pass(sends, rows, right, left, group, add)
    return (me + 1) % n


def ring_all_gather(chunks, me: int, members: list[int], group=None,
                    pieces: int = PIECES) -> None:
    """The second half: rank ``me`` owns finished chunk (me + 1) mod n; in n-1 steps each
    rank forwards the finished chunk it last got, and every rank ends with all of them.
    Receives land directly in their chunks."""
    n = len(members)
    right, left = members[(me + 1) % n], members[(me - 1) % n]
    sends = [chunks[(me + 1 - step) % n].tensor_split(pieces) for step in range(n - 1)]
    slices = [chunks[(me - step) % n].tensor_split(pieces) for step in range(n - 1)]
    ring_pass(sends, slices, right, left, group)


def ring_all_reduce(tensor, group=None, average: bool = False, check: bool = True):
    """Sum (or average) ``tensor`` over ``group`` in place: reduce-scatter, then all-gather.

    2(n-1) steps, each sending about S/n bytes: 2(n-1)/n x S per rank in all. Each chunk is
    summed once and then copied, so every rank ends with bit-identical values."""
    me, members, work = prepare(tensor, group, average, check)
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
