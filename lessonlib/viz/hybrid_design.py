"""Lesson 05's design question as a picture: given n GPUs and a global batch B, which (t, p)?

Every cell of the map is one layout: t-way tensor and p-way pipeline parallelism, and the rest
of the GPUs as replicas, d = n/(t*p), each running m = B/(b*d) micro-batches of b sequences
(Megatron-LM 2021's notation, B = b*m*d). The left map is the cost model's TFLOP/s per GPU
(``costmodel.estimate``), the right one the pipeline bubble of the same cells, so the sweet
spot's trade (bubble on the left, TP all-reduces across servers at the top) is visible at
once. A cell is grey when its layout cannot be built (d or m not a whole number, t not
dividing the heads, p above the layers: the cell says which) or does not fit in memory (the
cell gives the GB it would need). ``design_panel`` adds one cell's memory and step time;
``hybrid.hybrid_widget`` puts controls over it.

Laptop and GPU box alike::

    python -c "from lessonlib.viz import hybrid_design as h; \
h.design_panel('megatron-1T', n_gpus=1024, global_batch=2048, t=8, p=16).savefig('1t.png')"
"""
from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Rectangle

from lessonlib.costmodel import CLUSTERS, MODELS, Estimate, Layout, estimate

GB = 1e9
PARTS = ("weights", "gradients", "optimizer", "activations")
PART_COLORS = {"weights": "#4c72b0", "gradients": "#dd8452", "optimizer": "#55a868",
               "activations": "#c44e52"}
TIME_COLORS = {"compute": "#4c72b0", "elementwise": "#8172b3", "tp_comm": "#dd8452",
               "pp_comm": "#937860", "dp_comm": "#55a868", "bubble": "#c44e52"}
POWERS = (1, 2, 4, 8, 16, 32, 64)


def _model(model):
    return MODELS[model] if isinstance(model, str) else model


def _cluster(cluster):
    return CLUSTERS[cluster] if isinstance(cluster, str) else cluster


@dataclass(frozen=True)
class Cell:
    """One (t, p) of the map: its d and m (None where not whole), the estimate (None where
    the layout cannot be built) and, then, a short reason a cell can show."""

    t: int
    p: int
    d: int | None
    m: int | None
    estimate: Estimate | None
    reason: str = ""

    @property
    def fits(self):
        return self.estimate is not None and self.estimate.fits


def _short_reason(exc, t, p, model):
    """Two short lines for a cell from the Layout error (the full one goes in ``Cell``)."""
    if p > model.L:
        return f"p > L\n= {model.L}"
    if model.a % t or model.h % t:
        return "t must\ndivide a"
    return str(exc).split(";")[0][:18]


def design_cell(model, cluster, t, p, n_gpus=None, global_batch=None, d=None, m=None, b=1,
                **options):
    """The cell (t, p) with n_gpus and global_batch fixed (d, m follow), or with d and m
    fixed (the GPU count and batch follow); ``options`` go to ``Layout`` (v, recompute,
    zero_stage, ...)."""
    model, cluster = _model(model), _cluster(cluster)
    if n_gpus is not None:
        if n_gpus % (t * p):
            return Cell(t, p, None, None, None, "t*p > n" if t * p > n_gpus
                        else "n/(t*p)\nnot whole")
        d = n_gpus // (t * p)
        if global_batch % (b * d):
            return Cell(t, p, d, None, None, "B/(b*d)\nnot whole")
        m = global_batch // (b * d)
    try:
        est = estimate(model, Layout(t=t, p=p, d=d, b=b, m=m, **options), cluster)
    except ValueError as exc:
        return Cell(t, p, d, m, None, _short_reason(exc, t, p, model))
    return Cell(t, p, d, m, est, "" if est.fits else f"{est.memory.total / GB:.0f}\nGB")


def design_grid(model, cluster="dgx-a100", n_gpus=None, global_batch=None, d=None, m=None,
                b=1, ts=POWERS, ps=POWERS, **options):
    """{(t, p): Cell} over ts x ps; give n_gpus and global_batch, or d and m."""
    fixed = n_gpus is not None and global_batch is not None and d is None and m is None
    free = n_gpus is None and global_batch is None and d is not None and m is not None
    if not (fixed or free):
        raise ValueError(f"give n_gpus and global_batch (got {n_gpus}, {global_batch}) or d "
                         f"and m (got {d}, {m}), not both")
    return {(t, p): design_cell(model, cluster, t, p, n_gpus, global_batch, d, m, b, **options)
            for t in ts for p in ps}


def best_cell(grid):
    """The fitting cell with the highest predicted TFLOP/s per GPU, or None if none fits."""
    fitting = [c for c in grid.values() if c.fits]
    return max(fitting, key=lambda c: c.estimate.tflops_per_gpu, default=None)


def _heatmap(grid, ts, ps, value, label, fmt, ax, cmap, mark, best, grey_text):
    values = np.full((len(ts), len(ps)), np.nan)  # (t, p)
    for (i, t), (j, p) in ((a, c) for a in enumerate(ts) for c in enumerate(ps)):
        cell = grid[t, p]
        shown = value(cell)
        if shown is None:
            ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, color="0.88"))
            ax.text(j, i, grey_text(cell), ha="center", va="center", fontsize=6.5, color="0.3")
            continue
        values[i, j] = shown
    image = ax.imshow(values, cmap=cmap, origin="lower", aspect="auto")
    for (i, t), (j, p) in ((a, c) for a in enumerate(ts) for c in enumerate(ps)):
        if not np.isnan(values[i, j]):
            r, g, bl, _ = image.cmap(image.norm(values[i, j]))
            ax.text(j, i, fmt(values[i, j], grid[t, p]), ha="center", va="center", fontsize=8,
                    color="black" if 0.3 * r + 0.6 * g + 0.1 * bl > 0.5 else "white")
    plt.colorbar(image, ax=ax, label=label, fraction=0.05, pad=0.02)
    ax.set_xticks(range(len(ps)), ps)
    ax.set_yticks(range(len(ts)), ts)
    ax.set_xlabel("p (pipeline stages)")
    ax.set_ylabel("t (tensor-parallel size)")
    for spot, color, width in ((best, "deepskyblue", 3), (mark, "red", 2)):
        if spot is not None and spot[0] in ts and spot[1] in ps:
            ax.add_patch(Rectangle((ps.index(spot[1]) - 0.5, ts.index(spot[0]) - 0.5), 1, 1,
                                   fill=False, ec=color, lw=width))


def design_heatmaps(model="gpt-161B", cluster="dgx-a100", n_gpus=64, global_batch=64, d=None,
                    m=None, b=1, mark=None, axes=None, **options):
    """Two maps over (t, p): predicted TFLOP/s per GPU (cells that fit; grey ones give the
    GB needed or the reason) and the bubble's share of the step's wall time, (p-1)/(v*m+p-1),
    for every cell that can be built, fitting or not. Red box: ``mark``; blue box: the best."""
    model, cluster = _model(model), _cluster(cluster)
    fixed = n_gpus if d is None else None
    ts = tuple(t for t in POWERS if t <= (fixed or POWERS[-1]))
    ps = tuple(p for p in POWERS if p <= min(model.L, fixed or POWERS[-1]))
    grid = design_grid(model, cluster, fixed, global_batch if fixed else None, d, m, b, ts, ps,
                       **options)
    best = best_cell(grid)
    axes = axes if axes is not None else plt.subplots(1, 2, figsize=(11, 4))[1]
    _heatmap(grid, ts, ps, lambda c: c.estimate.tflops_per_gpu if c.fits else None,
             "predicted TFLOP/s per GPU",
             lambda v, c: f"{v:.0f}",
             axes[0], "viridis", mark, best and (best.t, best.p), lambda c: c.reason)
    _heatmap(grid, ts, ps, lambda c: None if c.estimate is None else
             100 * c.estimate.bubble_fraction, "bubble, % of the step's wall time",
             lambda v, c: f"{v:.0f}", axes[1], "magma_r", mark, None,
             lambda c: c.reason if c.estimate is None else "")
    where = (f"n={n_gpus} GPUs, B={global_batch}: d=n/(t*p), m=B/(b*d)" if fixed
             else f"d={d}, m={m}: n=t*p*d, B=b*m*d")
    axes[0].set_title(f"{model.name}, {cluster.name}, {where}, b={b}\nTFLOP/s per GPU (blue: "
                      f"best, red: chosen; grey: GB needed or why not)", fontsize=9)
    axes[1].set_title("bubble, % of the step's wall time: (p-1)/(v*m+p-1)\n"
                      "(dashes: above them a TP group spans servers)", fontsize=9)
    for ax in axes:
        gpn = cluster.gpus_per_node
        ax.axhline(ts.index(gpn) + 0.5 if gpn in ts else len(ts) - 0.5, color="0.5", ls="--",
                   lw=1)
    return grid


def memory_bar(est, ax=None):
    """One layout's memory per GPU (the busiest, first stage) by part, against capacity."""
    ax = ax or plt.subplots(figsize=(2.8, 4))[1]
    parts = est.memory.as_dict()
    bottom = 0.0
    for part in PARTS:
        ax.bar(0, parts[part] / GB, bottom=bottom, color=PART_COLORS[part], width=0.6,
               label=f"{part} {parts[part] / GB:.1f}")
        bottom += parts[part] / GB
    cap = est.memory_capacity_bytes / GB
    ax.axhline(cap, color="black", ls="--", lw=1)
    ax.text(-0.45, cap, f"usable {cap:.0f} GB", fontsize=8, va="bottom")
    ax.set_ylim(0, max(bottom, cap) * 1.6)
    ax.set_xticks([])
    ax.set_xlim(-0.5, 1.0)
    ax.set_ylabel("GB per GPU")
    ax.set_title(f"memory per GPU:\n{'fits' if est.fits else 'does NOT fit'}", fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    return ax


def time_bar(est, ax=None):
    """Where one step's time goes, bubble included (seconds per step)."""
    ax = ax or plt.subplots(figsize=(6, 1.8))[1]
    left = 0.0
    for part, seconds in est.time.items():
        ax.barh(0, seconds, left=left, color=TIME_COLORS.get(part, "grey"),
                label=f"{part} {seconds:.2f} s")
        left += seconds
    ax.set_yticks([])
    ax.set_xlabel("seconds per step")
    ax.set_title(f"{est.layout.describe()}: {est.tflops_per_gpu:.0f} TFLOP/s per GPU, "
                 f"bubble {est.bubble_fraction:.1%} of the step's wall time", fontsize=9)
    ax.legend(fontsize=7, ncol=6, loc="upper center", bbox_to_anchor=(0.5, -0.5))
    return ax


def design_panel(model="gpt-161B", cluster="dgx-a100", n_gpus=64, global_batch=64, t=8, p=8,
                 d=None, m=None, b=1, **options):
    """The widget's figure, 11 inches wide (the notebook's width at 80 dpi): both maps, then
    the chosen (t, p)'s step time and memory per GPU, or why it cannot be built."""
    fig = plt.figure(figsize=(11, 6.4))
    spec = fig.add_gridspec(2, 3, width_ratios=(1, 1, 0.32), height_ratios=(2.6, 1))
    grid = design_heatmaps(model, cluster, n_gpus, global_batch, d, m, b, mark=(t, p),
                           axes=[fig.add_subplot(spec[0, 0]), fig.add_subplot(spec[0, 1])],
                           **options)
    cell = grid.get((t, p)) or design_cell(model, cluster, t, p,
                                           *((n_gpus, global_batch, None, None) if d is None
                                             else (None, None, d, m)), b, **options)
    if cell.estimate is None:
        fig.text(0.05, 0.15, f"t={t}, p={p}: {cell.reason.replace(chr(10), ' ')}", fontsize=9)
    else:
        memory_bar(cell.estimate, fig.add_subplot(spec[0, 2]))
        time_bar(cell.estimate, fig.add_subplot(spec[1, :2]))
    fig.tight_layout()
    return fig
