"""What the assembly line measures, kept out of its step: the line's recorder.

What it teaches: lesson 03's step (``line.stage_step``) only moves and computes; it scopes
each phase with a ``record(phase)`` it is handed, a no-op by default. ``LineRecorder`` is the
one that measures: it lines the ranks up on one clock (a barrier, then the earliest rank's
wall-clock reading is everyone's zero), records each phase of a step as one span of a
contiguous ``Timeline`` (the spans tile the step, so idle time is what is not F, B or OPT),
and counts what each forward saves for backward with an ``ActivationMeter``.

Laptop:  see ``lessonlib.model_parallel`` (``assembly_line`` builds one on every rank).
GPU box: the same; the spans are ``device.mark``s (CUDA events), read with one synchronize
         at the end.
"""
from __future__ import annotations

import time
from contextlib import contextmanager, nullcontext

import torch
import torch.distributed as dist

from lessonlib import comm, device
from lessonlib.instruments.activations import ActivationMeter
from lessonlib.instruments.spans import Timeline


class LineRecorder:
    """One rank's recorder for the whole run: ``start_aligned()`` once the ranks should share
    a zero, ``for_step(step)`` before each step (the ``record`` to hand ``stage_step``), and
    ``read()`` at the end."""

    def __init__(self, dev, params=()):
        self.dev = dev
        self.timeline = Timeline(dev, contiguous=True)
        self.meter = ActivationMeter(params)

    def start_aligned(self) -> None:
        """Start the timeline on a clock all ranks share: after a barrier, the earliest rank's
        wall-clock reading is everyone's zero (on one machine the ranks' spans line up exactly;
        across machines, as well as their clocks agree)."""
        comm.barrier()
        device.synchronize(self.dev)
        wall = time.time()
        self.timeline.start()
        earliest = torch.tensor([wall], dtype=torch.float64, device=self.dev)
        comm.all_reduce(earliest, op=dist.ReduceOp.MIN)
        self.timeline.origin = wall - earliest.item()

    def for_step(self, step: int):
        """Mark the step's start and return its ``record(phase)``: each phase one span of the
        timeline, and what the forward saves for backward counted by the meter."""
        self.timeline.mark()
        timeline, meter = self.timeline, self.meter

        @contextmanager
        def record(phase: str):
            with timeline.span(phase, 0, 0, step), \
                    meter.forward() if phase == "F" else nullcontext():
                yield
        return record

    def read(self) -> tuple[list, int]:
        """(this rank's spans, the peak bytes its forwards kept for backward)."""
        return self.timeline.read()[0], self.meter.peak_bytes
