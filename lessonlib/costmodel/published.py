"""The published record as data: every run the course quotes, predicted against what its team
measured, with one set of constants.

Each ``PublishedRun`` names its source (paper, table, row), the model, the cluster, the
layout the team ran (schedule, recompute, precision in ``Layout``), the published figure and
what kind it is:

* ``"tflops"``: TFLOP/s per GPU counted as the team counts it (Megatron-LM 2021 Eq. 3,
  recompute included: hardware FLOPs);
* ``"mfu"``: model FLOPs utilization of the BF16 peak, model FLOPs counted by the team's own
  formula (``compute.team_flops_per_token``);
* ``"tokens"``: tokens per second per GPU, which needs no FLOP count at all;
* ``"ratio"``: tokens/s over another row's (``versus``), the same run with one thing changed.

``published_rows()`` predicts each one; ``published_report()`` prints predicted against
published with the error, and, where the team's FLOP count differs from the course's, the
course's MFU beside the team's (never a TFLOP/s of one kind beside a figure of the other).

Which rows set constants: Megatron-LM 2021 Table 1 sets ``gemm.GEMM_PEAK_FRACTION`` and
``throughput.ELEMENTWISE_PASSES``, chosen together among round values; every other row is
only checked. Today's terms take their numbers from their sources, none fitted to a row:
``gemm.ATTENTION_PEAK_FRACTION`` (FlashAttention-2's 35 % of H100 peak, Shah et al. 2024)
and its 2.5x backward (Dao et al. 2022, Alg. 4); ``kernels.py``'s eager bytes and "op"
recompute (torchtitan's code); the SwiGLU/GQA activations (Korthikanti's method); DeepSeek-V3's
20 of 132 SMs (§3.2.2), MLA dims (§2.1.1), MTP (§2.2), FP8 dispatch (§3.3.4), recompute
(§3.2.3, §3.3.4); Grand Teton's 96 GB at 2.4 TB/s. One reading decides a row: its 500 W
H100's Tensor Core rate, "between SXM and NVL" (989, 835) by its team, taken as the middle,
912 (torchtitan eager: +7 % at 835, +21 % at 989). DeepSeek-V3 (+16 %) is beyond 15 %.

Run ``python -m lessonlib.costmodel --published``.
"""
from dataclasses import dataclass, replace

from .compute import model_flops_per_iteration, team_flops_per_token
from .hardware import CLUSTERS
from .layout import Layout
from .megatron2021 import load_table1, table1_layout, table1_model
from .model import GPT, MODELS
from .throughput import estimate

SETS = "sets the constants"
CHECKED = "checked"


@dataclass(frozen=True)
class PublishedRun:
    """One published training run and its figure; ``flops``: whose FLOP count the figure
    uses ("megatron-eq3", "korthikanti", "palm", "torchtitan"; "" for tokens/s)."""

    source: str
    model: GPT
    cluster: str
    layout: Layout
    metric: str
    published: float
    flops: str = ""
    role: str = CHECKED
    note: str = ""
    also: str = ""     # another FLOP count whose MFU is printed beside (a reading not taken)
    versus: str = ""   # metric "ratio": tokens/s over those of the run of this source

    @property
    def n_gpus(self):
        return self.layout.n_gpus


def _megatron_rows():
    return [PublishedRun(f"Megatron-LM 2021 Table 1, {r['params_billion']} B",
                         table1_model(r), "dgx-a100", table1_layout(r), "tflops",
                         r["tflops_per_gpu"], "megatron-eq3", SETS,
                         "b and v from the authors' run scripts")
            for r in load_table1()]


# Korthikanti et al. 2022, Table 3 runs and Table 5's iteration time under selective
# recompute + sequence parallelism (s), with its MFU (%): name, L, h, a, p, GPUs, batch,
# micro-batch, v, seconds, MFU. All t = 8, s = 2048, V = 51200.
KORTHIKANTI = [("22B", 48, 6144, 64, 1, 8, 4, 4, 1, 1.10, 41.5),
               ("175B", 96, 12288, 96, 8, 64, 64, 1, 3, 13.75, 51.4),
               ("530B", 105, 20480, 128, 35, 280, 280, 1, 3, 37.83, 56.0),
               ("1T", 128, 25600, 160, 64, 512, 512, 1, 1, 71.49, 56.3)]


def _korthikanti_rows():
    rows = []
    for name, L, h, a, p, gpus, batch, mb, v, seconds, mfu in KORTHIKANTI:
        lay = Layout(t=8, p=p, d=gpus // (8 * p), b=mb, global_batch=batch, v=v,
                     recompute="selective", sequence_parallel=True)
        rows.append(PublishedRun(
            f"Korthikanti 2022 Table 5, {name} selective + SP", GPT(L, h, a, 2048, 51200, name),
            "dgx-a100", lay, "mfu", mfu / 100, "korthikanti",
            note=f"iteration {seconds} s; MFU by App. A's model FLOPs"))
    return rows


# Llama 3 405B (Dubey et al. 2024, Table 4 and §3.3.2): 16M tokens per batch, TP 8, PP 16,
# interleaved with the first and last stage one layer lighter, BF16 MFU of 989 TFLOP/s.
_LLAMA_NOTE = ("v=8: 126 layers + embedding + output layer as 16 stages of 8 one-layer "
               "chunks (the course's reading of §3.3.2; v is not printed); FSDP taken as ZeRO-1; "
               "the paper states no FLOP count: the course reads its MFU as counting the scores "
               "a causal kernel computes (halved), and prints PaLM's count (not halved) beside")


def _llama_rows():
    base = MODELS["llama3-405B"]
    common = dict(t=8, p=16, b=1, v=8, uneven_stages=True, recompute="none",
                  sequence_parallel=True, zero_stage=1)
    return [
        PublishedRun("Llama 3 Table 4, 8,192 GPUs 8K", base, "dgx-h100",
                     Layout(d=64, global_batch=2048, **common), "mfu", 0.43, "course", also="palm",
                     note="8K tokens 'without activation checkpointing' (§3.3.2); " + _LLAMA_NOTE),
        PublishedRun("Llama 3 Table 4, 16,384 GPUs 8K", base, "dgx-h100",
                     Layout(d=128, global_batch=2048, **common), "mfu", 0.41, "course", also="palm",
                     note=_LLAMA_NOTE),
        PublishedRun("Llama 3 Table 4, 128K", replace(base, s=131072), "dgx-h100",
                     Layout(c=16, d=4, global_batch=128, cp_comm="allgather", **common),
                     "mfu", 0.38, "course", also="palm",
                     note="the row prints DP 4: 8*16*16*4 = 8,192 GPUs, while the text says "
                          "16,384; the course takes the table's own degrees (d=4, 8,192 "
                          "GPUs); per-GPU figures barely move with d=8 (m 32 -> 16). "
                          "All-gather CP (§3.3.2); no recompute, as at 8K: with c=16 each "
                          "GPU holds 8K tokens' activations. " + _LLAMA_NOTE),
    ]


def _torchtitan_rows():
    """Its Table 1 eager and with torch.compile: the same run but for the elementwise
    kernels, so the pair checks ``kernels.py``'s eager count against the measured ratio."""
    note = ("benchmarks/llama3_h100_202412_torchtitan.md; 8 H100 of Meta's Grand Teton (96 GB "
            "HBM2e at 2.4 TB/s, 500 W: docs/performance.md; Tensor Cores at 912 TFLOP/s, the "
            "middle of its team's 'between SXM and NVL'), FSDP, local batch 2, 8K tokens, "
            "recompute 'op' (torchtitan's default: every second matmul); MFU by torchtitan's "
            "count (6 x non-embedding params + 12Lhs per token, causal not halved)")
    lay = Layout(d=8, b=2, m=1, zero_stage=3, recompute="op", overlap_comm=True)
    source = "torchtitan Llama 3.1 8B on 8 H100, eager"
    return [PublishedRun(source, MODELS["llama3-8B"], "grand-teton-h100-96gb",
                         replace(lay, kernels="eager"), "tokens", 5762, "torchtitan",
                         note="eager, 33.7 % MFU; " + note),
            PublishedRun("torchtitan Llama 3.1 8B, torch.compile / eager", MODELS["llama3-8B"],
                         "grand-teton-h100-96gb", lay, "ratio", 6667 / 5762, "torchtitan",
                         versus=source, note="6,667 tokens/s with torch.compile, which fuses "
                         "the elementwise kernels (39.0 % MFU), over 5,762 eager; " + note)]


def _deepseek_row():
    return PublishedRun(
        "DeepSeek-V3 Table 1: 14.8T tokens in 2.664M H800 GPU hours", MODELS["deepseek-v3"],
        "hgx-h800", Layout(p=16, d=128, e=64, b=1, global_batch=15360, schedule="dualpipe",
                           zero_stage=1, recompute="norm-up", precision="fp8", max_nodes=4,
                           comm_sm_share=20 / 132),
        "tokens", 14.8e12 / (2.664e6 * 3600), "",
        note="an average over the whole pre-training, not a step; batch 15,360 x 4K (§4.2); "
             "DualPipe, EP 64, ZeRO-1, FP8 linear GEMMs, tokens on at most 4 nodes; RMSNorm, "
             "MLA up-projections (§3.2.3) and SwiGLU's output (§3.3.4) recomputed; the FP8 "
             "quantization kernels' traffic (§3.5.2: BF16 read, quantized, FP8 written back, "
             "read again by the MMA; §3.3.4: 128x1 tiles again in the backward) as memory-bound "
             "time (gemm.fp8_quantization_bytes). Not modelled: (1) the output head in "
             "BF16 (§3.3.1; FP8 here) with DualPipe's first and last stage on one rank "
             "(§3.2.3; here the slower paces): the two nearly cancel; (2) time outside steps "
             "(evaluation, checkpoints, restarts), in the GPU hours, unsized. The batch ramp "
             "(3,072 -> 15,360 over 469B tokens, §4.2) costs 0.07 % here (DualPipe's bubble is "
             "0 at F = B = W).")



def published_runs():
    """Every published run the course holds the cost model to."""
    return (_megatron_rows() + _korthikanti_rows() + _llama_rows() + _torchtitan_rows()
            + [_deepseek_row()])


def _mfu(model, formula, tokens_per_gpu, peak):
    return team_flops_per_token(model, formula) * tokens_per_gpu / peak


def _predicted(run, est):
    """The estimate in the run's metric; MFU by the team's count, another, and the course's."""
    tokens = est.tokens_per_s / run.layout.n_gpus
    peak = est.cluster.gpu.peak_flops
    counts = {run.also or "course", "course"} | ({run.flops} if run.flops not in (
        "", "megatron-eq3") else set())
    mfu = {f: _mfu(run.model, f, tokens, peak) for f in counts}
    value = {"tflops": est.tflops_per_gpu, "mfu": mfu.get(run.flops), "tokens": tokens,
             "ratio": None}
    return value[run.metric], mfu


def published_rows(runs=None):
    """Per run: the run, ``predicted`` (its metric), ``error``, ``mfu`` (predicted MFU by the
    team's count, ``also``'s and the course's: a dict by count) and the ``estimate``."""
    out, tokens = [], {}
    for run in runs or published_runs():
        est = estimate(run.model, run.layout, CLUSTERS[run.cluster])
        value, mfu = _predicted(run, est)
        tokens[run.source] = est.tokens_per_s
        if run.metric == "ratio":
            value = est.tokens_per_s / tokens[run.versus]
        out.append({"run": run, "predicted": value, "error": value / run.published - 1,
                    "mfu": mfu, "estimate": est})
    return out


_UNITS = {"tflops": ("TFLOP/s", 1), "mfu": ("MFU %", 100), "tokens": ("tok/s/GPU", 1),
          "ratio": ("ratio", 1)}


def published_report(runs=None):
    """A text table: published against predicted with the error; then the predicted MFU by
    the team's FLOP count and by the course's, and by another count where one is read."""
    lines = [f"{'run':50} {'GPUs':>6} {'metric':>9} {'published':>9} {'predicted':>9} "
             f"{'error':>7}  {'MFU: team / course / other':26} role"]
    for r in published_rows(runs):
        run, mfu = r["run"], r["mfu"]
        unit, scale = _UNITS[run.metric]
        # Eq. 3 counts recompute: hardware FLOPs, never printed as a team's MFU
        team = f"{mfu[run.flops]:.1%}" if run.flops in mfu and run.metric != "tflops" else "-"
        other = f"{mfu[run.also]:.1%} ({run.also})" if run.also else ""
        lines.append(f"{run.source[:50]:50} {run.n_gpus:>6} {unit:>9} "
                     f"{run.published * scale:>9.{3 if run.metric == 'ratio' else 1}f} "
                     f"{r['predicted'] * scale:>9.{3 if run.metric == 'ratio' else 1}f} "
                     f"{r['error']:>+7.1%}  {team:>6} / {mfu['course']:>6.1%} / {other:9} "
                     f"{run.role}")
    lines.append("MFU % by the team's own FLOP count (Korthikanti 2022 App. A; torchtitan's; "
                 "Llama 3 read as causal-halved); TFLOP/s by Megatron-LM 2021 Eq. 3, recompute "
                 "included (hardware FLOPs). course: today's shapes' causal scores halved; "
                 "palm: every score counted. DeepSeek-V3's row is an average over its whole "
                 "pre-training, not a step.")
    return "\n".join(lines)


# The published setups the planner is asked about (item: the planner agrees with the teams).
PLANNED = ("Llama 3 Table 4, 8,192 GPUs 8K", "Llama 3 Table 4, 16,384 GPUs 8K",
           "Llama 3 Table 4, 128K", "DeepSeek-V3 Table 1: 14.8T tokens in 2.664M H800 GPU hours")


def versus_planner(run):
    """The planner's best layout for the run's setup (model, cluster, GPUs, batch, sequence,
    and its precision and routing) against the published layout: both estimates, the ratio
    of their steps, and the parts of the step that separate them, largest first."""
    from .search import plan_job      # the planner sits above this module's estimate
    lay = run.layout
    fixed = {"precision": lay.precision, "max_nodes": lay.max_nodes, "cp_comm": lay.cp_comm,
             "kernels": lay.kernels, "comm_sm_share": lay.comm_sm_share}
    plan = plan_job(run.model, CLUSTERS[run.cluster], lay.n_gpus, lay.global_batch,
                    overlap_comm=lay.overlap_comm, **fixed)
    mine = estimate(run.model, lay, CLUSTERS[run.cluster])
    best = plan.best
    parts = sorted(((k, mine.time.get(k, 0.0) - best.time.get(k, 0.0))
                    for k in set(mine.time) | set(best.time)), key=lambda kv: -abs(kv[1]))
    return {"run": run, "published": mine, "best": best,
            "ratio": mine.step_time_s / best.step_time_s, "parts": parts}


# Whether a cost that separates a published layout from the planner's best is real, or a
# gap of the model, with the source that says so.
WHY = {
    "tp_comm": "a gap of the model: it leaves every TP all-reduce exposed, while overlapping "
               "them is published (torchtitan's async TP: 1.09-1.10x, its "
               "asyncTP_llama3_h100_2025-06 benchmark)",
    "pp_comm": "a gap of the model: it leaves pipeline sends exposed, while Llama 3 sent them "
               "asynchronously (Dubey et al. 2024, §3.3.2)",
    "bubble": "real: interleaved 1F1B idles (p-1)/(v m) of the ideal time (Megatron-LM 2021 "
              "§2.2); the planner's zero-bubble schedules were not what Meta ran in 2024",
    "cp_comm": "real: Llama 3's all-gather CP leaves its latency exposed (§3.3.2)",
    "ep_comm": "real where not overlapped: DeepSeek-V3 hides its all-to-alls behind compute "
               "with DualPipe and 20 SMs (§3.2.2), which the model grants only up to the "
               "compute's length",
    "compute": "a difference of stage shapes: the layouts split the 61 layers (and MTP) "
               "differently, and the model prices each GEMM by its shape",
    "dp_comm": "real: the data-parallel exchange at the end of the step",
    "elementwise": "real: memory-bound kernels on each GPU's share of the activations",
}
MEMORY_GAP = ("a gap of the model: the run happened, so the layout fit; the model's "
              "activation count (every tensor a SwiGLU/GQA layer keeps, each micro-batch in "
              "flight at its peak) misses how the team saved memory (Llama 3 §3.3.2: memory "
              "work that let 8K run without activation checkpointing)")


def explain_versus_planner(run):
    """In words: the published layout's predicted step against the planner's best, and,
    when they differ by more than 10 %, the cost that separates them (and memory)."""
    r = versus_planner(run)
    mine, best = r["published"], r["best"]
    lines = [f"{run.source}: published {mine.layout.describe()} -> {mine.step_time_s:.2f} s "
             f"per step ({'fits' if mine.fits else 'over memory'}, "
             f"{mine.memory.total / 1e9:.0f} GB); planner's best {best.layout.describe()} "
             f"({best.layout.schedule}) -> {best.step_time_s:.2f} s "
             f"({best.memory.total / 1e9:.0f} GB): published / best = {r['ratio']:.2f}."]
    if r["ratio"] > 1.10 or not mine.fits:
        named = ", ".join(f"{k} {v:+.2f} s" for k, v in r["parts"][:3])
        lines.append(f"What separates them (published minus best): {named}"
                     + ("" if mine.fits else f"; and the model counts the published layout "
                        f"{mine.memory.total / 1e9:.0f} GB per GPU, over the "
                        f"{mine.memory_capacity_bytes / 1e9:.0f} GB usable") + ".")
        if r["ratio"] > 1.10:
            part = r["parts"][0][0]
            lines.append(f"The largest, {part}, is {WHY.get(part, 'not classified')}.")
        if not mine.fits:
            lines.append(f"Memory: {MEMORY_GAP}.")
    return "\n".join(lines)
