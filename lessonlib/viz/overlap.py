"""Plots for the overlap lesson: one measured step of each variant, communication against time.

``exposed_timelines`` draws, for each variant (plain SP, async TP, FSDP without and with
prefetch), one rank's last timed step as one row: the step as a pale bar, each call's time in
flight (posted to closed, from the ledger's ``timeline``) as a thin grey bar, and each
stretch the rank stood still for communication ("EXPOSED") as a red bar on top. What overlap
buys is the red that is gone; the grey may grow (a transfer cut in pieces is in flight
longer), and that costs nothing while the rank computes beside it.

Laptop and GPU box alike:
``from lessonlib.viz import overlap as ov; ov.exposed_timelines(report.variants)``
"""
from __future__ import annotations

import matplotlib.pyplot as plt

COLORS = {"STEP": "#dde6f3", "COMM": "#9a9a9a", "EXPOSED": "#c44e52"}
LABELS = {"STEP": "the step", "COMM": "communication in flight",
          "EXPOSED": "communication exposed (the rank waits)"}


def exposed_timelines(variants: dict, rank: int = 0, ax=None, names: dict | None = None):
    """One row per variant (``async_tp_runs.Variant``: ``spans`` by rank), top to bottom in
    the dict's order; ``names`` relabels the rows. Times in milliseconds."""
    rows = list(variants)
    ax = ax or plt.subplots(figsize=(10, 0.8 + 0.55 * len(rows)), constrained_layout=True)[1]
    end = 0.0
    for i, name in enumerate(rows):
        y = len(rows) - 1 - i
        for span in variants[name].spans[rank]:
            height = {"STEP": 0.8, "COMM": 0.25, "EXPOSED": 0.5}[span.kind]
            ax.barh(y, (span.end - span.start) * 1e3, left=span.start * 1e3, height=height,
                    color=COLORS[span.kind], zorder={"STEP": 0, "COMM": 1, "EXPOSED": 2}[
                        span.kind])
            end = max(end, span.end)
    ax.set_yticks(range(len(rows)), [(names or {}).get(n, n) for n in reversed(rows)])
    ax.set_xlim(0, end * 1e3 * 1.02)
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.set_xlabel(f"ms since the step began (rank {rank}, its last timed step)")
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=COLORS[k]) for k in COLORS],
              labels=[LABELS[k] for k in COLORS], loc="upper center",
              bbox_to_anchor=(0.5, -0.35 if len(rows) < 4 else -0.22), ncol=3, fontsize=8)
    return ax
