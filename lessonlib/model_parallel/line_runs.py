"""Lesson 03's checks: the same training in one process, and the line's numbers.

What it teaches: the assembly line is only right if it trains exactly as one process does
(``single_process``, ``compare_parity``: losses and every weight after the last step), and only
slow in the way the lesson says: ``summarize`` gives each stage's busy seconds and idle share
of the wall time next to the predicted (p-1)/p, ``line_record`` the numbers ``labs/mp.py``
stores.

Laptop:  ``python -c "from lessonlib import model_parallel as mp;
         r = mp.run_assembly_line(2, model='mlp');
         print(mp.compare_parity(r, mp.single_process('mlp')))"``
GPU box: the same.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass

from torch import nn

from lessonlib.baseline import train_one_process
from lessonlib.costmodel import bubble_fraction
from lessonlib.instruments.spans import Span
from lessonlib.layer_split import layers_of
from lessonlib.model_parallel.line import LineResult, loss_of, make_batch, make_model

BUSY = ("F", "B", "OPT")


# ---------------------------------------------------------------- one process, and the checks
@dataclass
class OneProcessRun:
    """``single_process``: each step's loss, the final weights by name, the parameter bytes."""
    losses: list
    state: dict
    param_bytes: int


@dataclass
class LineParity:
    """``parity``: the largest loss and weight differences from one process."""
    loss_max_abs_diff: float
    weights_max_abs_diff: float


@dataclass
class StageRow:
    """``summarize``: one stage's layers, parameter and stashed activation bytes, busy
    seconds, and idle share of the wall time, measured and predicted ((p-1)/p)."""
    stage: int
    layers: list
    param_bytes: int
    stash_bytes: int
    busy_s: float
    idle_measured: float
    idle_predicted: float


def single_process(model: str = "gpt", steps: int = 3, warmup: int = 1, batch: int = 8,
                   lr: float = 0.05, seed: int = 0, **shape) -> OneProcessRun:
    """The same training on one process: the reference for ``compare_parity``."""
    net = nn.Sequential(*layers_of(make_model(model, seed, **shape)))
    run = train_one_process(net, lambda step: make_batch(model, step, batch, seed, **shape),
                            warmup + steps, lambda out, y: loss_of(model, out, y), lr=lr)
    return OneProcessRun(run["losses"], {n: t.detach() for n, t in net.state_dict().items()},
                         sum(t.numel() * t.element_size() for t in net.parameters()))


def compare_parity(results: list[LineResult], reference: OneProcessRun) -> LineParity:
    """Largest differences between one assembly line (``results[0]``'s) and one process:
    the losses, and every weight after the last step."""
    line = _line(results)
    state = {n: t for r in line for n, t in r.state.items()}
    ref = reference.state
    if set(state) != set(ref):
        raise ValueError(f"the stages hold {sorted(state)} but one process holds {sorted(ref)}")
    weights = max((state[n] - ref[n]).abs().max().item() for n in ref)
    loss = max(abs(a - b) for a, b in zip(line[-1].losses, reference.losses))
    return LineParity(loss, weights)


def _line(results: list[LineResult]) -> list[LineResult]:
    """The results of the line that ``results[0]`` belongs to, in stage order."""
    p, base = results[0].p, results[0].rank // results[0].p
    return sorted((r for r in results if r.rank // p == base), key=lambda r: r.stage)


def idle_fraction(timeline: list[Span], wall: float) -> float:
    """Share of ``wall`` seconds in which this rank did no work (no F, B or OPT)."""
    busy = sum(x.end - x.start for x in timeline if x.kind in BUSY)
    return 1.0 - busy / wall if wall > 0 else 0.0


def summarize(results: list[LineResult]) -> list[StageRow]:
    """One ``StageRow`` per rank of ``results[0]``'s line."""
    line = _line(results)
    wall = max(x.end for r in line for x in r.timeline)
    p = len(line)
    return [StageRow(r.stage, r.layers, r.param_bytes, r.stash_bytes,
                     busy_s=sum(x.end - x.start for x in r.timeline if x.kind in BUSY),
                     idle_measured=idle_fraction(r.timeline, wall), idle_predicted=(p - 1) / p)
            for r in line]


@dataclass
class LineRecord:
    """``line_record``: one line as the numbers ``labs/mp.py`` stores (``dataclasses.asdict``
    is its JSON row): idle share per rank and its mean beside (p-1)/p, the median and every
    step time, and busy seconds, parameter and stashed activation bytes per rank."""
    p: int
    idle_per_rank: list
    idle_mean: float
    idle_predicted: float
    step_time_s: float
    step_times_s: list
    busy_s_per_rank: list
    param_bytes_per_rank: list
    stash_bytes_per_rank: list


def line_record(results: list[LineResult]) -> LineRecord:
    """``results[0]``'s line as one row: idle share per rank and its mean next to the
    predicted (p-1)/p, the median step time (first span of a step to its last, over the
    line), and parameter, activation and busy figures per rank in stage order."""
    rows, line = summarize(results), _line(results)
    p, steps = len(line), sorted({s.step for r in line for s in r.timeline})
    spans = [[s for r in line for s in r.timeline if s.step == k] for k in steps]
    times = [max(s.end for s in x) - min(s.start for s in x) for x in spans]
    idle = [r.idle_measured for r in rows]
    return LineRecord(p, idle, sum(idle) / p, bubble_fraction(p, 1), statistics.median(times),
                      times, [r.busy_s for r in rows], [r.param_bytes for r in rows],
                      [r.stash_bytes for r in rows])
