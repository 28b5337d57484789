"""Every message lessonlib sends goes through here, so it can be counted.

What it teaches: parallel training is computation plus communication, and the lesson's
claims about communication ("one all-reduce per MLP forward", "a ring moves 2(n-1)/n of
the data per rank") can be checked by counting. Inside ``with ledger() as book:`` each call
below appends an ``Event`` (operation, group size, payload bytes, peer, seconds) to
``book``, on this rank. Each call also leaves a breadcrumb (``launcher.progress``), so a
hang names the collective a rank was stuck in.

The wrappers take the same arguments as ``torch.distributed`` and return the same things;
asynchronous ones return a handle whose ``wait()`` also closes the event's timing.

Laptop:  ``python -c "import lessonlib as L; print(L.launch(L.comm.demo_ledger, 2))"``
GPU box: the same; under NCCL the payload lives on each rank's GPU.
"""
from __future__ import annotations

import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from lessonlib import device
from lessonlib.breadcrumbs import progress

_books: list["Ledger"] = []  # the ledgers open on this rank (nested ``with`` blocks allowed)


@dataclass
class Event:
    op: str
    group_size: int
    bytes: int
    seconds: float = 0.0
    peer: int | None = None


@dataclass
class Ledger:
    events: list[Event] = field(default_factory=list)

    def count(self, op: str | None = None) -> int:
        return sum(1 for e in self.events if op is None or e.op == op)

    def total_bytes(self, op: str | None = None) -> int:
        return sum(e.bytes for e in self.events if op is None or e.op == op)

    def summary(self) -> dict[str, dict]:
        """{op: {"calls": n, "bytes": total, "seconds": total}}"""
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
        _books.remove(book)


def _nbytes(tensor_or_list) -> int:
    if isinstance(tensor_or_list, torch.Tensor):
        return tensor_or_list.numel() * tensor_or_list.element_size()
    return sum(_nbytes(t) for t in tensor_or_list)


class _TimedWork:
    """An async handle that finishes its event's timing when waited on."""

    def __init__(self, work, event: Event, start: float):
        self._work, self._event, self._start = work, event, start

    def wait(self, timeout=None):
        out = self._work.wait() if timeout is None else self._work.wait(timeout)
        self._event.seconds = time.perf_counter() - self._start
        return out

    def is_completed(self) -> bool:
        return self._work.is_completed()


def _call(name: str, payload, group, peer, async_op: bool, thunk):
    size = dist.get_world_size(group)
    nbytes = _nbytes(payload)
    progress(f"{name} of {nbytes} bytes in a group of {size}" + (f" with rank {peer}" if peer is not None else ""))
    event = Event(name, size, nbytes, peer=peer)
    start = time.perf_counter()
    work = thunk()
    for book in _books:
        book.events.append(event)
    if async_op:
        return _TimedWork(work, event, start) if work is not None else None
    event.seconds = time.perf_counter() - start
    return work


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


def demo_ledger() -> dict:
    """One all-reduce of 1000 float32 values, recorded: 1 call, 4000 bytes."""
    x = torch.ones(1000, device=device.current_device())
    with ledger() as book:
        all_reduce(x)
    return {"sum": x[0].item(), **book.summary()}
