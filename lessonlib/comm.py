"""Every message lessonlib sends goes through here, so it can be counted.

What it teaches: parallel training is computation plus communication, and the lesson's
claims about communication ("one all-reduce per MLP forward", "a ring moves 2(n-1)/n of
the data per rank") can be checked by counting. Inside ``with ledger() as book:`` each call
below appends an ``Event`` (operation, group size, payload bytes, peer, seconds) to
``book``, on this rank. Each call also leaves a breadcrumb (``launcher.progress``), so a
hang names the collective a rank was stuck in.

The ledger is also a trace that NCCL's rules can be checked on without a GPU: each event
keeps its dtype, its group's members, its *global* peer, its order among this rank's
calls, whether it was posted in one ``batch_isend_irecv`` and when it was waited on.
``nccl_hazards(ledgers)`` (one ledger per rank, ``lessonlib.nccl_rules``) replays them.

The wrappers take the same arguments as ``torch.distributed`` and return the same things;
asynchronous ones return a handle whose ``wait()`` also closes the event's timing. On a
GPU the timing is a pair of CUDA events, read after one synchronize when the ledger closes
(or ``summary()`` is asked), so counting never stalls the queue; on a CPU, wall clock.

Laptop:  ``python -c "import lessonlib as L; print(L.launch(L.comm.demo_ledger, 2))"``
GPU box: the same; under NCCL the payload lives on each rank's GPU.
"""
from __future__ import annotations

import itertools
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from lessonlib import device
from lessonlib.breadcrumbs import progress
from lessonlib.nccl_rules import nccl_hazards  # noqa: F401 (comm.nccl_hazards, the public name)

_books: list["Ledger"] = []  # the ledgers open on this rank (nested ``with`` blocks allowed)
_calls = itertools.count()   # this rank's calls, in the order they were made
_batches = itertools.count()


@dataclass
class Event:
    op: str
    group_size: int
    bytes: int
    seconds: float = 0.0
    peer: int | None = None           # global rank of the other end (point-to-point)
    dtype: str | None = None          # e.g. "torch.float32"
    ranks: tuple[int, ...] = ()       # the group's members, global ranks
    order: int = 0                    # position among this rank's calls
    batch: int | None = None          # calls of one batch_isend_irecv share this number
    waited: int | None = None         # the ``order`` of the next call when this one was waited on
    marks: tuple | None = field(default=None, repr=False, compare=False)  # (start, end) to read


@dataclass
class Ledger:
    events: list[Event] = field(default_factory=list)

    def settle(self) -> None:
        """Turn pending CUDA-event pairs into seconds, after one synchronize."""
        pending = [e for e in self.events if e.marks is not None and e.marks[1] is not None]
        if pending:
            device.synchronize()
        for e in pending:
            e.seconds, e.marks = device.elapsed(*e.marks), None

    def count(self, op: str | None = None) -> int:
        return sum(1 for e in self.events if op is None or e.op == op)

    def total_bytes(self, op: str | None = None) -> int:
        return sum(e.bytes for e in self.events if op is None or e.op == op)

    def summary(self) -> dict[str, dict]:
        """{op: {"calls": n, "bytes": total, "seconds": total}}"""
        self.settle()
        calls = Counter(e.op for e in self.events)
        return {op: {"calls": n, "bytes": self.total_bytes(op),
                     "seconds": sum(e.seconds for e in self.events if e.op == op)}
                for op, n in calls.items()}


@contextmanager
def ledger():
    """Record this rank's communication inside the block."""
    book = Ledger()
    _books.append(book)
    try:
        yield book
    finally:
        # by identity: two ledgers with the same events are equal, and ``remove`` would
        # take the outer one of a nested pair, which would then miss every later call
        _books[:] = [b for b in _books if b is not book]
        book.settle()


def _nbytes(tensor_or_list) -> int:
    if isinstance(tensor_or_list, torch.Tensor):
        return tensor_or_list.numel() * tensor_or_list.element_size()
    return sum(_nbytes(t) for t in tensor_or_list)


def _dtype(tensor_or_list) -> str | None:
    if isinstance(tensor_or_list, torch.Tensor):
        return str(tensor_or_list.dtype)
    return _dtype(tensor_or_list[0]) if len(tensor_or_list) else None


def _members(group) -> tuple[int, ...]:
    if group is None:
        return tuple(range(dist.get_world_size()))
    return tuple(dist.get_process_group_ranks(group))


class _TimedWork:
    """An async handle that closes its event's timing, and notes when it was waited on."""

    def __init__(self, work, *events: Event):
        self._work, self._events = work, events

    def wait(self, timeout=None):
        out = self._work.wait() if timeout is None else self._work.wait(timeout)
        for event in self._events:
            _close(event)
        return out

    def is_completed(self) -> bool:
        return self._work.is_completed()


def _close(event: Event) -> None:
    if event.waited is None:
        event.waited = next(_calls)
    if event.marks is None or event.marks[1] is not None:
        return                         # waited on before: its timing is already closed
    start = event.marks[0]
    end = device.mark()
    if isinstance(start, float):
        event.seconds, event.marks = device.elapsed(start, end), None
    else:
        event.marks = (start, end)     # read after one synchronize (``Ledger.settle``)


def _event(name: str, payload, group, peer, batch=None) -> Event:
    size = dist.get_world_size(group)
    nbytes = _nbytes(payload)
    progress(f"{name} of {nbytes} bytes in a group of {size}" + (f" with rank {peer}" if peer is not None else ""))
    event = Event(name, size, nbytes, peer=peer, dtype=_dtype(payload), ranks=_members(group),
                  order=next(_calls), batch=batch)
    event.marks = (device.mark(), None)
    return event


def _call(name: str, payload, group, peer, async_op: bool, thunk):
    event = _event(name, payload, group, peer)
    work = thunk()
    for book in _books:
        book.events.append(event)
    if async_op:
        return _TimedWork(work, event) if work is not None else None
    _close(event)
    return work


def batch_isend_irecv(ops: list) -> list:
    """``dist.batch_isend_irecv``: post a list of ``dist.P2POp`` sends and receives as one
    group (one NCCL group call), so none waits behind another; every op is counted, and
    the handles returned (one per op on gloo, one for the whole group on NCCL) close their
    events' timing when waited on: wait on all of them.

    This is how paired sends and receives must be posted under NCCL (NCCL's user guide,
    "Point-to-point communication": calls that must progress concurrently go in one group).
    ``lessonlib.nccl_rules`` explains why separate ``irecv`` + ``isend`` can hang."""
    if not ops:
        return []
    batch = next(_batches)
    events = [_event("send" if op.op in (dist.isend, dist.send) else "recv", op.tensor,
                     op.group, op.peer, batch) for op in ops]
    works = dist.batch_isend_irecv(list(ops))
    for book in _books:
        book.events.extend(events)
    if len(works) == len(events):          # gloo: one handle per op
        return [_TimedWork(w, e) for w, e in zip(works, events)]
    return [_TimedWork(w, *events) for w in works]     # NCCL: one handle for the group


# ---------------------------------------------------------------- collectives
def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
    return _call("all_reduce", tensor, group, None, async_op,
                 lambda: dist.all_reduce(tensor, op=op, group=group, async_op=async_op))


def broadcast(tensor, src, group=None, async_op=False):
    return _call("broadcast", tensor, group, None, async_op,
                 lambda: dist.broadcast(tensor, src=src, group=group, async_op=async_op))


def all_gather(tensor_list, tensor, group=None, async_op=False):
    return _call("all_gather", tensor, group, None, async_op,
                 lambda: dist.all_gather(tensor_list, tensor, group=group, async_op=async_op))


def all_gather_into_tensor(output, tensor, group=None, async_op=False):
    return _call("all_gather", tensor, group, None, async_op,
                 lambda: dist.all_gather_into_tensor(output, tensor, group=group, async_op=async_op))


def reduce_scatter_tensor(output, tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
    return _call("reduce_scatter", tensor, group, None, async_op,
                 lambda: dist.reduce_scatter_tensor(output, tensor, op=op, group=group, async_op=async_op))


def barrier(group=None):
    return _call("barrier", [], group, None, False,
                 lambda: dist.barrier(group=group))



def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None,
                      group=None, async_op=False):
    """``dist.all_to_all_single``: rows ``input_split_sizes[i]`` of ``input`` go to the
    group's i-th member, ``output_split_sizes[i]`` rows arrive from it (None: equal parts).
    NCCL runs it as one group of a send and a receive per member, so the ledger records it
    so: one batch of sends and receives (``nccl_hazards`` checks each send meets its
    receive's size; the sum of the sends is the bytes this rank sent)."""
    members, batch = _members(group), next(_batches)
    events = [_event(kind, chunk, group, peer, batch)
              for kind, tensor, sizes in (("send", input, input_split_sizes),
                                          ("recv", output, output_split_sizes))
              for peer, chunk in zip(members, tensor.split(
                  list(sizes) if sizes else tensor.shape[0] // len(members)))]
    work = dist.all_to_all_single(output, input, output_split_sizes, input_split_sizes,
                                  group=group, async_op=async_op)
    for book in _books:
        book.events.extend(events)
    if async_op:
        return _TimedWork(work, *events)
    for event in events:
        _close(event)
    return work

# ---------------------------------------------------------------- point to point
def send(tensor, dst, group=None):
    return _call("send", tensor, group, dst, False,
                 lambda: dist.send(tensor, dst=dst, group=group))


def recv(tensor, src, group=None):
    return _call("recv", tensor, group, src, False,
                 lambda: dist.recv(tensor, src=src, group=group))


def isend(tensor, dst, group=None):
    return _call("send", tensor, group, dst, True,
                 lambda: dist.isend(tensor, dst=dst, group=group))


def irecv(tensor, src, group=None):
    return _call("recv", tensor, group, src, True,
                 lambda: dist.irecv(tensor, src=src, group=group))


def send_op(tensor, dst: int, group=None):
    """A send for ``batch_isend_irecv`` (``dst`` a global rank)."""
    return dist.P2POp(dist.isend, tensor, dst, group=group)


def recv_op(tensor, src: int, group=None):
    """A receive for ``batch_isend_irecv`` (``src`` a global rank)."""
    return dist.P2POp(dist.irecv, tensor, src, group=group)


def demo_ledger() -> dict:
    """One all-reduce of 1000 float32 values, recorded: 1 call, 4000 bytes."""
    x = torch.ones(1000, device=device.current_device())
    with ledger() as book:
        all_reduce(x)
    return {"sum": x[0].item(), **book.summary()}
