"""The pipeline executor's recorder: what the course measures of a step, from outside it.

What it teaches: the course draws a pipeline's Gantt chart and measures its bubble without a
single timer in the executor's loop. The executor hands its recorder the step's units (its
computes, and the batches of sends and receives between them) and runs them in the order the
recorder gives them back: ``no_record`` gives them back as they are (the default); a
``StageRecorder`` first lines the stages up (a barrier of the pipeline's group), then spans
each unit (``spans.Timeline``) and leaves a breadcrumb before it (what this rank is doing
now, shown if a launch times out). ``read()`` gives the step's spans and wall time.

Laptop:  ``python -c "from lessonlib.pipeline.recorder import StageRecorder; t = StageRecorder('x',
         align=False); print(list(t([])), t.read())"``
GPU box: the same.
"""
from __future__ import annotations

import torch.distributed as dist

from lessonlib import comm
from lessonlib.instruments.breadcrumbs import progress
from lessonlib.instruments.spans import Span, Timeline


class _NoRecord:
    """The recorder that records nothing: the units as they are, no spans, wall time 0."""

    def __call__(self, units):
        return units

    def read(self) -> tuple[list[Span], float]:
        return [], 0.0


no_record = _NoRecord()


def _label(unit):
    """A batch of sends and receives is "RECV" if it receives (the stage waits for data),
    else "SEND", labelled with its first action's micro-batch and chunk."""
    if not isinstance(unit, list):
        return unit.kind, unit.microbatch, unit.chunk
    kind = "RECV" if any(a.kind.is_recv for a in unit) else "SEND"
    return kind, unit[0].microbatch, unit[0].chunk


class StageRecorder:
    """Spans of one step of one stage, in seconds since the stages were lined up.

    ``label`` names the rank in breadcrumbs (default: "pipeline stage r", r its global
    rank, the stage of a pipeline over the whole world); ``group`` is the pipeline's (its barrier lines
    the stages up when ``align``); ``on=False`` neither aligns nor times (as ``no_record``)."""

    def __init__(self, label: str | None = None, device=None, group=None, align: bool = True,
                 on: bool = True):
        self.label, self.group, self.align, self.on = label, group, align, on
        self.timeline = Timeline(device)

    def __call__(self, units):
        if not self.on:
            yield from units
            return
        label = self.label or f"pipeline stage {dist.get_rank()}"
        if self.align:
            comm.barrier(self.group)
        self.timeline.start()
        for unit in units:
            what = f"batch {' '.join(map(str, unit))}" if isinstance(unit, list) else unit
            progress(f"{label}: {what}")
            with self.timeline.span(*_label(unit)):
                yield unit

    def read(self) -> tuple[list[Span], float]:
        return self.timeline.read() if self.on else ([], 0.0)
