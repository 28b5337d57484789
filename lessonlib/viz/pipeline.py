"""Plots for the pipeline lesson: Gantt charts of schedules, bubble and stash against p, m, v.

``gantt`` draws per-stage timelines (simulated by ``pipeline.validate.simulate`` or measured
by the executor): one row per stage, time to the right, forwards blue, backwards green,
waiting for a message hatched grey, and idle time left as the pale red row behind them, so
the bubble is what you see. An F&B slot (DualPipeV) is one black-bordered cell, its F in
the upper half and its B in the lower, as DeepSeek's DualPipe figures draw it. ``gantt_pair`` puts the theory above a measured run.
``bubble_plot`` and ``stash_plot`` draw the cost model's predictions (bubble in both
conventions, activations held per stage) with measured points on top; ``widget`` puts
sliders for p, m and v over both.

Laptop and GPU box alike:
``from lessonlib.viz import pipeline as vp; vp.gantt_schedule("1f1b", 4, 8)``
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from lessonlib.costmodel import bubble_fraction, stashed_microbatches
from lessonlib.pipeline.dualpipe import readme_times
from lessonlib.pipeline.schedules import make
from lessonlib.pipeline.validate import simulate
from lessonlib.viz.widgets import explorer

COLORS = {"F": "#4c72b0", "B": "#55a868", "W": "#c9a227", "wait": "#bbbbbb", "idle": "#f6d5d5"}
NAMES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "interleaved 1F1B", "zb-h1": "ZB-H1",
         "zbv": "ZBV", "dualpipev": "DualPipeV"}


def _slots(line) -> set:
    """(start, end) of each F&B slot in a stage's spans: two computes over one interval."""
    computes = [x for x in line if x.kind in ("F", "B", "W")]
    return {(x.start, x.end) for x, y in zip(computes, computes[1:])
            if (x.start, x.end) == (y.start, y.end) and x.end > x.start}


def gantt(timelines, ax=None, title: str = "", unit: str = "s", labels: bool = True):
    """Rows = stages (stage 0 on top), bars = F / B spans; idle shows as the pale red row.

    ``timelines``: per stage, a list of spans with ``kind, microbatch, chunk, start, end``."""
    p = len(timelines)
    ax = ax or plt.subplots(figsize=(10, 0.6 + 0.45 * p), constrained_layout=True)[1]
    end = max((x.end for line in timelines for x in line), default=1.0) or 1.0
    scale = 1e3 if unit == "s" else 1.0
    slotted = False
    for s, line in enumerate(timelines):
        y = p - 1 - s
        ax.barh(y, end * scale, left=0, height=0.8, color=COLORS["idle"], zorder=0)
        slots = _slots(line)
        slotted = slotted or bool(slots)
        for start, stop in slots:
            ax.barh(y, (stop - start) * scale, left=start * scale, height=0.84, fill=False,
                    edgecolor="black", linewidth=1.0, zorder=4)
        for x in line:
            width = (x.end - x.start) * scale
            if x.kind in ("F", "B", "W"):
                shade = 1.0 - 0.35 * x.chunk
                half = (x.start, x.end) in slots           # F above, B below
                at = y + (0.2 if x.kind == "F" else -0.2) * half
                ax.barh(at, width, left=x.start * scale, height=0.8 - 0.4 * half,
                        color=COLORS[x.kind], alpha=max(shade, 0.4), edgecolor="white",
                        linewidth=0.5, zorder=2)
                if labels and width > 0.025 * end * scale:
                    ax.text((x.start + x.end) / 2 * scale, at, str(x.microbatch), ha="center",
                            va="center", color="white", fontsize=7 - half, zorder=3)
            elif x.kind.startswith("RECV"):
                ax.barh(y, width, left=x.start * scale, height=0.35, color=COLORS["wait"],
                        hatch="///", edgecolor="#888888", linewidth=0, zorder=1)
    ax.set_yticks(range(p), [f"stage {s}" for s in reversed(range(p))])
    ax.set_xlim(0, _longest(ax) * 1.01)
    ax.set_xlabel("time (ms)" if unit == "s" else f"time ({unit})")
    ax.set_title(title, fontsize=10)
    split = any(x.kind == "W" for line in timelines for x in line)
    kinds = ("F", "B", "W", "idle") if split else ("F", "B", "idle")
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[k]) for k in kinds]
    handles.append(plt.Rectangle((0, 0), 1, 1, facecolor=COLORS["wait"], hatch="///"))
    names = ["forward", "backward (B: input gradient)" if split else "backward"]
    names += ["weight gradient (W)"] * split + ["idle (bubble)", "waiting for a message"]
    if any(x.chunk for line in timelines for x in line):
        names[:2 + split] = [f"{n} (paler: chunk 1)" for n in names[:2 + split]]
    if slotted:           # DualPipeV: whole backwards beside split ones
        names[1] = names[1].replace("B: input gradient", "B: whole, or the input gradient "
                                    "where a W follows")
        handles.append(plt.Rectangle((0, 0), 1, 1, fill=False, edgecolor="black"))
        names.append("F&B slot (F above, B below)")
    ax.legend(handles, names, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7,
              frameon=False)
    return ax


def _longest(ax) -> float:
    """The latest end drawn on ``ax`` or on any panel sharing its x axis (each chart's idle
    row spans its whole step), so that panels drawn one by one on a shared axis all end at
    the longest chart's end instead of the last one drawn."""
    return max((bar.get_x() + bar.get_width() for panel in ax.get_shared_x_axes().get_siblings(ax)
                for bar in panel.patches), default=1.0) or 1.0


def gantt_schedule(name: str, p: int, m: int, v: int = 1, forward: float = 1.0,
                   backward: float = 2.0, ax=None, overlapped: float | None = None):
    """The theoretical chart: ``simulate`` the named schedule with F = ``forward`` and
    B = ``backward`` time units (per chunk: divided by v, so the total work is the same);
    where the backward is split, B and W take half of ``backward`` each. DualPipeV's F&B
    slot takes ``overlapped`` (default: its F plus its whole B, nothing hidden)."""
    v = 2 if name in ("zbv", "dualpipev") else v
    split = name in ("zb-h1", "zbv")
    times = (readme_times(forward / v, backward / v, backward / v / 2, overlapped)
             if name == "dualpipev" else
             dict(forward=forward / v, backward=backward / v / (2 if split else 1),
                  weight=backward / v / 2))
    sim = simulate(make(name, p, m, v), **times)
    title = (f"{NAMES[name]}, p={p}, m={m}" + (f", v={v}" if v > 1 else "") +
             f" (theory): bubble {sim.bubble[0]:.1%} of wall time")
    return gantt(sim.timelines, ax=ax, title=title, unit="time units")


def gantt_pair(name: str, measured, p: int, m: int, v: int = 1, bubble=None):
    """Theory (simulated, F:B = 1:2) above the measured timelines of a real run."""
    fig, axes = plt.subplots(2, 1, figsize=(10, 1.8 + 0.9 * p), constrained_layout=True)
    gantt_schedule(name, p, m, v, ax=axes[0])
    note = f": bubble {np.mean(bubble):.1%} of wall time" if bubble is not None else ""
    gantt(measured, ax=axes[1], title=f"{NAMES[name]}, p={p}, m={m} (measured{note})")
    return fig


# ---------------------------------------------------------------- predictions vs measured
def predicted_stash(name: str, p: int, m: int, v: int = 1) -> list[float]:
    """Micro-batches' worth of a stage's activations held at the peak, per stage.

    GPipe m and 1F1B min(p - s, m) from the cost model; interleaved from the simulated
    schedule, in (micro-batch, chunk) units divided by v."""
    if name == "interleaved" and v > 1:
        return [n / v for n in simulate(make(name, p, m, v)).peak_stash]
    return [float(stashed_microbatches(name, p, m, s)) for s in range(p)]


def bubble_plot(p: int = 4, m: int = 8, v: int = 2, measured=(), ax=None, m_max: int = 32):
    """Bubble vs m for p stages, in both conventions, with measured points (rows of
    ``schedule_runs.summarize``, same p) on top and the chosen m marked."""
    ax = ax or plt.subplots(figsize=(5.5, 3.6))[1]
    ms = np.arange(1, m_max + 1)
    for vv, style in ((1, "-"), (v, "--")) if v > 1 else ((1, "-"),):
        label = "GPipe = 1F1B" if vv == 1 else f"interleaved v={vv}"
        ax.plot(ms, [bubble_fraction(p, int(x), vv, "wall") for x in ms], style, color="#c44e52",
                label=f"{label}: (p-1)/(v m+p-1) of wall time")
        ax.plot(ms, [bubble_fraction(p, int(x), vv, "ideal") for x in ms], style, color="#8172b2",
                label=f"{label}: (p-1)/(v m) of ideal time", alpha=0.7)
    ax.axvline(m, color="grey", lw=0.8, ls=":")
    for row in measured:
        if row.p == p:
            marker = {"gpipe": "o", "1f1b": "s", "interleaved": "^"}[row.schedule]
            ax.plot(row.m, row.bubble_mean, marker, color="black", mfc="none",
                    label=f"measured {NAMES[row.schedule]} ({row.engine}, wall)")
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax.legend(unique.values(), unique.keys(), fontsize=7)
    # the ideal-time convention passes 1 at small m (more bubble than compute): show it all
    ax.set_ylim(0, max(1.0, p - 1.0) * 1.02)     # GPipe at m = 1: (p-1)/1 of ideal time
    ax.set_xlabel("micro-batches m")
    ax.set_ylabel("bubble")
    ax.set_title(f"p={p}: wall (GPipe §2.3) and ideal (Megatron-LM 2021 §2.2)", fontsize=9)
    return ax


def stash_plot(p: int = 4, m: int = 8, v: int = 2, measured=(), ax=None):
    """Activations held per stage at the peak: GPipe, 1F1B and interleaved, with measured
    points (rows of ``schedule_runs.summarize`` with the same p and m) on top."""
    ax = ax or plt.subplots(figsize=(5.5, 3.6))[1]
    names = ["gpipe", "1f1b"] + (["interleaved"] if v > 1 and m % p == 0 else [])
    width = 0.8 / len(names)
    colors = {"gpipe": "#dd8452", "1f1b": "#4c72b0", "interleaved": "#55a868"}
    for i, name in enumerate(names):
        xs = np.arange(p) + (i - (len(names) - 1) / 2) * width
        ax.bar(xs, predicted_stash(name, p, m, v), width, color=colors[name], alpha=0.75,
               label=f"{NAMES[name]} (predicted)")
        for row in measured:
            if (row.p, row.m, row.schedule) == (p, m, name) and row.v in (1, v):
                got = [n / row.v for n in row.peak_stash_per_stage]
                ax.plot(xs, got, "k_", markersize=14, mew=2)
    ax.plot([], [], "k_", markersize=10, mew=2, label="measured")
    ax.set_xticks(range(p), [f"stage {s}" for s in range(p)])
    ax.set_ylabel("micro-batches of activations held")
    ax.set_title(f"peak stash, p={p}, m={m}" + (f", v={v}" if v > 1 else ""), fontsize=9)
    ax.legend(fontsize=7)
    return ax


def bubble_and_memory(rows, engine: str = "lessonlib"):
    """The lesson's finding, measured: per m, GPipe's and 1F1B's bubble (left, with the
    theory (p-1)/(m+p-1) of wall time) and stage 0's peak stashed activations (right)."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6), constrained_layout=True)
    ms = sorted({r.m for r in rows if r.engine == engine and r.v == 1})
    p = rows[0].p
    xs = np.arange(len(ms))
    for i, name in enumerate(("gpipe", "1f1b")):
        got = {r.m: r for r in rows if (r.engine, r.schedule) == (engine, name)}
        color = {"gpipe": "#dd8452", "1f1b": "#4c72b0"}[name]
        axes[0].bar(xs + (i - 0.5) * 0.38, [got[m].bubble_mean for m in ms], 0.38,
                    color=color, label=f"{NAMES[name]} measured")
        axes[1].bar(xs + (i - 0.5) * 0.38, [got[m].peak_stash_bytes_per_stage[0] / 2 ** 20
                                            for m in ms], 0.38, color=color, label=NAMES[name])
    axes[0].plot(xs, [bubble_fraction(p, m) for m in ms], "k_", markersize=30, mew=2,
                 label="theory (p-1)/(m+p-1) of wall time")
    top = max([bubble_fraction(p, m) for m in ms] +
              [r.bubble_mean for r in rows if r.engine == engine])
    axes[0].set_ylim(0, top * 1.45)
    axes[0].set_ylabel("bubble (share of wall time)")
    axes[1].set_ylabel("MiB saved for backward, stage 0")
    for ax, title in zip(axes, ("the bubble: the same", "the memory: 1F1B caps it")):
        ax.set_xticks(xs, [f"m={m}" for m in ms])
        ax.set_title(f"{title} (p={p}, {engine})", fontsize=10)
        ax.legend(fontsize=7, markerscale=0.4)      # the theory's wide marker, shrunk
    return fig


def explore(p: int = 4, m: int = 8, v: int = 2, measured=()):
    """Both panels for one (p, m, v): what the widget redraws."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), constrained_layout=True)
    bubble_plot(p, m, v, measured, ax=axes[0])
    stash_plot(p, m, v, measured, ax=axes[1])
    if v > 1 and m % p:
        axes[1].text(0.5, 0.95, f"interleaved needs m a multiple of p={p}", ha="center",
                     va="top", transform=axes[1].transAxes, fontsize=8, color="#c44e52")
    return fig


def widget(measured=()):
    """Sliders for p, m and v over ``explore``; measured points drawn where p and m match."""
    import ipywidgets as w

    return explorer(lambda p, m, v: explore(p, m, v, measured=measured),
                    p=w.IntSlider(value=2, min=1, max=16), m=w.IntSlider(value=8, min=1, max=64),
                    v=w.IntSlider(value=2, min=1, max=4))
