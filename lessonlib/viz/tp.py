"""Plots for model parallelism (notebook 03) and tensor parallelism (notebooks 04 and 14).

What it teaches, one picture each:

* ``draw_weight_split``: which rank holds which block of the MLP's A (split by columns) and
  B (split by rows), and of attention's heads, with the operators f and g where they sit;
* ``plot_tp_scaling``: per-rank weight memory and communication per layer against the TP
  degree t, predicted (lines) and measured (markers);
* ``plot_link_times``: the same layer's all-reduce time over NVLink and over InfiniBand;
* ``plot_assembly_line``: the naive model-parallel timeline, one row per rank: only one rank
  works at a time; ``plot_stage_memory``: what each stage holds;
* ``plot_lab``: lessonlib's TP against PyTorch's DTensor TP from a ``labs/tp.py`` record.

Widgets are ``interact`` over these functions (``weight_split_widget``). Plots only draw:
every number comes from the caller.

Laptop:  ``python -c "from lessonlib.viz import tp; tp.draw_weight_split(4).savefig('split.png')"``
GPU box: the same.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from lessonlib.viz.widgets import current_figure, explorer

RANK_COLORS = plt.get_cmap("tab10").colors
SPAN_STYLE = {"F": ("#4C72B0", "forward"), "B": ("#DD8452", "backward"),
              "OPT": ("#8C8C8C", "optimizer step"), "RECV_F": ("#F2D0D0", "waiting"),
              "RECV_B": ("#F2D0D0", None), "SEND_F": ("#B39BC8", "sending"),
              "SEND_B": ("#B39BC8", None)}


def _matrix(ax, x, y, w, h, t, split, label):
    """A w x h matrix at (x, y) cut into t blocks along ``split`` ("cols" or "rows")."""
    for r in range(t):
        if split == "cols":
            box = (x + r * w / t, y, w / t, h)
        else:
            box = (x, y + (t - 1 - r) * h / t, w, h / t)
        ax.add_patch(Rectangle(box[:2], box[2], box[3], facecolor=RANK_COLORS[r % 10],
                               alpha=0.75, edgecolor="black"))
        ax.text(box[0] + box[2] / 2, box[1] + box[3] / 2, f"r{r}", ha="center", va="center",
                fontsize=8 if t <= 4 else 6)
    ax.text(x + w / 2, y + h + 0.25, label, ha="center", fontsize=9)


def draw_weight_split(t: int = 2, heads: int = 8):
    """The MLP (A by columns, B by rows) and attention (heads) split over t ranks."""
    if t < 1 or heads % t:
        raise ValueError(f"t={t} must be a positive divisor of heads={heads}")
    fig, (mlp, attn) = plt.subplots(1, 2, figsize=(11, 3.4), gridspec_kw={"width_ratios": [3, 2]})
    mlp.text(0.3, 1.5, "X\n(b,s,h)\nevery rank", ha="center", va="center", fontsize=9)
    mlp.text(1.25, 1.5, "f", ha="center", va="center", fontsize=15, color="crimson")
    _matrix(mlp, 1.8, 0.5, 4.0, 2.0, t, "cols", "A: h x 4h, split by columns")
    mlp.text(6.3, 1.5, "GeLU\nper slice", ha="center", va="center", fontsize=9)
    _matrix(mlp, 7.0, 0.0, 2.0, 3.0, t, "rows", "B: 4h x h, split by rows")
    mlp.text(9.5, 1.5, "g", ha="center", va="center", fontsize=15, color="crimson")
    mlp.text(10.3, 1.5, "Z\n(b,s,h)\nevery rank", ha="center", va="center", fontsize=9)
    mlp.set_title(f"MLP at t={t}: f = identity fwd / all-reduce bwd, "
                  f"g = all-reduce fwd / identity bwd", fontsize=10)
    mlp.set_xlim(-0.2, 11)
    mlp.set_ylim(-0.3, 3.6)
    for i, name in enumerate("QKV"):
        for a in range(heads):
            r = a // (heads // t)
            attn.add_patch(Rectangle((a, 2 - i), 1, 0.8, facecolor=RANK_COLORS[r % 10],
                                     alpha=0.75, edgecolor="black"))
        attn.text(-0.6, 2.4 - i, name, ha="center", va="center")
    attn.text(heads / 2, -0.5, "heads (columns of Q, K, V); the output projection "
              "is split by the same rows", ha="center", fontsize=8)
    attn.set_title(f"attention: {heads // t} of {heads} heads per rank", fontsize=10)
    attn.set_xlim(-1.2, heads + 0.2)
    attn.set_ylim(-0.9, 3.1)
    for ax in (mlp, attn):
        ax.axis("off")
    fig.tight_layout()
    return fig


def plot_tp_scaling(rows: list[dict]):
    """rows: {"t", "param_bytes", "param_bytes_predicted", "comm_bytes",
    "comm_bytes_predicted"} per TP degree (per rank, one layer, one micro-batch)."""
    ts = [r["t"] for r in rows]
    fig, (mem, com) = plt.subplots(1, 2, figsize=(10, 3.4))
    for ax, key, title in ((mem, "param_bytes", "weight memory per rank, one layer"),
                           (com, "comm_bytes", "bytes sent per rank, one layer fwd+bwd:\n"
                                               "8bsh(t-1)/t values (Megatron-LM 2021 §3.2)")):
        ax.plot(ts, [r[f"{key}_predicted"] / 1024 for r in rows], "-", color="gray",
                label="predicted")
        ax.plot(ts, [r[key] / 1024 for r in rows], "o", color="crimson", label="measured")
        ax.set_xticks(ts)
        ax.set_xlabel("tensor-parallel degree t")
        ax.set_ylabel("KiB")
        ax.set_title(title, fontsize=10)
        ax.legend()
    fig.tight_layout()
    return fig


def plot_link_times(rows: list[dict]):
    """rows: {"t", "nvlink_s", "infiniband_s", "compute_s"}: one layer's TP communication
    time per micro-batch over each link, and the layer's compute on one of the t GPUs."""
    xs = list(range(len(rows)))
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    width = 0.38
    ax.bar([x - width / 2 for x in xs], [r["nvlink_s"] * 1e3 for r in rows], width,
           label="TP all-reduces over NVLink (inside a server)", color="#55A868")
    ax.bar([x + width / 2 for x in xs], [r["infiniband_s"] * 1e3 for r in rows], width,
           label="TP all-reduces over InfiniBand (across servers)", color="#C44E52")
    ax.plot(xs, [r["compute_s"] * 1e3 for r in rows], "k_", markersize=30, mew=2,
            label="the layer's compute per GPU (fwd+bwd at peak)")
    ax.set_xticks(xs, [str(r["t"]) for r in rows])
    ax.set_xlabel("tensor-parallel degree t")
    ax.set_ylabel("ms per layer per micro-batch")
    top = max(max(r["infiniband_s"], r["compute_s"]) for r in rows) * 1e3
    ax.set_ylim(0, top * 1.45)                   # room for the legend above the bars
    ax.legend(fontsize=7, loc="upper right", markerscale=0.4)   # the wide marker, shrunk
    ax.set_title("one layer: communication against computation (alpha-beta cost model)",
                 fontsize=10)
    fig.tight_layout()
    return fig


def plot_assembly_line(results: list[dict], title: str = ""):
    """Each rank's timeline (from ``model_parallel.assembly_line``), one row per stage."""
    line = [r for r in results if r.rank < results[0].p]
    fig, ax = plt.subplots(figsize=(11, 1.2 + 0.5 * len(line)))
    seen = set()
    for r in line:
        y = len(line) - 1 - r.stage
        for s in r.timeline:
            color, label = SPAN_STYLE[s.kind]
            label = label if label and label not in seen else None
            seen.add(label)
            ax.barh(y, (s.end - s.start) * 1e3, left=s.start * 1e3, height=0.7, color=color,
                    edgecolor="none", label=label)
    ax.set_yticks(range(len(line)), [f"rank {r.rank} (stage {r.stage})"
                                     for r in reversed(line)])
    ax.set_xlabel("ms since the ranks lined up")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(title or "naive model parallelism: one rank works at a time", fontsize=10)
    fig.tight_layout()
    return fig


def plot_stage_memory(rows: list[dict], predicted_param_bytes: list[float] | None = None):
    """rows from ``model_parallel.summarize``: parameter and activation bytes per stage."""
    xs = range(len(rows))
    fig, ax = plt.subplots(figsize=(9, 3.2))
    ax.bar([x - 0.2 for x in xs], [r.param_bytes / 1024 for r in rows], 0.4,
           label="parameters (measured)", color="#4C72B0")
    ax.bar([x + 0.2 for x in xs], [r.stash_bytes / 1024 for r in rows], 0.4,
           label="activations kept for backward (measured)", color="#DD8452")
    if predicted_param_bytes is not None:
        ax.plot([x - 0.2 for x in xs], [b / 1024 for b in predicted_param_bytes], "k_",
                markersize=22, mew=2, label="parameters (predicted)")
    ax.set_xticks(list(xs), [f"stage {r.stage}" for r in rows])
    ax.set_ylabel("KiB per rank")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title("what each room of the castle holds", fontsize=10)
    fig.tight_layout()
    return fig


def plot_lab(record: dict):
    """Step time and bytes of lessonlib's TP vs DTensor's from a ``labs/tp.py`` record."""
    res = record["results"]
    names = [n for n in ("lessonlib", "torch") if n in res]
    layers = sorted(res[names[0]]["layers"])
    fig, (tim, byt) = plt.subplots(1, 2, figsize=(10, 3.2))
    for i, name in enumerate(names):
        label = "lessonlib f/g" if name == "lessonlib" else "DTensor (PyTorch)"
        xs = [j + (i - 0.5) * 0.38 for j in range(len(layers))]
        rows = [res[name]["layers"][k] for k in layers]
        tim.bar(xs, [r["step_time_s"] * 1e3 for r in rows], 0.38, label=label)
        byt.bar(xs, [r["comm_bytes"] / 1024 for r in rows], 0.38, label=label)
    for ax, unit in ((tim, "median fwd+bwd ms"), (byt, "KiB all-reduced per step")):
        ax.set_xticks(range(len(layers)), layers)
        ax.set_ylabel(unit)
        ax.legend(fontsize=8)
    cfg = record["settings"]
    fig.suptitle(f"labs/tp.py on {record['world_size']} {record['device']} ranks (t = "
                 f"{record['world_size']}): b={cfg['batch']}, s={cfg['seq']}, h={cfg['hidden']}, "
                 f"a={cfg['heads']}, median of {cfg['steps']} steps", fontsize=9)
    fig.tight_layout()
    return fig


def weight_split_widget(heads: int = 8):
    """Pick t to see which rank holds which block."""
    import ipywidgets as w

    draw = current_figure(lambda t: draw_weight_split(t, heads))
    return explorer(draw, t=w.Dropdown(options=[d for d in (1, 2, 4, 8) if heads % d == 0],
                                       value=2))


def plot_layer_split(model: str = "gpt3-175B", p: int = 48, gpu: str = "A100-80GB"):
    """Predicted memory per GPU and idle share when ``model``'s layers are cut over p GPUs
    with one batch in flight (the cost model; the idle share is (p-1)/p). The dashed line is
    the memory a job can use, the GPU's less the named reserves (``usable_memory_bytes``)."""
    from lessonlib import costmodel as cm

    spec = cm.MODELS[model]
    capacity = cm.usable_memory_bytes(cm.get_gpu(gpu))
    ps = [q for q in range(1, spec.L + 1) if spec.L % q == 0]
    memory = [cm.memory_per_gpu(spec, p=q, b=1, m=1, recompute="full").total / 1e9 for q in ps]
    fig, (mem, idle) = plt.subplots(1, 2, figsize=(10, 3.2))
    mem.plot(ps, memory, "o-", color="#4C72B0", ms=3)
    mem.axhline(capacity / 1e9, color="k", ls="--", lw=0.8)
    mem.text(ps[0], capacity / 1e9 * 1.1, f"{gpu}: {capacity / 1e9:.0f} GB usable",
             fontsize=8)
    idle.plot(ps, [cm.bubble_fraction(q, 1) for q in ps], "o-", color="#DD8452", ms=3)
    here = cm.memory_per_gpu(spec, p=p, b=1, m=1, recompute="full").total / 1e9
    mem.plot([p], [here], "o", color="#C44E52", ms=9, label=f"p = {p}: {here:,.0f} GB")
    idle.plot([p], [cm.bubble_fraction(p, 1)], "o", color="#C44E52", ms=9,
              label=f"p = {p}: {cm.bubble_fraction(p, 1):.0%} idle")
    mem.set(xscale="log", yscale="log", xlabel="p (GPUs in the line)", ylabel="GB per GPU")
    idle.set(xscale="log", xlabel="p (GPUs in the line)", ylabel="idle share of each GPU")
    for ax in (mem, idle):
        ax.legend(fontsize=8)
    fig.suptitle(f"{spec.describe()}, layers split over p GPUs, one batch in flight", fontsize=9)
    fig.tight_layout()
    return fig


def layer_split_widget():
    """Pick a model and p: memory per GPU falls as 1/p, the idle share climbs to (p-1)/p."""
    import ipywidgets as w

    return explorer(plot_layer_split,
                    model=w.Dropdown(options=["gpt2-xl", "megatron-39.1B", "gpt3-175B",
                                              "megatron-1T"], value="gpt3-175B"),
                    p=w.IntSlider(value=48, min=1, max=128))
