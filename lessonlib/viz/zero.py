"""Plots for sharding the replica (ZeRO, FSDP): what each rank holds, by stage, and its price.

``held_bars`` draws, for ZeRO stages 0-3, the bytes one rank held after a real step (its
shard of the weights, the full weights it had gathered at that moment, gradients,
optimizer state) next to ZeRO's per-stage formula with this run's bytes per value.
``predicted_gb`` is the same formula for a real model in mixed precision (16 bytes per
parameter: Rajbhandari et al. 2020, §3.1). ``sharding_widget`` is live: its slider sets d,
the ranks train the tiny GPT at every stage, and the bars are redrawn from what they held.

Laptop and GPU box alike: ``from lessonlib.viz import zero; zero.sharding_widget()``
"""
from __future__ import annotations

import ipywidgets as w
import matplotlib.pyplot as plt

from lessonlib import launcher
from lessonlib.costmodel.memory import model_state_bytes
from lessonlib.data_parallel import zero_runs
from lessonlib.data_parallel.sharded import ring_bytes_per_rank
from lessonlib.models import SHARDING_CONFIG
from lessonlib.viz.live import live_explorer

STAGES = ("0", "1", "2", "3")
PARTS = (("weights", "weights (this rank's)", "#4c72b0"),
         ("gathered", "weights gathered from the others", "#8fb0d8"),
         ("gradients", "gradients", "#dd8452"),
         ("optimizer", "optimizer state", "#55a868"))


def measure_stages(d: int, steps: int = 2) -> dict:
    """Train the tiny GPT ``steps`` AdamW steps at every stage on d ranks (float32): what
    rank 0 held after the last step and what that step sent, with the formula's numbers."""
    cases = [dict(stage=s, steps=steps, dtype="float32", global_batch=12)   # 12: d = 1..4
             for s in STAGES]
    per_rank = launcher.launch(zero_runs.train_cases, d, cases)
    out = {}
    for i, stage in enumerate(STAGES):
        run = per_rank[0][i]
        want = zero_runs.predicted(stage, SHARDING_CONFIG, d)
        out[stage] = {"held": {k: run.held.get(k, 0) for k, _, _ in PARTS},
                      "formula": want["bytes_held"],
                      "sent": ring_bytes_per_rank(run.ledgers[-1], d) if d > 1 else 0.0,
                      "sent_formula": want["bytes_sent_per_rank"] if d > 1 else 0.0}
    return out


def held_bars(result: dict, d: int, ax=None):
    """Stacked bars per stage: measured (left of each pair) and ZeRO's formula (right)."""
    ax = ax or plt.subplots(figsize=(8, 3.4), constrained_layout=True)[1]
    for i, stage in enumerate(STAGES):
        for x, held, hatch in ((i - 0.2, result[stage]["held"], ""),
                               (i + 0.2, result[stage]["formula"], "//")):
            bottom = 0.0
            for key, label, color in PARTS:
                value = held.get(key, 0) / 1024
                ax.bar(x, value, 0.38, bottom=bottom, color=color, hatch=hatch,
                       edgecolor="white", label=label if (i, hatch) == (0, "") else None)
                bottom += value
    ax.set_xticks(range(len(STAGES)), [f"stage {s}\nmeasured | formula" for s in STAGES],
                  fontsize=8)
    ax.set_ylabel("KiB held per rank")
    ax.set_title(f"d = {d} ranks, the tiny GPT in float32 with AdamW", fontsize=10)
    ax.legend(fontsize=7, loc="upper right")
    return ax


def draw_stages(result: dict, d: int):
    fig, ax = plt.subplots(figsize=(8, 3.4), constrained_layout=True)
    held_bars(result, d, ax)
    sent = ", ".join(f"stage {s} {result[s]['sent'] / 1024:.1f} (formula "
                     f"{result[s]['sent_formula'] / 1024:.1f})" for s in STAGES)
    return fig, f"KiB one rank sent in one step: {sent}\n"


def sharding_widget(d: int = 2):
    """Live: ZeRO stages 0-3 on d real ranks, bytes held by one rank against the formula."""
    return live_explorer(measure_stages, draw_stages, d=w.IntSlider(d, 1, 4, description="d"))


def predicted_gb(n_params: float, d: int) -> dict[str, dict[str, float]]:
    """GB per GPU of weights, gradients and Adam state in mixed precision, by ZeRO stage."""
    return {stage: dict(zip(("weights", "gradients", "optimizer"),
                            (b / 1e9 for b in model_state_bytes(n_params, int(stage), d))))
            for stage in STAGES}
