"""A recorder handed to ``ring_attention``: what each rank computed at each step of the ring.

What it teaches: the ring's core knows nothing about clocks. This is its ``record`` hook: a
context manager around each step's compute that notes the phase, the step, whose key/value
block the rank held, the chunk pairs it computed, the (query, key) scores the causal mask
kept (``work``: what a causal kernel must do) and those computed (``computed``: a diagonal
chunk pair is computed whole, then masked), the wall seconds it took and the CPU seconds
of this rank's thread (``cpu_s``: on cores shared by several ranks, the time a rank was
descheduled is not its work). The rows draw the ring step by step (a Gantt
chart: which block each rank holds at each step) and measure the balance of a layout.

On a GPU each step is timed by a pair of CUDA events on the compute stream (``device.mark``),
read when the rows are asked for, after one synchronize: the kernels' time, not the time to
queue them, and no synchronize inside the ring to stall the transfer it overlaps.

Laptop:  ``python -c "from lessonlib.context_parallel import ring_runs;
         print(ring_runs.run_parity(2))"``
GPU box: the same.
"""
from __future__ import annotations

import time
from contextlib import contextmanager

from lessonlib.context_parallel.blocks import useful_pairs
from lessonlib.device import mark, on_clock


class RingRecorder:
    """``record`` for ``ring_attention``: one row per step, times relative to ``origin``."""

    def __init__(self, n: int, origin: float | None = None):
        self.n, self._rows, self._marks = n, [], []
        self.origin = time.perf_counter() if origin is None else origin

    @contextmanager
    def __call__(self, phase: str, step: int, source: int, pairs):
        start, cpu = mark(), time.thread_time()
        yield
        end, cpu = mark(), time.thread_time() - cpu
        self._marks += [start, end]
        self._rows.append({"phase": phase, "step": step, "source": source,
                           "chunk_pairs": len(pairs), "work": useful_pairs(pairs, self.n),
                           "computed": len(pairs) * self.n ** 2,
                           "start_s": None, "end_s": None, "seconds": None, "cpu_s": cpu})

    @property
    def rows(self) -> list[dict]:
        """The rows, with ``start_s``, ``end_s`` and ``seconds`` read from their marks."""
        if self._marks:
            clock, waiting = on_clock(self._marks), self._rows[-(len(self._marks) // 2):]
            for row, start, end in zip(waiting, clock[::2], clock[1::2]):
                row.update(start_s=start - self.origin, end_s=end - self.origin,
                           seconds=end - start)
            self._marks = []
        return self._rows

    def total(self, what: str, phase: str = "forward") -> float:
        return sum(r[what] for r in self.rows if r["phase"] == phase)
