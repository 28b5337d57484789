"""Plots for lesson 01: the memory wall and the time wall, over the pure cost model.

``memory_wall`` stacks weights, gradients, optimizer state and activations of one model
trained on one GPU against each GPU's capacity; ``time_wall`` shows training days against
the number of GPUs. The ``*_widget`` functions put sliders over the same plots.

Laptop and GPU box alike: ``from lessonlib.viz import scale; scale.memory_wall("gpt3-175B")``
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from lessonlib.costmodel import (GPT, GPUS, MODELS, SECONDS_PER_DAY, memory_per_gpu,
                                 training_flops, training_time_s)
from lessonlib.viz.widgets import current_figure, explorer

PARTS = ("weights", "gradients", "optimizer", "activations")
COLORS = {"weights": "#4c72b0", "gradients": "#dd8452", "optimizer": "#55a868",
          "activations": "#c44e52"}
MODEL_PRESETS = ("gpt2-small", "gpt2-xl", "megatron-7.5B", "megatron-39.1B", "gpt3-175B",
                 "megatron-1T")


def one_gpu_memory(model: GPT, b: int = 1, recompute: str = "none") -> dict:
    """Bytes to train ``model`` on a single GPU (no parallelism), by part."""
    return memory_per_gpu(model, b=b, recompute=recompute).as_dict()


def memory_wall(model: GPT | str = "gpt3-175B", b: int = 1, recompute: str = "none", ax=None):
    """A stacked bar of one model's training memory, with every GPU's capacity drawn across."""
    model = MODELS[model] if isinstance(model, str) else model
    parts = one_gpu_memory(model, b, recompute)
    ax = ax or plt.subplots(figsize=(6.5, 4))[1]
    bottom = 0.0
    for part in PARTS:
        ax.bar(0, parts[part] / 1e9, bottom=bottom / 1e9, width=0.5, color=COLORS[part],
               label=f"{part}: {parts[part] / 1e9:,.0f} GB")
        bottom += parts[part]
    for gpu in GPUS.values():
        ax.axhline(gpu.memory_bytes / 1e9, color="black", lw=0.8, ls="--")
        ax.text(0.3, gpu.memory_bytes / 1e9, f"{gpu.name} ({gpu.memory_bytes / 1e9:.0f} GB)",
                va="bottom", fontsize=8)
    ax.set_yscale("log")
    ax.set_ylim(1, max(bottom / 1e9 * 2, 300))
    ax.set_xlim(-0.5, 1.4)
    ax.set_xticks([])
    ax.set_ylabel("GB needed on one GPU (log scale)")
    ax.set_title(f"{model.name or 'model'}: {model.params() / 1e9:.2f} B parameters, "
                 f"b={b}, recompute={recompute}", fontsize=10)
    ax.legend(loc="upper left", fontsize=8)
    return ax


def time_wall(params: float = 175e9, tokens: float = 300e9, gpu: str = "V100-SXM2-32GB",
              efficiency: float = 0.3, n_gpus: int = 1, ax=None):
    """Training days against GPU count (6PD FLOPs at ``efficiency`` x peak), one point marked."""
    rate = GPUS[gpu].peak_flops * efficiency
    flops = training_flops(params, tokens)
    counts = np.logspace(0, 4.5, 60)
    days = [training_time_s(flops, n, rate) / SECONDS_PER_DAY for n in counts]
    here = training_time_s(flops, n_gpus, rate) / SECONDS_PER_DAY
    ax = ax or plt.subplots(figsize=(6.5, 4))[1]
    ax.loglog(counts, days, color="#4c72b0")
    ax.plot([n_gpus], [here], "o", color="#c44e52",
            label=f"{n_gpus:,} x {gpu}: {here:,.0f} days ({here / 365.25:,.1f} years)")
    ax.axhline(30, color="grey", ls=":", lw=0.8)
    ax.text(1.2, 33, "one month", fontsize=8, color="grey")
    ax.set_xlabel("GPUs (perfect scaling)")
    ax.set_ylabel("training days")
    ax.set_title(f"{params / 1e9:.0f} B parameters, {tokens / 1e9:.0f} B tokens, "
                 f"{rate / 1e12:.0f} TFLOP/s per GPU", fontsize=10)
    ax.legend(fontsize=8)
    return ax


def memory_widget():
    """Model preset (or custom L, h), micro-batch and recompute -> the memory wall."""
    import ipywidgets as w

    def draw(preset, layers, hidden, b, recompute):
        model = MODELS[preset] if preset != "custom" else GPT(layers, hidden, max(1, hidden // 128),
                                                              2048, 51200, "custom")
        return memory_wall(model, b, recompute)

    return explorer(current_figure(draw),
                    preset=w.Dropdown(options=[*MODEL_PRESETS, "custom"], value="gpt3-175B"),
                    layers=w.IntSlider(value=24, min=2, max=128, step=2),
                    hidden=w.IntSlider(value=2048, min=256, max=25600, step=256),
                    b=w.IntSlider(value=1, min=1, max=16),
                    recompute=w.Dropdown(options=["none", "selective", "full"]))


def time_widget():
    """Parameters, tokens, GPU type, GPU count and efficiency -> the time wall."""
    import ipywidgets as w

    def draw(params_billion, tokens_billion, gpu, n_gpus, efficiency):
        return time_wall(params_billion * 1e9, tokens_billion * 1e9, gpu, efficiency, n_gpus)

    return explorer(current_figure(draw),
                    params_billion=w.FloatLogSlider(value=175, base=10, min=-1, max=3.2),
                    tokens_billion=w.FloatLogSlider(value=300, base=10, min=0, max=4),
                    gpu=w.Dropdown(options=list(GPUS), value="V100-SXM2-32GB"),
                    n_gpus=w.IntText(value=1),
                    efficiency=w.FloatSlider(value=0.3, min=0.05, max=0.8, step=0.05))
