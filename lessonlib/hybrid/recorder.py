"""What the course measures of a hybrid training step, kept out of the trainer: its recorder.

What it teaches: ``HybridTrainer.step`` only moves the step through its two phases (``"pipe"``:
the pipeline's forward and backward; ``"dp"``: the gradient averaging); it scopes each with the
``record(phase)`` it is handed, ``instruments.spans.no_record`` by default. ``StepRecorder`` is
the one the runs hand it: before ``"pipe"`` the ranks line up (one barrier, so their times
compare) and the clock starts; each phase's messages go to a ledger of their own, read back as
a ``StepTraffic`` with the step's seconds.

Laptop:  see ``lessonlib.hybrid`` (``run`` hands one to every rank's trainer).
GPU box: the same; ``timer=device.timer`` reads the step's seconds on the GPU's clock.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

from lessonlib import comm


@dataclass(frozen=True)
class StepTraffic:
    """One step's messages on one rank, as its two ledgers summed them (``Ledger.summary``:
    {op: {"calls", "bytes", "seconds"}}): ``pipe`` the pipeline's (TP all-reduces inside the
    stage, PP sends and receives between stages), ``dp`` the gradient averaging's."""
    pipe: dict
    dp: dict


class StepRecorder:
    """A recorder for ``HybridTrainer``: before the ``"pipe"`` phase, every rank lined up
    (``align``: one barrier, so the ranks' times compare) and the clock started; one ledger
    per phase. ``read()`` after the step: (its ``StepTraffic``, its seconds by ``timer``)."""

    def __init__(self, timer=time.perf_counter, align: bool = True):
        self.timer, self.align, self.books, self.start = timer, align, {}, 0.0

    @contextlib.contextmanager
    def __call__(self, phase: str):
        if phase == "pipe":
            if self.align:
                comm.barrier()
            self.start = self.timer()
        with comm.ledger() as book:
            yield
        self.books[phase] = book.summary()

    def read(self) -> tuple[StepTraffic, float]:
        return StepTraffic(pipe=self.books["pipe"], dp=self.books["dp"]), self.timer() - self.start
