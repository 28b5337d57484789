"""DualPipeV measured: its simulated bubble against DeepSeek's formula, and its parity.

What it teaches: the two claims a lesson makes about DualPipeV, each one call.

* ``bubble_rows``: per (p, m, times), the idle time of the most idle device as
  ``validate.simulate`` plays ``dualpipev(p, m)``, beside the DualPipe README's
  (p-1)(F&B + B - 3W) (``dualpipe.bubble_formula``), and the activations each device holds
  at its peak beside the README's PP + 1 = 2p + 1. Pure Python, no process.
* ``run_parity``: one launch on p CPU ranks (float64) trains the tiny GPT ``steps`` SGD
  steps under lessonlib's executor running ``dualpipev(p, m)`` and under PyTorch's
  ``ScheduleDualPipeV`` on the same stages (``schedule_runs.rank_parity``); the record it
  returns holds each engine's largest difference from one process
  (``schedule_runs.compare_parity``) and from the other engine. Both run each F&B slot's
  forward and backward one after the other in one thread: on a CPU the slot's overlap is
  in its order, not in two computes at once.

Laptop:  ``python -c "from lessonlib.pipeline import dualpipe_runs as d; print(d.run_parity())"``
GPU box: the same call (``backend="auto"`` picks NCCL with one GPU per rank).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from lessonlib.launcher import launch
from lessonlib.pipeline import schedule_runs
from lessonlib.pipeline.dualpipe import bubble_formula, dualpipev, readme_times
from lessonlib.pipeline.validate import simulate

# (F, B, W, F&B) per chunk, in the README's terms (B the full backward): where the formula
# holds (F = B - W = W, max(F, B) <= F&B <= F + B) and one where it is only an estimate.
TIMES = ((1.0, 2.0, 1.0, 2.0), (1.0, 2.0, 1.0, 2.5), (1.0, 2.0, 1.0, 3.0),
         (2.0, 4.0, 2.0, 5.0), (1.0, 2.0, 0.8, 3.0))


@dataclass
class BubbleRow:
    """DualPipeV at p devices and m micro-batches, with the README's times per chunk (F, B the
    full backward, W, FB the F&B slot): simulated idle per device and its most idle
    device's, the README's formula, the simulated peak stash and the README's 2p + 1."""
    p: int
    m: int
    F: float
    B: float
    W: float
    FB: float
    idle_per_device: list
    idle_simulated: float
    idle_formula: float
    peak_stash: list
    peak_stash_readme: int


def bubble_rows(ps=(2, 3, 4), extra_microbatches=(0, 3), times=TIMES) -> list[BubbleRow]:
    """One ``BubbleRow`` per (p, m = 2p + extra, times)."""
    rows = []
    for p in ps:
        for m in (2 * p + e for e in extra_microbatches):
            for f, b, w, fb in times:
                sim = simulate(dualpipev(p, m), **readme_times(f, b, w, fb))
                rows.append(BubbleRow(p, m, f, b, w, fb, sim.idle, max(sim.idle),
                                      bubble_formula(p, f, b, w, fb), sim.peak_stash, 2 * p + 1))
    return rows


@dataclass
class DualPipeParity:
    """DualPipeV on p ranks against one process and against PyTorch (largest differences)."""
    p: int
    m: int
    steps: int
    rows: list                 # schedule_runs.compare_parity's rows: one per engine
    max_engine_diff: float     # lessonlib's executor against ScheduleDualPipeV: grads, weights
    peak_stash: list           # (micro-batch, chunk) activations per device, lessonlib's run


def engine_diff(per_rank: list[dict], a, b) -> float:
    """Largest difference between two cases' first-step gradients and final weights."""
    return max((x - y).abs().max().item() for result in per_rank
               for what in ("grads", "params")
               for x, y in zip(getattr(result[a], what), getattr(result[b], what)))


def run_parity(p: int = 2, m: int = 4, steps: int = 2, backend: str = "auto",
           timeout: float = 120) -> DualPipeParity:
    """Parent side: one launch of p ranks, both engines, float64 (raises AssertionError,
    naming the case, if either differs from one process beyond float64 rounding)."""
    ours, theirs = ("lessonlib", "dualpipev", m, 2), ("torch", "dualpipev", m, 2)
    per_rank = launch(schedule_runs.rank_parity, p, [ours, theirs], steps=steps,
                      dtype=torch.float64, backend=backend, timeout=timeout)
    rows = schedule_runs.compare_parity(per_rank, steps=steps, dtype=torch.float64)
    return DualPipeParity(p, m, steps, rows, engine_diff(per_rank, ours, theirs),
                          [r[ours].stash for r in per_rank])
