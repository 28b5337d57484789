"""All-reduce built by hand from point-to-point messages: a parameter server and two rings.

What it teaches: ``dist.all_reduce`` is not magic. Three ways to sum a tensor over n ranks,
each a few lines of ``isend``/``irecv`` through ``lessonlib.comm`` (so the ledger counts
every byte), each ending with the same numbers as ``dist.all_reduce``:

* ``parameter_server_all_reduce``: every worker sends its tensor to one server rank, which
  sums and sends the result back. The server's link carries 2(n-1) x S bytes per call, so
  its time grows with n.
* ``naive_ring_all_reduce``: pass whole tensors around the ring n-1 times. Every link is
  busy, but each rank still sends (n-1) x S bytes.
* ``ring_all_reduce`` (in ``ring.py``): the bandwidth-optimal ring (Baidu's ring all-reduce; MPICH's
  reduce-scatter + all-gather). Cut the tensor into n chunks; in n-1 steps of
  reduce-scatter each rank ends up owning the full sum of one chunk, in n-1 steps of
  all-gather it passes the finished chunks on. Each rank sends 2(n-1)/n x S bytes: almost
  independent of n.

Safety: before any data moves, the ranks agree on the tensor's length and dtype with one
small ``all_gather`` of metadata (``agree``), so a rank holding a tensor of another size or
dtype, or an integer tensor where an average is asked, makes *every* rank raise the same
ValueError instead of leaving the others waiting forever. ``check=False`` skips it once the
caller knows the shapes agree (a benchmark timing repeated identical calls).

Laptop:  ``python labs/allreduce.py --world-size 4 --size-mb 16``
GPU box: ``torchrun --nproc-per-node 8 labs/allreduce.py --size-mb 256`` (NCCL)
"""
from __future__ import annotations

import threading

import torch
import torch.distributed as dist

from lessonlib import comm

# The codes ranks exchange to compare dtypes; -1 means "not a tensor at all".
_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64,
           torch.complex128, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8,
           torch.bool)


# ---------------------------------------------------------------- the group, and agreement
def group_ranks(group=None) -> tuple[int, list[int]]:
    """(this rank's index in ``group``, the group's members as global ranks).

    Point-to-point calls take *global* ranks, as in ``torch.distributed``."""
    me = dist.get_rank(group)
    if me < 0:
        raise ValueError(f"rank {dist.get_rank()} is not a member of the group it was asked to "
                         f"communicate in; call the collective only on the group's members")
    members = dist.get_process_group_ranks(group) if group is not None else \
        list(range(dist.get_world_size()))
    return me, members


def _code(tensor) -> int:
    if not isinstance(tensor, torch.Tensor):
        return -1
    return _DTYPES.index(tensor.dtype) if tensor.dtype in _DTYPES else len(_DTYPES)


def agree(tensor, group=None, average: bool = False, what: str = "the tensor") -> None:
    """Check, on every rank at once, that ``tensor`` can be all-reduced over ``group``.

    One ``all_gather`` of two integers per rank (its length and dtype); then every rank runs
    the same checks on the same table, so a bad input raises the same ValueError everywhere
    and nobody is left waiting for a message that will never come."""
    _, members = group_ranks(group)
    n = len(members)
    length = tensor.numel() if isinstance(tensor, torch.Tensor) else -1
    dev = tensor.device if isinstance(tensor, torch.Tensor) else None
    mine = torch.tensor([length, _code(tensor)], dtype=torch.int64, device=dev)
    rows = [torch.empty_like(mine) for _ in range(n)]
    if n > 1:
        comm.all_gather(rows, mine, group=group)
    else:
        rows = [mine]
    table = torch.stack(rows).tolist()                                  # (n, 2)
    lengths, codes = [r[0] for r in table], [r[1] for r in table]
    if -1 in lengths:
        bad = [members[i] for i, x in enumerate(lengths) if x == -1]
        raise ValueError(f"all-reduce needs a torch.Tensor on every rank; rank(s) {bad} passed "
                         f"something else")
    if len(set(lengths)) > 1:
        listing = ", ".join(f"rank {members[i]}: {x}" for i, x in enumerate(lengths))
        raise ValueError(f"{what} must have the same number of elements on every rank to be "
                         f"all-reduced; got {listing}. Give every rank a tensor of the same size")
    if len(set(codes)) > 1:
        listing = ", ".join(f"rank {members[i]}: {_name(c)}" for i, c in enumerate(codes))
        raise ValueError(f"{what} must have the same dtype on every rank; got {listing}")
    dtype = tensor.dtype
    if dtype == torch.bool or codes[0] == len(_DTYPES):
        raise ValueError(f"{what} has dtype {dtype}, which cannot be summed; use a float or "
                         f"integer tensor")
    if average and not (dtype.is_floating_point or dtype.is_complex):
        raise ValueError(f"average=True needs a floating-point tensor (float32, float64, "
                         f"float16 or bfloat16), but {what} has dtype {dtype}: the mean of "
                         f"integers is not an integer. Convert it with .float(), or sum it "
                         f"with average=False")


def _name(code: int) -> str:
    return str(_DTYPES[code]) if 0 <= code < len(_DTYPES) else "an unsupported dtype"


_scratch: dict[tuple, torch.Tensor] = {}


def scratch(numel: int, like: torch.Tensor, slot: int = 0) -> torch.Tensor:
    """A receive buffer of ``numel`` elements, kept between calls (one per ``slot``, dtype,
    device and thread). A fresh multi-megabyte buffer costs a page fault per 4 KiB the
    first time it is written, about a fifth of a CPU ring all-reduce's time; gloo and
    NCCL keep such buffers too. ``free_scratch()`` returns the memory."""
    key = (slot, like.dtype, like.device, threading.get_ident())
    if key not in _scratch or _scratch[key].numel() < numel:
        _scratch[key] = torch.empty(numel, dtype=like.dtype, device=like.device)
    return _scratch[key][:numel]


def free_scratch() -> None:
    _scratch.clear()


def exchange(send_buf, dst: int, recv_buf, src: int, group=None) -> None:
    """Send ``send_buf`` to global rank ``dst`` while receiving ``recv_buf`` from ``src``.

    The send and the receive are posted together, as one batch (``comm.batch_isend_irecv``),
    so every rank of a ring can do this at once. Posted as two calls, ``irecv`` then
    ``isend``, it works on gloo but hangs under NCCL: each rank's receive would wait, on
    the stream or the communicator it shares with its neighbour, for a send that rank only
    posts after its own receive (``lessonlib.instruments.nccl_rules`` shows why). Empty buffers are
    skipped (both sides know the sizes)."""
    for work in comm.batch_isend_irecv(pair_ops(send_buf, dst, recv_buf, src, group)):
        work.wait()


def pair_ops(send_buf, dst: int, recv_buf, src: int, group=None) -> list:
    """The ``dist.P2POp`` list for one exchange: a send and a receive, empty ones left out."""
    ops = [comm.send_op(send_buf, dst, group)] if send_buf.numel() else []
    return ops + ([comm.recv_op(recv_buf, src, group)] if recv_buf.numel() else [])


class _Flat:
    """A 1-D view of ``tensor`` to work on; copied back at the end if it had to be a copy."""

    def __init__(self, tensor):
        self.tensor, self.copied = tensor, not tensor.is_contiguous()
        self.flat = tensor.reshape(-1).clone() if self.copied else tensor.view(-1)

    def finish(self):
        if self.copied:
            self.tensor.copy_(self.flat.view(self.tensor.shape))
        return self.tensor


def prepare(tensor, group, average: bool, check: bool):
    """What every hand-written all-reduce starts with: the ranks agree on the tensor (unless
    ``check`` is False), then (this rank's index, the members, a flat view to work on)."""
    if check:
        agree(tensor, group, average)
    me, members = group_ranks(group)
    return me, members, _Flat(tensor)


# ---------------------------------------------------------------- parameter server
def parameter_server_all_reduce(tensor, group=None, average: bool = False, server: int = 0,
                                check: bool = True):
    """Sum (or average) ``tensor`` over ``group`` in place via one server rank.

    ``server`` is the server's index in the group. Workers send S bytes and receive S; the
    server receives (n-1) x S and sends (n-1) x S: its link is the bottleneck."""
    me, members, work = prepare(tensor, group, average, check)
    n, flat = len(members), work.flat
    if not 0 <= server < n:
        raise ValueError(f"server={server} must be a rank index in the group, 0..{n - 1}")
    if n == 1 or flat.numel() == 0:
        return work.finish()
    if me == server:
        inbox = scratch((n - 1) * flat.numel(), flat).view(n - 1, -1)   # (n-1, S)
        workers = [r for i, r in enumerate(members) if i != server]
        _posted_and_waited([comm.recv_op(buf, r, group) for buf, r in zip(inbox, workers)])
        for buf in inbox:
            flat.add_(buf)
        if average:
            flat.div_(n)
        _posted_and_waited([comm.send_op(flat, r, group) for r in workers])
    else:
        _posted_and_waited([comm.send_op(flat, members[server], group)])
        _posted_and_waited([comm.recv_op(flat, members[server], group)])
    return work.finish()


def _posted_and_waited(ops) -> None:
    """One batch on the group's communicator, every op waited on: the server's n-1 receives
    (or sends) are then never in flight on n-1 two-rank communicators at once, which NCCL
    does not promise to progress (``lessonlib.instruments.nccl_inflight``)."""
    for handle in comm.batch_isend_irecv(ops):
        handle.wait()


# ---------------------------------------------------------------- naive ring
def naive_ring_all_reduce(tensor, group=None, average: bool = False, check: bool = True):
    """Sum (or average) ``tensor`` over ``group`` in place by passing whole tensors around
    the ring: n-1 steps, each sending S bytes to the right and adding what came from the left.

    Every rank adds the same numbers in a different order, so with floats the replicas can
    differ in the last bit; the bandwidth-optimal ring below avoids that too."""
    me, members, work = prepare(tensor, group, average, check)
    n, flat = len(members), work.flat
    right, left = members[(me + 1) % n], members[(me - 1) % n]
    outgoing, incoming = scratch(flat.numel(), flat, 0), scratch(flat.numel(), flat, 1)
    outgoing.copy_(flat)
    for _ in range(n - 1):
        exchange(outgoing, right, incoming, left, group)
        flat.add_(incoming)
        outgoing, incoming = incoming, outgoing     # pass on what arrived, unchanged
    if average and n > 1:
        flat.div_(n)
    return work.finish()


def torch_all_reduce(tensor, group=None, average: bool = False, check: bool = True):
    """``dist.all_reduce`` with the same signature, the reference every version is timed
    against (gloo's or NCCL's own ring, in C++)."""
    if check:
        agree(tensor, group, average)
    comm.all_reduce(tensor, group=group)
    if average:
        tensor.div_(dist.get_world_size(group))
    return tensor

