"""Plots for lesson 05 (hybrid parallelism): the grid over servers, the sweet spot, Table 1,
and measured runs; the (t, p) maps, memory per GPU and where the step's time goes are drawn
by ``hybrid_design``.

Each plot is a thin layer over ``lessonlib.grid`` (pure layout) or ``lessonlib.costmodel``
(``estimate``, ``tp_sweep``, ``table1_rows``). The design question (n GPUs and a batch
fixed: which t and p?) has its maps in ``hybrid_design``; ``hybrid_widget`` puts ipywidgets
over them (model, mode, b, recompute, ZeRO stage, v, and the (t, p) to look at).

Laptop and GPU box alike: ``from lessonlib.viz import hybrid; hybrid.draw_grid(2, 2, 2, 4)``
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Rectangle

from lessonlib.costmodel import CLUSTERS, MODELS, table1_rows, tp_sweep
from lessonlib.grid_layout import axis_groups, placements
from lessonlib.viz.hybrid_design import TIME_COLORS, design_panel
from lessonlib.viz.widgets import current_figure, explorer

FIXED_GPUS, FIXED_DM = "n GPUs and B fixed", "d and m fixed"


def _model(model):
    return MODELS[model] if isinstance(model, str) else model


def _cluster(cluster):
    return CLUSTERS[cluster] if isinstance(cluster, str) else cluster


# ---------------------------------------------------------------- the grid over servers
def draw_grid(dp: int, pp: int, tp: int, gpus_per_node: int = 8, servers_per_row: int = 4,
              ax=None):
    """Every rank as a GPU square inside its server: colour = pipeline stage, shade = data-
    parallel replica, black outline = TP group (red dashes where one crosses a server)."""
    table = placements(dp, pp, tp, gpus_per_node)
    n_nodes = -(-len(table) // gpus_per_node)
    rows = -(-n_nodes // servers_per_row)
    cols = min(n_nodes, servers_per_row)
    width = min(max(9.0, 2.6 * cols * gpus_per_node / 4), 15)   # small grids drawn large
    ax = ax or plt.subplots(figsize=(width, max(2.6, 1.7 * rows + 0.6)))[1]
    stage_colors = plt.get_cmap("tab10" if pp <= 10 else "viridis")
    labels = len(table) <= 32

    def spot(rank):
        node, gpu = divmod(rank, gpus_per_node)
        row, col = divmod(node, servers_per_row)
        return col * (gpus_per_node + 1) + gpu, -row * 1.9

    for node in range(n_nodes):
        x, y = spot(node * gpus_per_node)
        ax.add_patch(Rectangle((x - 0.15, y - 0.25), gpus_per_node + 0.3, 1.5, fill=False,
                               ec="grey", lw=1))
        ax.text(x + gpus_per_node / 2, y + 1.1, f"server {node}", ha="center", fontsize=8)
    for pl in table:
        x, y = spot(pl.rank)
        color = stage_colors(pl.pp % 10 if pp <= 10 else pl.pp / max(pp - 1, 1))
        ax.add_patch(Rectangle((x + 0.05, y), 0.9, 0.9, color=color,
                               alpha=1.0 - 0.55 * pl.dp / max(dp, 1)))
        if labels:
            ax.text(x + 0.5, y + 0.45, f"r{pl.rank}\n{pl.dp},{pl.pp},{pl.tp}", ha="center",
                    va="center", fontsize=9 if len(table) <= 16 else 7)
    for group in axis_groups(dp, pp, tp)["tp"]:
        crosses = len({r // gpus_per_node for r in group}) > 1
        for node in sorted({r // gpus_per_node for r in group}):
            part = [r for r in group if r // gpus_per_node == node]
            x, y = spot(part[0])
            ax.add_patch(Rectangle((x, y - 0.05), len(part), 1.0, fill=False, lw=2,
                                   ec="red" if crosses else "black",
                                   ls="--" if crosses else "-"))
    ax.set_xlim(-0.5, cols * (gpus_per_node + 1))
    ax.set_ylim(-(rows - 1) * 1.9 - 0.5, 1.5)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(f"(d, p, t) = ({dp}, {pp}, {tp}) on servers of {gpus_per_node} GPUs: colour = "
                 f"pipeline stage, shade = DP replica, box = TP group"
                 + (" (label: rank, dp,pp,tp)" if labels else ""), fontsize=9)
    return ax


# ---------------------------------------------------------------- the cost model's views
def hybrid_widget(model="gpt-161B"):
    """The design question with controls: the model, the cluster, the mode (n GPUs and B
    fixed, so d and m follow each cell; or d and m fixed), b, recompute, ZeRO stage, v, and
    the (t, p) to look at, over ``hybrid_design.design_panel``."""
    import ipywidgets as w  # only the widget needs ipywidgets; the plots above do not

    def draw(mode, n_gpus, global_batch, d, m, **rest):
        if mode == FIXED_GPUS:
            return design_panel(n_gpus=n_gpus, global_batch=global_batch, **rest)
        return design_panel(n_gpus=None, global_batch=None, d=d, m=m, **rest)

    def pick(options, value, description=""):
        return w.Dropdown(options=options, value=value, description=description,
                          layout=w.Layout(width="170px"))

    powers = [1, 2, 4, 8, 16, 32, 64]
    box = explorer(
        current_figure(draw),
        model=w.Dropdown(options=list(MODELS), value=model, layout=w.Layout(width="260px")),
        cluster=pick(list(CLUSTERS), "dgx-a100"),
        mode=w.ToggleButtons(options=[FIXED_GPUS, FIXED_DM], value=FIXED_GPUS),
        n_gpus=pick([8, 16, 32, 64, 128, 256, 512, 1024, 2048, 3072], 64, "GPUs n"),
        global_batch=pick([64, 128, 256, 512, 1024, 1536, 2048, 4096], 64, "batch B"),
        d=pick([1, 2, 4, 8, 16], 1), m=pick([1, 4, 16, 64, 256], 64),
        t=pick(powers, 8), p=pick(powers, 8), b=pick([1, 2, 4, 8], 1),
        recompute=pick(["none", "selective", "full"], "full"),
        zero_stage=pick([0, 1, 2, 3], 0, "ZeRO"), v=pick([1, 2, 4, 8], 1))
    mode, n_gpus, batch, d, m = box.children[0].children[2:7]

    def grey_out(_=None):  # a control that would change nothing in this mode is disabled
        for control in (n_gpus, batch):
            control.disabled = mode.value != FIXED_GPUS
        for control in (d, m):
            control.disabled = mode.value == FIXED_GPUS

    mode.observe(grey_out, names="value")
    grey_out()
    return box


def sweet_spot(model="gpt-161B", cluster="dgx-a100", n_gpus: int = 64, global_batch: int = 64,
               ax=None):
    """TFLOP/s per GPU against t with p = n/t (``tp_sweep``), and on a second axis the shares
    of the step lost to the bubble (left of the peak) and to TP all-reduces (right of it)."""
    model, cluster = _model(model), _cluster(cluster)
    rows = [(t, p, e) for t, p, e in tp_sweep(model, cluster, n_gpus, global_batch) if e]
    ax = ax or plt.subplots(figsize=(7, 3.6))[1]
    xs = list(range(len(rows)))
    ax.axvspan(max(i for i, (t, _, _) in enumerate(rows) if t <= cluster.gpus_per_node) + 0.5,
               len(rows) - 0.5, color="0.92")
    ax.plot(xs, [e.tflops_per_gpu for _, _, e in rows], "o-", color="#4c72b0", lw=2,
            label="TFLOP/s per GPU (left axis)")
    ax.set_xticks(xs, [f"t={t}\np={p}" for t, p, _ in rows])
    ax.set_ylabel("predicted TFLOP/s per GPU")
    share = ax.twinx()
    for part, label in (("bubble", "bubble"), ("tp_comm", "TP all-reduces")):
        share.plot(xs, [100 * e.time[part] / e.step_time_s for _, _, e in rows], "s--",
                   color=TIME_COLORS[part], label=f"{label}, % of step (right axis)")
    share.set_ylabel("% of the step")
    share.set_ylim(0, 100)
    lines = ax.get_legend_handles_labels()[0] + share.get_legend_handles_labels()[0]
    share.legend(lines, [h.get_label() for h in lines], fontsize=7, loc="upper left")
    ax.set_title(f"{model.name} on {n_gpus} GPUs ({cluster.name}), B={global_batch}; "
                 f"grey: TP group spans servers", fontsize=9)
    return ax


def table1_plot(ax=None):
    """Megatron-LM 2021 Table 1: published TFLOP/s per GPU against the cost model's."""
    rows = table1_rows()
    ax = ax or plt.subplots(figsize=(8, 3.4))[1]
    xs = np.arange(len(rows))
    ax.bar(xs - 0.2, [r.tflops_per_gpu for r in rows], 0.4, label="published", color="0.6")
    ax.bar(xs + 0.2, [r.predicted for r in rows], 0.4, label="cost model", color="#4c72b0")
    for x, r in zip(xs, rows):
        ax.text(x + 0.2, r.predicted + 2, f"{r.error:+.0%}", ha="center", fontsize=7)
    ax.set_xticks(xs, [f"{r.params_billion:g}B\n{r.gpus} GPUs" for r in rows], fontsize=7)
    ax.set_ylabel("TFLOP/s per GPU")
    ax.set_title("Megatron-LM 2021 Table 1 (Narayanan et al.) against the cost model", fontsize=9)
    ax.legend(fontsize=8, loc="lower right")
    return ax


def lab_plot(record: dict):
    """A lab record's layouts: measured tokens/s; the pipeline's measured idle share against
    the predicted bubble (p-1)/(m+p-1); parameter bytes per rank against the TP/PP split."""
    names = list(record["results"])
    res = [record["results"][n] for n in names]
    xs, width = np.arange(len(names)), 0.4
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(13, 3.4))
    a.bar(xs, [r["tokens_per_s"] for r in res], color="#4c72b0")
    a.set_ylabel("measured tokens / s")
    a.set_title(f"{record['world_size']} {record['backend']} ranks on {record['device']}",
                fontsize=9)
    for ax, key, want, label, scale in (
            (b, "idle_share_median", "predicted_bubble", "share of the step", 100),
            (c, "param_bytes_per_rank", "expected_param_bytes_per_rank", "parameter kB per rank",
             1e-3)):
        pick = (lambda r, k: max(r[k])) if key.endswith("rank") else (lambda r, k: r[k])
        ax.bar(xs - width / 2, [pick(r, key) * scale for r in res], width, color="#4c72b0",
               label="measured" + (" (largest rank)" if key.endswith("rank") else
                                   " idle, median rank"))
        ax.bar(xs + width / 2, [pick(r, want) * scale for r in res], width, color="0.6",
               label="predicted" + (" from the split" if key.endswith("rank") else
                                    " bubble (p-1)/(m+p-1)"))
        ax.set_ylabel(label + (" (%)" if scale == 100 else ""))
        ax.legend(fontsize=7)
    for ax in (a, b, c):
        ax.set_xticks(xs, names, fontsize=8, rotation=30)
    fig.tight_layout()
    return fig
