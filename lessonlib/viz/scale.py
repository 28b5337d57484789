"""Plots for lesson 01: the memory wall and the time wall, over the pure cost model.

``memory_wall`` puts weights, gradients, optimizer state and activations of one model
trained on one GPU side by side with each GPU's capacity, on a linear axis; ``time_wall``
shows training days against the number of GPUs. The ``*_widget`` functions put sliders
over the same plots.

Laptop and GPU box alike: ``from lessonlib.viz import scale; scale.memory_wall("gpt3-175B")``
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from lessonlib.costmodel import (GPT, GPUS, MODELS, SECONDS_PER_DAY, usable_memory_bytes,
                                 memory_per_gpu, training_flops, training_time_s)
from lessonlib.viz.widgets import current_figure, explorer

PARTS = ("weights", "gradients", "optimizer", "activations", "logits", "working")
COLORS = {"weights": "#4c72b0", "gradients": "#dd8452", "optimizer": "#55a868",
          "activations": "#c44e52", "logits": "#8172b3", "working": "#937860"}
MODEL_PRESETS = ("gpt2-small", "gpt2-xl", "megatron-7.5B", "megatron-39.1B", "gpt3-175B",
                 "megatron-1T")


def one_gpu_memory(model: GPT, b: int = 1, recompute: str = "none") -> dict:
    """Bytes to train ``model`` on a single GPU (no parallelism), by part."""
    return memory_per_gpu(model, b=b, recompute=recompute).as_dict()


def gpu_capacities() -> dict[float, str]:
    """GB -> the GPUs with that memory (to the GB), one entry per size (A100-80GB and H100
    share 86 GB: 80 GiB, 81,920 and 81,559 MiB)."""
    sizes: dict[float, list[str]] = {}
    for gpu in GPUS.values():
        sizes.setdefault(round(gpu.memory_bytes / 1e9), []).append(gpu.name)
    return {gb: " = ".join(names) for gb, names in sorted(sizes.items())}


def memory_wall(model: GPT | str = "gpt3-175B", b: int = 1, recompute: str = "none", ax=None):
    """Side-by-side bars on a linear axis: each part of one model's training memory, their
    total, and each GPU size. Lengths are true sizes (a log axis would make the 2.1 TB of Adam
    state look barely longer than the weights). A GPU's label gives the share a training job
    can use (``usable_memory_bytes``: less the CUDA context and NCCL's buffers), and the verdict compares the total with that
    share of the largest GPU."""
    model = MODELS[model] if isinstance(model, str) else model
    parts = one_gpu_memory(model, b, recompute)
    total = sum(parts[part] for part in PARTS)
    rows = [(f"{part}", parts[part] / 1e9, COLORS[part]) for part in PARTS]
    rows.append(("total on one GPU", total / 1e9, "#333333"))
    gpus = [(name, gb, "#bbbbbb") for gb, name in gpu_capacities().items()]
    ax = ax or plt.subplots(figsize=(6.5, 4))[1]
    y = np.arange(len(rows) + len(gpus))[::-1]
    ax.barh(y, [gb for _, gb, _ in rows + gpus], color=[color for *_, color in rows + gpus])
    for row, (_, gb, _) in zip(y, rows):
        ax.text(gb, row, f" {gb:,.0f} GB" if gb >= 10 else f" {gb:.2g} GB", va="center",
                fontsize=8)
    usable_gb = {round(g.memory_bytes / 1e9): usable_memory_bytes(g) / 1e9 for g in GPUS.values()}
    for row, (_, gb, _) in zip(y[len(rows):], gpus):
        ax.text(gb, row, f" {gb:,.0f} GB, {usable_gb[gb]:,.0f} usable", va="center", fontsize=8)
    ax.set_yticks(y, [label for label, *_ in rows + gpus], fontsize=8)
    ax.set_xlim(0, max(gb for _, gb, _ in rows + gpus) * 1.25)
    ax.set_xlabel("GB (linear scale: bar lengths are true sizes)")
    largest = max(GPUS.values(), key=lambda g: g.memory_bytes)
    usable = usable_memory_bytes(largest)
    verdict = (f"total = {total / usable:,.1f}x the {usable / 1e9:,.0f} GB usable on the largest "
               f"GPU ({largest.name})" if total > usable else "fits on one GPU")
    ax.set_title(f"{model.name or 'model'}: {model.params() / 1e9:.2f} B parameters, b={b}, "
                 f"recompute={recompute}\n{verdict}", fontsize=10)
    return ax


def time_wall(params: float = 175e9, tokens: float = 300e9, gpu: str = "V100-SXM2-32GB",
              efficiency: float = 0.3, n_gpus: int = 1, ax=None):
    """Training days against GPU count (6PD FLOPs at ``efficiency`` x peak), one point marked;
    the title states the inputs exactly as used and the marked point's time."""
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
    ax.set_title(f"{params / 1e9:g} B parameters, {tokens / 1e9:g} B tokens, {rate / 1e12:.1f} "
                 f"TFLOP/s per GPU ({efficiency:.1%} of peak)\n{n_gpus:,} x {gpu}: "
                 f"{_duration(here)}", fontsize=10)
    ax.legend(fontsize=8)
    return ax


def _duration(days: float) -> str:
    return f"{days / 365.25:,.0f} years" if days >= 2 * 365.25 else f"{days:,.0f} days"


def choices(start: float, low: float, high: float, label, steps=(1, 2, 5)) -> list:
    """(label, value) options from ``low`` to ``high`` on a 1-2-5 grid (``steps`` per decade),
    with ``start`` among them exactly: a slider over them starts on ``start`` itself, where a
    log slider's step would move it (175 B on FloatLogSlider's 0.1 steps is 158.5 B)."""
    decades = range(int(np.floor(np.log10(low))), int(np.ceil(np.log10(high))) + 1)
    grid = {float(f"{m}e{k}") for k in decades for m in steps}
    values = sorted({v for v in grid if low <= v <= high} | {start})
    return [(label(v), v) for v in values]


def time_widget(efficiency: float = 0.3, params_billion: float = 175,
                tokens_billion: float = 300):
    """Parameters, tokens, GPU type, GPU count and efficiency -> the time wall. It starts on
    exactly the values it is given (by default 175 B parameters, 300 B tokens and 30 % of
    peak, about what Megatron-LM 2019 measured on one V100, 39 TFLOP/s): each slider's
    options contain its start. The plot's title, printed below it too, states the values
    used and the time."""
    import ipywidgets as w

    def draw(params_billion, tokens_billion, gpu, n_gpus, efficiency):
        ax = time_wall(params_billion * 1e9, tokens_billion * 1e9, gpu, efficiency, n_gpus)
        return ax.figure, ax.get_title().replace("\n", ": ") + "\n"

    percent = [(f"{v:.1%}", v) for v in sorted({k / 100 for k in range(5, 81)} | {efficiency})]
    return explorer(draw,
                    params_billion=w.SelectionSlider(
                        options=choices(params_billion, 0.1, 2000, lambda v: f"{v:g} B"),
                        value=params_billion),
                    tokens_billion=w.SelectionSlider(
                        options=choices(tokens_billion, 1, 20000, lambda v: f"{v:g} B"),
                        value=tokens_billion),
                    gpu=w.Dropdown(options=list(GPUS), value="V100-SXM2-32GB"),
                    n_gpus=w.IntText(value=1),
                    efficiency=w.SelectionSlider(options=percent, value=efficiency))


def memory_widget():
    """Model preset (or custom L, h), micro-batch and recompute -> the memory wall. A preset
    fixes L and h: the sliders show its values, greyed out, until the preset is "custom"."""
    import ipywidgets as w

    def draw(preset, layers, hidden, b, recompute):
        # Heads of 64 dims, as GPT-2 and GPT-3 use; the slider's step of 64 keeps h divisible.
        model = MODELS[preset] if preset != "custom" else GPT(layers, hidden, hidden // 64,
                                                              2048, 51200, "custom")
        return memory_wall(model, b, recompute)

    preset = w.Dropdown(options=[*MODEL_PRESETS, "custom"], value="gpt3-175B")
    layers = w.IntSlider(min=2, max=128, step=2, description="layers L")
    hidden = w.IntSlider(min=256, max=25600, step=64, description="hidden h")

    def follow(_=None):
        if preset.value != "custom":
            layers.value, hidden.value = MODELS[preset.value].L, MODELS[preset.value].h
        layers.disabled = hidden.disabled = preset.value != "custom"

    preset.observe(follow, names="value")
    follow()
    return explorer(current_figure(draw), preset=preset, layers=layers, hidden=hidden,
                    b=w.IntSlider(value=1, min=1, max=16),
                    recompute=w.Dropdown(options=["none", "selective", "full"]))
