"""The pipeline executor's recorder: a span for every action, a breadcrumb before each.

What it teaches: the course measures a pipeline (Gantt charts, bubbles) without putting a
single timer in the executor's loop. The executor is handed a ``Timeline`` and wraps each
action in ``timeline.action(a)``; the timeline leaves a breadcrumb (what this rank is doing
now, shown if a launch times out) and, when on, marks the start and end. On a GPU the marks
are CUDA events, read after the step with one synchronize, so timing does not serialise
the work it measures.

Laptop:  ``python -c "from lessonlib.pipeline.timeline import Timeline; t = Timeline('x');
         t.start(); print(t.read())"``
GPU box: the same.
"""
from __future__ import annotations

from contextlib import contextmanager

from lessonlib.breadcrumbs import progress
from lessonlib.device import elapsed, mark, synchronize
from lessonlib.spans import Span


class Timeline:
    """Spans of one step of one stage, in seconds since ``start()``; ``on=False`` records
    none (``read`` then gives no spans and a wall time of 0)."""

    def __init__(self, label: str, device=None, on: bool = True):
        self.label, self.device, self.on = label, device, on
        self.marks: list[tuple] = []     # (kind, micro-batch, chunk, start mark, end mark)
        self.t0 = self.end = None

    def start(self) -> None:
        self.marks, self.t0 = [], mark(self.device) if self.on else None

    def _mark(self):
        return mark(self.device) if self.on else None

    @contextmanager
    def span(self, kind: str, microbatch: int = -1, chunk: int = 0):
        begin = self._mark()
        yield
        self.end = self._mark()
        if self.on:
            self.marks.append((str(kind), microbatch, chunk, begin, self.end))

    def action(self, a):
        """The span of one schedule action, with its breadcrumb."""
        progress(f"{self.label}: {a}")
        return self.span(a.kind, a.microbatch, a.chunk)

    def batch(self, actions):
        """The span of one batch of sends and receives: "RECV" if it receives (the stage
        waits for data), else "SEND"; labelled with its first action's micro-batch."""
        progress(f"{self.label}: batch {' '.join(map(str, actions))}")
        kind = "RECV" if any(a.kind.is_recv for a in actions) else "SEND"
        return self.span(kind, actions[0].microbatch, actions[0].chunk)

    def read(self) -> tuple[list[Span], float]:
        """(spans, wall seconds to the last mark), after one synchronize."""
        if not self.on:
            return [], 0.0
        synchronize(self.device)
        spans = [Span(k, mb, c, elapsed(self.t0, a), elapsed(self.t0, b))
                 for k, mb, c, a, b in self.marks]
        return spans, elapsed(self.t0, self.end)
