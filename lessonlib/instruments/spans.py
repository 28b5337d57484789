"""One interval on one rank's timeline, and the timeline that records them: what the course's
Gantt charts are drawn from.

What it teaches: a timeline is a list of spans (what ran, which micro-batch and chunk, from
when to when), whether simulated (``lessonlib.pipeline.validate.simulate``) or measured on
real ranks (the assembly line of ``lessonlib.model_parallel``, the pipeline executor,
PyTorch's pipelining); one record for all of them lets the same plots and checks read each.

``Timeline`` is the one measured kind: a core is handed a recorder built on it and wraps each
phase of its work in one ``with`` (``timeline.span("F")``); the core holds no clock. Marks are
``device.mark``s (CUDA events on a GPU, read after the work with one synchronize, so timing
does not serialise what it measures). Where the spans of several ranks must line up, the
caller aligns them (a barrier, an agreed origin) and says where this rank's start falls.
``no_record`` is the recorder that records nothing, the default of every core.

One pattern for every recorder of the course: a core takes ``record`` (a phase scoped by one
``with``) or ``recorder`` (an object the core tells what it does), ``no_record`` by default;
the one that measures is ``<What>Recorder`` in its strategy package's ``recorder.py``
(``model_parallel.recorder.LineRecorder``, ``pipeline.recorder.StageRecorder``,
``data_parallel.recorder.BucketRecorder``, ``context_parallel.recorder.RingRecorder``,
``hybrid.recorder.StepRecorder``), built by the caller, handed in, and read after the work
with ``read()`` or its rows.

Laptop:  ``python -c "from lessonlib.instruments.spans import Timeline; t = Timeline(); t.start();
         s = t.span('F'); s.__enter__(); s.__exit__(None, None, None); print(t.read())"``
GPU box: the same (pure Python over ``device.mark``).
"""
from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

from lessonlib.device import elapsed, mark, synchronize


@dataclass(frozen=True)
class Span:
    """One interval on one stage's timeline (simulated cost units, or measured seconds).
    The assembly line of ``lessonlib.model_parallel`` records its spans with it too (one
    batch per step: micro-batch 0, and the training ``step`` it belongs to)."""
    kind: str          # F, B, W, OPT, RECV_F/RECV_B (waiting for data), SEND_F/SEND_B,
                       # RECV/SEND (a pipeline batch that receives / only sends)
    microbatch: int
    chunk: int
    start: float
    end: float
    step: int = 0


def no_record(*phase):
    """The recorder that records nothing: a core's default."""
    return nullcontext()


class Timeline:
    """Spans of one rank, in seconds since ``start()`` plus ``origin`` (where that start
    falls on a clock the ranks share; 0 when each rank counts from its own start).

    ``contiguous``: each span runs from the end of the previous one (or from ``mark()``), so
    the spans tile the rank's time and a wait shows as the span that waited; otherwise each
    span runs from its own entry."""

    def __init__(self, device=None, contiguous: bool = False):
        self.device, self.contiguous = device, contiguous
        self.start()

    def start(self, origin: float = 0.0) -> None:
        self.marks: list[tuple] = []     # (kind, micro-batch, chunk, step, start, end marks)
        self.origin, self.t0 = origin, mark(self.device)
        self.last = self.end = self.t0

    def mark(self) -> None:
        """The next contiguous span starts now."""
        self.last = mark(self.device)

    @contextmanager
    def span(self, kind, microbatch: int = -1, chunk: int = 0, step: int = 0):
        begin = self.last if self.contiguous else mark(self.device)
        yield
        self.end = self.last = mark(self.device)
        self.marks.append((str(kind), microbatch, chunk, step, begin, self.end))

    def read(self) -> tuple[list[Span], float]:
        """(spans, seconds from the origin to the last mark), after one synchronize."""
        synchronize(self.device)

        def at(m) -> float:
            return self.origin + elapsed(self.t0, m)
        spans = [Span(k, mb, c, at(a), at(b), step) for k, mb, c, step, a, b in self.marks]
        return spans, at(self.end)
