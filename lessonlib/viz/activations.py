"""Where a layer's activations go: activation memory per GPU against sequence length, for
each way of keeping them (Korthikanti et al. 2022), over the pure cost model.

``activation_plot`` draws two panels. Left, any preset: the bytes all L layers keep for
backward on one GPU of a t-way tensor-parallel group (one micro-batch of b sequences, no
pipeline), from Table 2's formulas, against s: no parallelism, TP, TP+SP, TP + selective,
TP+SP + selective, full recompute. Its axes are log-log, so a term in s is a line of slope
1 and the attention term in s² bends a curve up to slope 2. Right, the course's own tiny
layer: the exact formula (``course_layer_activation_bytes``) for the same modes, with the
bytes measured on real ranks drawn as points on the same axes. Selective recompute is
dashed in both panels, since its lines run close to those of the same mode without it.
``activation_widget`` puts a preset, t and b over it.

Laptop and GPU box alike:
``from lessonlib.viz import activations; activations.activation_plot("gpt3-175B", t=8)``
"""
from __future__ import annotations

from dataclasses import replace

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.lines import Line2D

from lessonlib.costmodel import MODELS
from lessonlib.costmodel.memory import activation_bytes_per_layer, course_layer_activation_bytes

MODES = {  # label: (tensor-parallel size used: 1 or t, sequence_parallel, recompute)
    "no parallelism": (False, False, "none"),
    "TP": (True, False, "none"),
    "TP+SP": (True, True, "none"),
    "TP + selective": (True, False, "selective"),
    "TP+SP + selective": (True, True, "selective"),
    "full recompute": (True, False, "full"),
}
COLORS = dict(zip(MODES, ("#333333", "#4c72b0", "#55a868", "#dd8452", "#c44e52", "#8172b3")))
STYLES = {label: "--" if recompute == "selective" else "-"
          for label, (_, _, recompute) in MODES.items()}
# the course's measured modes (``sequence_runs.MODES`` names) under the labels above
MEASURED_AS = {"dense": "no parallelism", "tp": "TP", "tp+sp": "TP+SP",
               "tp+selective": "TP + selective", "tp+sp+selective": "TP+SP + selective",
               "full": "full recompute"}


def preset_curves(model, t: int, b: int, seqs) -> dict:
    """{label: GB per GPU for each s in ``seqs``}: L layers' activations, one micro-batch."""
    model = MODELS[model] if isinstance(model, str) else model
    return {label: [activation_bytes_per_layer(replace(model, s=int(s)), b,
                                               t if split else 1, sp, recompute)
                    * model.L / 1e9 for s in seqs]
            for label, (split, sp, recompute) in MODES.items()}


def tiny_curves(b: int, h: int, a: int, t: int, element_size: int, seqs) -> dict:
    """{label: bytes per rank for each s}: the course layer's exact formula."""
    return {label: [course_layer_activation_bytes(b, int(s), h, a, t if split else 1, sp,
                                                  recompute, element_size) for s in seqs]
            for label, (split, sp, recompute) in MODES.items()}


def activation_plot(model="gpt3-175B", t: int = 8, b: int = 1, measured=None, axes=None):
    """The two panels; ``measured``: {"b", "h", "a", "t", "element_size", "points": [(mode,
    s, bytes)]} from ``sequence_runs.activation_report`` at a few s (None: left panel only
    beside the tiny formula at t = 2)."""
    model = MODELS[model] if isinstance(model, str) else model
    if axes is None:
        axes = plt.subplots(1, 2, figsize=(11, 4))[1]
    left, right = axes
    seqs = np.geomspace(512, 16384, 32)
    for label, gb in preset_curves(model, t, b, seqs).items():
        left.plot(seqs, gb, STYLES[label], color=COLORS[label], label=label)
    left.set_xscale("log")
    left.set_yscale("log")
    left.set_xticks([512, 1024, 2048, 4096, 8192, 16384], ["512", "1k", "2k", "4k", "8k", "16k"])
    left.minorticks_off()
    left.set_xlabel("sequence length s (log)")
    left.set_ylabel("GB per GPU (L layers, one micro-batch; log)")
    left.set_title(f"{model.name or 'model'}: t={t}, b={b} (Korthikanti Table 2)", fontsize=10)
    left.legend(fontsize=7)
    shape = measured or {"b": 2, "h": 32, "a": 4, "t": 2, "element_size": 8, "points": []}
    small = np.arange(4, 65, 4)
    curves = tiny_curves(shape["b"], shape["h"], shape["a"], shape["t"],
                         shape["element_size"], small)
    for label, kb in curves.items():
        right.plot(small, np.array(kb) / 1e3, STYLES[label], color=COLORS[label], label=label)
    for mode, s, kept in shape["points"]:
        right.plot([s], [kept / 1e3], "o", color=COLORS[MEASURED_AS[mode]], ms=5)
    dots = Line2D([], [], marker="o", ls="", color="#777777", label="measured on ranks")
    right.legend(handles=[*right.get_legend_handles_labels()[0], dots], fontsize=7)
    right.set_xlabel("sequence length s")
    right.set_ylabel("kB per rank (one layer)")
    right.set_title(f"course layer: b={shape['b']}, h={shape['h']}, a={shape['a']}, "
                    f"t={shape['t']}; lines formula, dots measured", fontsize=10)
    return left.figure


def activation_widget(measured=None):
    """Preset, t and b -> ``activation_plot`` (the measured tiny points stay as given)."""
    import ipywidgets as w

    from lessonlib.viz.widgets import current_figure, explorer

    def draw(preset, t, b):
        return activation_plot(preset, t, b, measured)

    return explorer(current_figure(draw),
                    preset=w.Dropdown(options=list(MODELS), value="gpt3-175B"),
                    t=w.Dropdown(options=[1, 2, 4, 8], value=8),
                    b=w.IntSlider(value=1, min=1, max=8))
