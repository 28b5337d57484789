"""Naive model parallelism, measured over predicted (notebook 03).

What it teaches, in one figure of three panels over p = 1..8 stages: the idle share of each
rank climbs along (p-1)/p (the bubble at one micro-batch, GPipe §2.3); the parameter bytes
per rank fall along the whole model's / p; the step time stays where p = 1 left it, far above
the p = 1 time / p that splitting the *work* would give. Measured points come from a
``labs/mp.py`` result (the CPU run shipped in ``data/``, or a cluster's) and, as a second
marker labelled "this run", from the notebook's own assembly lines
(``model_parallel.line_record``).

``load_table`` reads a result into one row per p; ``plot_measured`` draws. The prediction is
computed here from the cost model; every measured number comes from the caller.

Laptop:  ``python -c "from lessonlib.viz import mp; mp.plot_measured('data/mp_cpu_results.json')
         .savefig('mp.png')"``
GPU box: ``torchrun --nproc-per-node 8 labs/mp.py --json results/mp.json``, then
         ``mp.plot_measured('results/mp.json')``.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import matplotlib.pyplot as plt

from lessonlib.costmodel import bubble_fraction
from lessonlib.lab import results

BY_P = "results.lessonlib.by_p"
STORED = {"marker": "o", "color": "#4C72B0"}
THIS_RUN = {"marker": "D", "color": "#C44E52"}


def load_table(source) -> list[dict]:
    """Rows with ``p``, ``idle_mean``, ``idle_per_rank``, ``step_time_s`` and
    ``param_bytes_per_rank``, one per p and run, from a ``labs/mp.py`` JSON file or a sweep
    folder of them (a path), one record (a dict), or rows that already have ``p`` (dicts, or
    ``line_record``'s records, read as the lab stores them)."""
    if isinstance(source, (str, Path)):
        rows = results.load(source, flat=True)     # the record's by-p detail, not its rows
    elif isinstance(source, dict):
        rows = [results.flatten(source)]
    else:
        rows = [dataclasses.asdict(r) if dataclasses.is_dataclass(r) else r for r in source]
    ready = [r for r in rows if "lab" not in r and "p" in r]
    records = [r for r in rows if r.get("lab") == "mp"]
    if len(ready) + len(records) < len(rows):
        raise ValueError(f"{source!r} holds rows that are not from labs/mp.py (lab "
                         f"{sorted({str(r.get('lab')) for r in rows if r.get('lab') != 'mp'})})"
                         f"; give the JSON that `python labs/mp.py --json FILE` wrote")
    return ready + results.explode(records, BY_P, "p")


def _label(rows: list[dict], default: str) -> str:
    first = rows[0]
    if "world_size" in first:
        return f"labs/mp.py, {first['world_size']} {first.get('device', '')} ranks"
    return default


def _given(source) -> bool:
    return source is not None and not (isinstance(source, (list, tuple)) and not source)


def plot_measured(table=None, this_run=None, p_max: int = 8):
    """Idle share, parameter bytes per rank and step time against p: the cost model's lines,
    the table's measured points (circles; small ones per rank, large ones the mean) and this
    run's (diamonds). ``table`` and ``this_run`` are anything ``load_table`` reads."""
    sources = [(load_table(t), style, default) for t, style, default in
               ((table, STORED, "measured"), (this_run, THIS_RUN, "this run")) if _given(t)]
    sources = [(rows, style, label if style is THIS_RUN else _label(rows, label))
               for rows, style, label in sources if rows]
    top = max([p_max] + [int(r["p"]) for rows, *_ in sources for r in rows])
    ps = list(range(1, top + 1))
    fig, (idle, mem, time) = plt.subplots(1, 3, figsize=(13, 3.8))
    idle.plot(ps, [bubble_fraction(p, 1) for p in ps], "-", color="gray",
              label="predicted (p-1)/p")
    wholes = sorted({sum(r["param_bytes_per_rank"]) for rows, *_ in sources for r in rows})
    for whole in wholes:
        mem.plot(ps, [whole / p / 1024 for p in ps], "-", color="gray",
                 label=f"predicted: whole model / p ({whole / 1024:,.0f} KiB)")
    split = {r["p"]: r["param_bytes_split"] for rows, *_ in sources for r in rows
             if r.get("param_bytes_split")}
    for p, stages in split.items():
        mem.plot([p] * len(stages), [b / 1024 for b in stages], "k_", ms=14, mew=1.5,
                 label="predicted: the balanced split's stages" if p == min(split) else None)
    for rows, style, label in sources:
        for r in rows:
            n = len(r["idle_per_rank"])
            idle.plot([r["p"]] * n, r["idle_per_rank"], style["marker"], color=style["color"],
                      ms=4, alpha=0.35)
            mem.plot([r["p"]] * n, [b / 1024 for b in r["param_bytes_per_rank"]],
                     style["marker"], color=style["color"], ms=5, alpha=0.6)
        rows = sorted(rows, key=lambda r: r["p"])
        idle.plot([r["p"] for r in rows], [r["idle_mean"] for r in rows], style["marker"],
                  color=style["color"], ms=9, mfc="none", mew=2, label=f"{label} (mean)")
        mem.plot([], [], style["marker"], color=style["color"], label=f"{label}, every rank")
        time.plot([r["p"] for r in rows], [r["step_time_s"] * 1e3 for r in rows],
                  style["marker"], color=style["color"], ms=8, label=label)
        one = [r["step_time_s"] for r in rows if r["p"] == 1]
        if one:
            time.plot(ps, [one[0] * 1e3] * len(ps), "-", color="gray",
                      label="the p = 1 time (messages not modelled)")
            time.plot(ps, [one[0] * 1e3 / p for p in ps], ":", color="gray",
                      label="if time divided by p")
    idle.set(ylim=(-0.02, 1), ylabel="idle share of the step (wall time)",
             title="time: only one rank works at a time")
    mem.set(ylim=(0, None), ylabel="KiB of parameters per rank", title="memory: divides by p")
    slowest = max((r["step_time_s"] * 1e3 for rows, *_ in sources for r in rows), default=1.0)
    time.set(ylim=(0, slowest * 1.6), ylabel="ms per step (median)",   # room for the legend
             title="step time: does not divide")
    for ax in (idle, mem, time):
        ax.set_xticks(ps, [str(p) for p in ps])
        ax.set_xlabel("p (stages in the line)")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="lower right" if ax is idle else "upper right")
        ax.title.set_fontsize(10)
    fig.tight_layout()
    return fig
