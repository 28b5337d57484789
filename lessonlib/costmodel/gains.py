"""What each technique buys a job: tokens/s per GPU with and without FP8, async TP, FSDP
prefetch and DualPipe, the rest of the layout unchanged.

What it teaches: low precision and overlap are separate levers with separate limits. FP8
halves the linear GEMMs' time but pays memory-bound casts (``gemm.fp8_quantization_bytes``);
overlap hides a transfer only up to the compute beside it (``overlap.py``), so each gains
most where its traffic and its compute are of the same size. ``overlap_and_precision_gains``
toggles one technique at a time from the given layout:

* FP8: the linear GEMMs in BF16 against FP8 with ``fp8_scaling`` (tensorwise by default,
  torchtitan's Float8), on a GPU with FP8 Tensor Cores;
* async TP: SP's collectives exposed against split into t pieces (t > 1; SP turned on);
* FSDP prefetch: ZeRO-3's weight all-gathers exposed against hidden behind the compute;
* DualPipe: 1F1B with the expert all-to-alls exposed against DualPipe, whose two directions
  hide them behind each other's compute; its bubble differs too, and the row says so.
  DualPipe needs only an even p; the row is priced for an MoE model with e > 1, since the
  all-to-alls are the gain this model counts.

A technique the job cannot use is left out and named in ``skipped`` with the reason.

    from lessonlib.costmodel import MODELS, CLUSTERS, Layout
    from lessonlib.costmodel.gains import overlap_and_precision_gains
    g = overlap_and_precision_gains(MODELS["llama3-70B"], Layout(t=8, d=32, b=16, m=1,
        zero_stage=3, recompute="full", sequence_parallel=True), CLUSTERS["dgx-h100"])
    print(g.table())
"""
from dataclasses import dataclass, field, replace

from .throughput import estimate


@dataclass(frozen=True)
class Gain:
    """One technique's effect on one job: tokens/s per GPU without and with it."""

    technique: str
    hides: str              # what it hides or speeds up
    without: float
    with_: float

    @property
    def ratio(self):
        return self.with_ / self.without


@dataclass(frozen=True)
class Gains:
    job: str
    gains: tuple = ()
    skipped: dict = field(default_factory=dict)    # technique -> why it does not apply

    def by_name(self):
        return {g.technique: g for g in self.gains}

    def table(self):
        lines = [self.job, f"{'technique':22} {'without':>9} {'with':>9} {'gain':>7}  hides"]
        lines += [f"{g.technique:22} {g.without:>9.1f} {g.with_:>9.1f} {g.ratio:>6.3f}x  "
                  f"{g.hides}" for g in self.gains]
        lines += [f"{name:22} not used: {why}" for name, why in self.skipped.items()]
        return "\n".join(lines)


def _pairs(model, lay, gpu, fp8_scaling):
    """(technique, what it hides, layout without, layout with) or (technique, why not)."""
    if gpu.fp8_peak_flops:
        yield ("FP8 " + fp8_scaling, "half the linear GEMMs' time, less the casts",
               replace(lay, precision="bf16"),
               replace(lay, precision="fp8", fp8_scaling=fp8_scaling))
    else:
        yield "FP8 " + fp8_scaling, f"{gpu.name} has no FP8 Tensor Cores"
    if lay.t > 1:
        sp = replace(lay, sequence_parallel=True)
        yield ("async TP", "SP's all-gathers and reduce-scatters behind their GEMMs",
               replace(sp, async_tp=False), replace(sp, async_tp=True))
    else:
        yield "async TP", "t = 1: no tensor-parallel traffic"
    if lay.zero_stage == 3 and lay.d > 1:
        yield ("FSDP prefetch", "the weight all-gathers behind the compute",
               replace(lay, overlap_comm=False), replace(lay, overlap_comm=True))
    else:
        yield "FSDP prefetch", "no FSDP (zero_stage=3 over d > 1) in this layout"
    if lay.p < 2 or lay.p % 2:
        yield "DualPipe", f"p = {lay.p}: DualPipe schedules an even number of stages, p >= 2"
    elif lay.e > 1 and lay.v == 1:
        yield ("DualPipe", "the expert all-to-alls behind the other direction's compute "
               "(and its own bubble)", replace(lay, schedule="1f1b", overlap_comm=False),
               replace(lay, schedule="dualpipe"))
    else:      # DualPipe itself needs no expert parallelism (DeepSeek-V3 §3.2.1)
        yield "DualPipe", "the cost model prices DualPipe's gain only as hidden expert " \
                          "all-to-alls (e > 1, v = 1)"


def overlap_and_precision_gains(model, layout, cluster, fp8_scaling="tensorwise"):
    """Tokens/s per GPU of ``model`` on ``cluster`` with and without each technique, every
    other setting of ``layout`` kept; a ``Gains`` (``.gains``, ``.skipped``, ``.table()``)."""
    gains, skipped = [], {}
    for pair in _pairs(model, layout, cluster.gpu, fp8_scaling):
        if len(pair) == 2:
            skipped[pair[0]] = pair[1]
            continue
        name, hides, off, on = pair
        per_gpu = [estimate(model, lay, cluster).tokens_per_s / lay.n_gpus for lay in (off, on)]
        gains.append(Gain(name, hides, *per_gpu))
    job = f"{model.describe()}\n{layout.describe()} on {layout.n_gpus} x {cluster.gpu.name}"
    return Gains(job, tuple(gains), skipped)
