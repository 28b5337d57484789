"""The ledger: what ``comm`` records of each call, on this rank.

What it teaches: a measurement that costs nothing when nobody asks. ``with ledger() as book``
opens a ``Ledger``; while one is open, every ``lessonlib.comm`` call appends an ``Event``
(operation, group, payload bytes, peer or root, dtype, order among this rank's calls, batch,
when it was waited on, seconds) to every open ledger. With none open, ``comm`` records
nothing. The events are also the trace ``nccl_rules.nccl_hazards`` replays under NCCL's rules.

Communication costs a rank only the time it is *held* by it: ``Event.exposed``. A blocking
call holds the rank for the whole call; an asynchronous one only inside ``wait()``, so a
transfer that finished while the rank computed costs nothing (``Ledger.exposed_seconds``).
On a CPU the held stretches are wall clock around the call or the ``wait()``, exact. On a
GPU ``wait()`` returns at once: it only makes the compute stream wait for the
communication's stream. So there the stretch is a pair of CUDA events recorded on the
compute stream around the call or the ``wait()``: the time between them on that stream is
how long compute stood still for the message, which is the exposed time of the GPU's
timeline (read, like ``seconds``, after one synchronize when the ledger closes).

Laptop:  ``python -c "import lessonlib as L; print(L.launch(L.comm.demo_ledger, 2))"``
GPU box: the same; the timing is a pair of CUDA events, read after one synchronize when the
         ledger closes (or ``summary()`` is asked), so counting never stalls the queue.
"""
from __future__ import annotations

import itertools
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch.distributed as dist

from lessonlib import device
from lessonlib.instruments.spans import Span

books: list["Ledger"] = []  # the ledgers open on this rank (nested ``with`` blocks allowed)
calls = itertools.count()   # this rank's recorded calls, in the order they were made
batches = itertools.count()


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
    group: str | None = None          # the group's name: its place in creation order
    root: int | None = None           # global source (broadcast) or destination (gather_object)
    written: bool = False             # a send's tensor written in place before it was waited on
    marks: tuple | None = field(default=None, repr=False, compare=False)  # (start, end) to read
    exposed: float = field(default=0.0, compare=False)  # seconds this rank was held by it
    # what the timelines draw: (posted, closed) marks, and each stretch the rank was held
    span: tuple | None = field(default=None, repr=False, compare=False)
    stalls: list = field(default_factory=list, repr=False, compare=False)
    read: int = field(default=0, repr=False, compare=False)   # stalls already in ``exposed``


@dataclass
class Ledger:
    events: list[Event] = field(default_factory=list)
    mode: str = "lazy"                # how NCCL would create communicators: see nccl_rules

    def settle(self) -> None:
        """Turn pending CUDA-event pairs into seconds, after one synchronize."""
        pending = [e for e in self.events if e.marks is not None and e.marks[1] is not None]
        held = [e for e in self.events if e.read < len(e.stalls)]
        if pending or held:
            device.synchronize()
        for e in pending:
            e.seconds, e.marks = device.elapsed(*e.marks), None
        for e in held:
            e.exposed += sum(device.elapsed(*pair) for pair in e.stalls[e.read:])
            e.read = len(e.stalls)

    def count(self, op: str | None = None) -> int:
        """Calls of ``op`` (of every kind when None; group creations are not messages)."""
        return sum(1 for e in self.events if e.op == op or op is None and e.op != "new_group")

    def total_bytes(self, op: str | None = None) -> int:
        return sum(e.bytes for e in self.events if op is None or e.op == op)

    def summary(self) -> dict[str, dict]:
        """{op: {"calls": n, "bytes": total, "seconds": total}} (group creations left out)"""
        self.settle()
        calls = Counter(e.op for e in self.events if e.op != "new_group")
        return {op: {"calls": n, "bytes": self.total_bytes(op),
                     "seconds": sum(e.seconds for e in self.events if e.op == op)}
                for op, n in calls.items()}

    def timeline(self, start, step: int = 0) -> list[Span]:
        """The ledger drawn: a "COMM" span per call from posting to closing (for an
        asynchronous call, to the ``wait()`` that closed it: it may have finished earlier)
        and an "EXPOSED" span per stretch it held the rank; seconds since the mark ``start``
        (``device.mark``), ``microbatch`` the call's order."""
        self.settle()
        pairs = [(kind, e.order, a, b) for e in self.events if e.span is not None
                 for kind, (a, b) in [("COMM", e.span)] + [("EXPOSED", s) for s in e.stalls]]
        clock = device.on_clock([start] + [m for *_, a, b in pairs for m in (a, b)])
        t0, ends = clock[0], iter(clock[1:])
        return [Span(kind, order, 0, next(ends) - t0, next(ends) - t0, step)
                for kind, order, _, _ in pairs]

    def exposed_seconds(self, op: str | None = None) -> float:
        """Seconds this rank was held by communication (of ``op``, or of every kind): whole
        blocking calls, and the time inside ``wait()`` of asynchronous ones."""
        self.settle()
        return sum(e.exposed for e in self.events if op is None or e.op == op)


def mode() -> str:
    """"eager" when ``init_process_group`` was given a ``device_id`` (communicators made at
    once, point-to-point on the group's own), else "lazy" (``lessonlib.instruments.nccl_rules``)."""
    world = dist.group.WORLD if dist.is_initialized() else None
    return "eager" if getattr(world, "bound_device_id", None) is not None else "lazy"


@contextmanager
def ledger():
    """Record this rank's communication inside the block."""
    book = Ledger(mode=mode())
    books.append(book)
    try:
        yield book
    finally:
        # by identity: two ledgers with the same events are equal, and ``remove`` would
        # take the outer one of a nested pair, which would then miss every later call
        books[:] = [b for b in books if b is not book]
        book.settle()


@contextmanager
def unrecorded():
    """No open ledger records the calls inside the block (they still leave breadcrumbs): for
    a guard's message that is not the measured method's, e.g. the context-parallel ranks'
    agreement check, which the cost model's byte counts leave out."""
    held = books[:]
    books.clear()
    try:
        yield
    finally:
        books[:] = held + books


class TimedWork:
    """An async handle that closes its event's timing, and notes when it was waited on.

    ``sends``: (event, tensor) of the sends it covers; each tensor's version counter (which
    every in-place write moves) is read now and at the wait, so a buffer written while its
    send was in flight is marked ``written`` (``nccl_inflight``, rule 10). The counter
    belongs to the whole storage, so only a send that covers its storage is watched: for a
    slice of a larger buffer a write elsewhere in it would look the same."""

    def __init__(self, work, *events: Event, sends=()):
        self._work, self._events = work, events
        self._sends = [(event, tensor, tensor._version) for event, tensor in sends
                       if tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()]

    def wait(self, timeout=None):
        start = device.mark()
        out = self._work.wait() if timeout is None else self._work.wait(timeout)
        if self._events:        # one handle, one stretch: held once, however many calls
            hold(self._events[0], start, device.mark())
        for event, tensor, version in self._sends:
            event.written = event.written or tensor._version != version
        self._sends = []
        for event in self._events:
            close(event)
        return out

    def is_completed(self) -> bool:
        return self._work.is_completed()


def hold(event: Event, start, end) -> None:
    """``event`` held this rank from mark ``start`` to mark ``end``."""
    event.stalls.append((start, end))
    if isinstance(start, float):
        event.exposed += end - start
        event.read = len(event.stalls)


def close(event: Event) -> None:
    if event.waited is None:
        event.waited = next(calls)
    if event.marks is None or event.marks[1] is not None:
        return                         # waited on before: its timing is already closed
    start = event.marks[0]
    end = device.mark()
    event.span = (start, end)
    if isinstance(start, float):
        event.seconds, event.marks = device.elapsed(start, end), None
    else:
        event.marks = (start, end)     # read after one synchronize (``Ledger.settle``)
