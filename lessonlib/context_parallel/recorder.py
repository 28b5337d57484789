"""A recorder handed to ``ring_attention``: what each rank computed at each step of the ring.

What it teaches: the ring's core knows nothing about clocks. This is its ``record`` hook: a
context manager around each step's compute that notes the phase, the step, whose key/value
block the rank held, the chunk pairs it computed, the (query, key) scores the causal mask
kept (``work``: what a causal kernel must do) and those computed (``computed``: a diagonal
chunk pair is computed whole, then masked), the wall seconds it took and the CPU seconds
of this rank's thread (``cpu_s``: on cores shared by several ranks, the time a rank was
descheduled is not its work). The rows draw the ring step by step (a Gantt
chart: which block each rank holds at each step) and measure the balance of a layout.

Laptop:  ``python -c "from lessonlib.context_parallel import runs; print(runs.run_parity(2))"``
GPU box: the same; on a GPU the times are wall clock around queued kernels, so synchronize
first (``device.synchronize``) or read them as launch times.
"""
from __future__ import annotations

import time
from contextlib import contextmanager

from lessonlib.context_parallel.blocks import useful_pairs


class StepLog:
    """``record`` for ``ring_attention``: one row per step, times relative to ``origin``."""

    def __init__(self, n: int, origin: float | None = None):
        self.n, self.rows = n, []
        self.origin = time.perf_counter() if origin is None else origin

    @contextmanager
    def __call__(self, phase: str, step: int, source: int, pairs):
        start, cpu = time.perf_counter(), time.thread_time()
        yield
        end, cpu = time.perf_counter(), time.thread_time() - cpu
        self.rows.append({"phase": phase, "step": step, "source": source,
                          "chunk_pairs": len(pairs), "work": useful_pairs(pairs, self.n),
                          "computed": len(pairs) * self.n ** 2,
                          "start_s": start - self.origin, "end_s": end - self.origin,
                          "seconds": end - start, "cpu_s": cpu})

    def total(self, what: str, phase: str = "forward") -> float:
        return sum(r[what] for r in self.rows if r["phase"] == phase)
