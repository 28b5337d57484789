"""Plots for data parallelism (notebook 02): each draws numbers the caller measured or predicted.

What it teaches, one picture each:

* ``plot_replicas``: the loss curve of n data-parallel ranks on top of one process's;
* ``plot_step_timeline``: one training step per rank, computation and all-reduces on their
  own rows: after backward (naive) against during it (buckets);
* ``plot_allreduce``: time against message size and against world size for each
  algorithm, measured (markers) and the fitted alpha-beta model (lines);
* ``plot_busiest_link``: bytes through the busiest rank's link, per direction, counted by the
  ledger, against world size: what grows for a parameter server even where time cannot show it;
* ``plot_buckets``: the predicted bucket schedule of one step, and the communication left
  after backward against the bucket size, with measured points;
* ``plot_ddp_lab``: a ``labs/ddp.py`` record: step times and scaling efficiency.

``allreduce_explorer`` and ``bucket_explorer`` put sliders (ipywidgets) over the last two.

Laptop:  ``python -c "from lessonlib.viz import dp; dp.plot_buckets(4e7, 2, 4e6, 0.2,
          {'alpha_s': 1e-4, 'bandwidth_Bps': 1e9}).savefig('buckets.png')"``
GPU box: the same.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from lessonlib.costmodel import parameter_server_bytes, ring_allreduce_bytes_per_rank
from lessonlib.costmodel.alpha_beta import bucketed_step, predict_from_fit
from lessonlib.viz.widgets import explorer

COLORS = {"ring": "#4C72B0", "parameter_server": "#C44E52", "naive_ring": "#DD8452",
          "torch": "#55A868", "forward": "#8172B3", "backward": "#64B5CD",
          "optimizer": "#8C8C8C", "comm": "#C44E52"}
LABELS = {"ring": "ring (reduce-scatter + all-gather)", "parameter_server": "parameter server",
          "naive_ring": "naive ring", "torch": "dist.all_reduce (gloo)"}
MiB = 2 ** 20


def plot_replicas(single_losses, replica_losses, n: int):
    """One process's loss per step against the mean of n ranks' shard losses."""
    fig, ax = plt.subplots(figsize=(6, 3.2))
    steps = np.arange(1, len(single_losses) + 1)
    ax.plot(steps, single_losses, lw=6, alpha=0.35, color="black", label="one process, full batch")
    ax.plot(steps, replica_losses, "o-", ms=3, color=COLORS["ring"],
            label=f"{n} ranks, each on 1/{n} of the batch")
    ax.set(xlabel="step", ylabel="loss", title="The same training, split four ways")
    ax.legend()
    fig.tight_layout()
    return fig


def plot_step_timeline(per_rank: list[dict], rungs=("naive", "bucketed")):
    """``per_rank[r][rung]`` = [Bar(what, start, end)] from ``dp_runs.step_timeline``."""
    fig, axes = plt.subplots(len(rungs), 1, figsize=(8, 1.3 + 1.1 * len(per_rank) * len(rungs)),
                             sharex=True, squeeze=False)
    for ax, rung in zip(axes[:, 0], rungs):
        labels = []
        for r, bars in enumerate(per_rank):
            compute_row, comm_row = 2 * r + 1, 2 * r
            for what, a, b in bars[rung]:
                kind = what if what in COLORS else "comm"
                row = comm_row if kind == "comm" else compute_row
                ax.barh(row, (b - a) * 1e3, left=a * 1e3, height=0.7, color=COLORS[kind],
                        edgecolor="white", alpha=0.9 if kind != "comm" else 0.6)
            labels += [f"rank {r} comm", f"rank {r} compute"]
        ax.set_yticks(range(len(labels)), labels)
        title = {"naive": "naive (a): all-reduce after backward",
                 "bucketed": "buckets (d): all-reduce while backward runs"}.get(rung, rung)
        ax.set_title(title, fontsize=10, loc="left")
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLORS[k]) for k in
               ("forward", "backward", "comm", "optimizer")]
    fig.legend(handles, ["forward", "backward", "all-reduce (darker where buckets in flight "
                         "overlap)", "optimizer"], ncol=4, fontsize=8, loc="upper center",
               frameon=False)
    axes[-1, 0].set_xlabel("milliseconds from the start of the step")
    fig.tight_layout(rect=(0, 0, 1, 0.95))            # the legend above, clear of every bar
    return fig


def _points(points, algorithm, **where):
    return [q for q in points[algorithm] if all(q[k] == v for k, v in where.items())]


def plot_allreduce(points: dict, fits: dict, world_size: int = 4, size_bytes: int = 16 * MiB,
                   fresh: dict | None = None):
    """Left: time against size at ``world_size``; right: time against world size at
    ``size_bytes``. ``points[alg]`` = [{"world_size", "size_bytes", "time_s"}] (stored
    sweep, hollow markers), ``fresh`` the same shape (measured just now, filled markers),
    ``fits[alg]`` from ``costmodel.alpha_beta.fit_alpha_beta``, drawn as lines."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    sizes = np.logspace(10, 26, 60, base=2)
    worlds = np.arange(2, 9)
    for alg, fit in fits.items():
        color, label = COLORS[alg], LABELS.get(alg, alg)
        if fit:
            left.plot(sizes / 1024, [predict_from_fit(alg, world_size, s, fit) for s in sizes],
                      color=color, label=label)
            right.plot(worlds, [predict_from_fit(alg, int(n), size_bytes, fit) for n in worlds],
                       color=color)
        for source, filled in ((points, False), (fresh or {}, True)):
            if alg not in source:
                continue
            style = dict(color=color, mfc=color if filled else "none", ls="none", ms=6,
                         marker="o" if filled else "s")
            near = _points(source, alg, world_size=world_size)
            left.plot([q["size_bytes"] / 1024 for q in near], [q["time_s"] for q in near], **style)
            at = _points(source, alg, size_bytes=size_bytes)
            right.plot([q["world_size"] for q in at], [q["time_s"] for q in at], **style)
    left.set(xscale="log", yscale="log", xlabel="message size (KiB)", ylabel="seconds",
             title=f"{world_size} ranks")
    right.set(xlabel="ranks n", ylabel="seconds", title=f"{size_bytes / MiB:g} MiB message")
    left.axvline(size_bytes / 1024, color="grey", lw=0.8, ls=":")
    fig.legend(*left.get_legend_handles_labels(), loc="upper center", ncol=2, fontsize=8,
               frameon=False)                     # one legend: both panels use its colours
    fig.text(0.5, -0.02, "lines: alpha-beta fit; hollow squares: stored sweep; filled circles: "
             "measured in this notebook", ha="center", fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.88))        # the legend above, clear of both panels
    return fig


def busiest_link(ranks: list, size_bytes: int, alg: str) -> int:
    """Bytes through the busiest rank's link in one direction (sent or received, whichever is
    larger), from each rank's ledger totals in an ``allreduce_bench`` result (``BenchRun``)."""
    return max(max(run.bytes_sent, run.bytes_received)
               for run in (r.sizes[size_bytes][alg] for r in ranks))


def plot_busiest_link(runs: dict[int, list], size_bytes: int):
    """Per direction, the busiest link's bytes against n: ledger counts (markers, from
    ``runs[n]`` = each rank's ``allreduce_bench`` result) on the theory (lines): a parameter
    server's link carries (n-1)·S each way, a ring rank's 2(n-1)/n·S, so the ratio is n/2."""
    fig, ax = plt.subplots(figsize=(6, 3.4))
    worlds = np.arange(2, 9)
    theory = {"parameter_server": [parameter_server_bytes(int(n), size_bytes) / 2 for n in worlds],
              "ring": [ring_allreduce_bytes_per_rank(int(n), size_bytes) for n in worlds]}
    for alg, line in theory.items():
        ax.plot(worlds, np.array(line) / MiB, color=COLORS[alg], label=f"{LABELS[alg]}: theory")
        counted = sorted((n, busiest_link(ranks, size_bytes, alg)) for n, ranks in runs.items())
        ax.plot([n for n, _ in counted], [b / MiB for _, b in counted], "o", color=COLORS[alg],
                label=f"{LABELS[alg]}: ledger")
    ax.set(xlabel="ranks n", ylabel="MiB, one direction",
           title=f"busiest link, all-reduce of S = {size_bytes / MiB:g} MiB")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def allreduce_explorer(points: dict, fits: dict, fresh: dict | None = None):
    """Sliders for world size and message size over ``plot_allreduce``, with the
    predicted time of each algorithm at the chosen point."""
    from ipywidgets import FloatLogSlider, IntSlider

    def draw(world_size, size_mib):
        size = int(size_mib * MiB)
        fig = plot_allreduce(points, fits, world_size, size, fresh)
        text = "".join(f"{LABELS.get(alg, alg):38s} predicted "
                       f"{predict_from_fit(alg, world_size, size, fit) * 1e3:9.2f} ms\n"
                       for alg, fit in fits.items() if fit)
        return fig, text

    return explorer(draw, world_size=IntSlider(4, 2, 8, description="ranks"),
                     size_mib=FloatLogSlider(16.0, base=2, min=-10, max=6, step=1,
                                             description="MiB"))


def plot_buckets(grad_bytes: float, world_size: int, bucket_bytes: float, backward_s: float,
                 fit, measured: dict | None = None):
    """Left: the predicted schedule of one step's buckets, with and without overlap, each
    bucket taking the ring time of ``fit``. Right: communication left after backward against
    bucket size; ``measured`` = {bucket_MiB: exposed_s} drawn as markers."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.4),
                                      gridspec_kw={"width_ratios": [1.3, 1]})
    for row, overlap in ((1, True), (0, False)):
        plan = bucketed_step(grad_bytes, world_size, bucket_bytes, backward_s, fit, overlap)
        left.barh(row + 0.2, backward_s * 1e3, height=0.3, color=COLORS["backward"],
                  label="backward's compute" if overlap else None)
        for j, (_, start, end) in enumerate(plan.buckets):
            left.barh(row - 0.2, (end - start) * 1e3, left=start * 1e3, height=0.3,
                      color=COLORS["comm"], alpha=0.5 + 0.5 * (j % 2), edgecolor="white",
                      label="a bucket's all-reduce (shades alternate)" if overlap and not j
                      else None)
        left.text(plan.end_s * 1e3, row, f"  {plan.end_s * 1e3:.0f} ms", va="center")
    left.set_yticks([0, 1], ["naive: after\nbackward", "buckets:\noverlapping"])
    left.set(xlabel="ms from the start of backward", ylim=(-0.6, 2.0),
             title=f"predicted: {world_size} ranks, buckets of {bucket_bytes / MiB:g} MiB",
             xlim=(0, None))
    left.legend(fontsize=8, loc="upper left", ncols=2)
    caps = np.logspace(-4, 7, 45, base=2) * MiB
    exposed = [bucketed_step(grad_bytes, world_size, c, backward_s, fit).exposed_s
               for c in caps]
    right.plot(caps / MiB, np.array(exposed) * 1e3, color=COLORS["comm"], label="predicted")
    if measured:
        right.plot(list(measured), [v * 1e3 for v in measured.values()], "o", color="black",
                   label="measured (this run)")
    right.axvline(bucket_bytes / MiB, color="grey", lw=0.8, ls=":", label="the cap on the left")
    right.set(xscale="log", xlabel="bucket cap (MiB)", ylabel="ms after backward",
              title="communication left after backward")
    right.legend(fontsize=8)
    fig.tight_layout()
    return fig


def bucket_explorer(grad_bytes: float, backward_s: float, fit: dict,
                    measured: dict | None = None, measured_world_size: int = 2):
    """Sliders for world size and bucket size over ``plot_buckets``."""
    from ipywidgets import FloatLogSlider, IntSlider

    def draw(world_size, bucket_mib):
        points = measured if world_size == measured_world_size else None
        return plot_buckets(grad_bytes, world_size, bucket_mib * MiB, backward_s, fit,
                            points), ""

    return explorer(draw, world_size=IntSlider(measured_world_size, 2, 64, description="ranks"),
                     bucket_mib=FloatLogSlider(4.0, base=2, min=-4, max=7, step=1,
                                               description="bucket MiB"))


def plot_ddp_lab(record: dict, sweep: dict | None = None):
    """Median step time per implementation from a ``labs/ddp.py`` record, and scaling
    efficiency from a ``--sweep`` record."""
    fig, axes = plt.subplots(1, 2 if sweep else 1, figsize=(10 if sweep else 5, 3.2),
                             squeeze=False)
    names = list(record["results"])
    times = [record["results"][k]["step_time_s"] * 1e3 for k in names]
    axes[0, 0].barh(names, times, color=[COLORS["ring"], COLORS["naive_ring"], COLORS["torch"],
                                         COLORS["backward"], COLORS["optimizer"]][:len(names)])
    for y, t in enumerate(times):
        axes[0, 0].text(t, y, f" {t:.0f} ms", va="center")
    params = record["settings"]["parameters"] / 1e6
    axes[0, 0].set(xlabel="median step time (ms)",
                   title=f"{record['world_size']} ranks, {params:.1f} M parameters")
    if sweep:
        ax = axes[0, 1]
        for name, res in sweep["results"].items():
            eff = res["scaling_efficiency"]
            ax.plot([int(w) for w in eff], list(eff.values()), "o-", label=name)
        ax.axhline(1.0, color="grey", lw=0.8, ls=":")
        ax.set(xlabel="ranks", ylabel="throughput / (n x one rank's)",
               title="weak-scaling efficiency", ylim=(0, 1.1))
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
