"""The published record, predicted: each run of ``record.py`` against what its team measured,
with one set of constants, and the planner's best layout beside each team's.

``published_rows()`` predicts each run in its metric (TFLOP/s, MFU by the team's FLOP count,
tokens/s per GPU, or a ratio of two runs' tokens/s); ``published_report()`` prints predicted
against published with the error, and, where the team's FLOP count differs from the course's,
the course's MFU beside the team's (never a TFLOP/s of one kind beside a figure of the
other). ``versus_planner(run)`` and ``explain_versus_planner(run)`` set a published layout
against the planner's best and say whether what separates them is real or a gap of the
model; ``versus_table(comparisons)`` lines several of them up, three lines each. The rows,
their sources and the readings each needed are in ``record.py``.

Run ``python -m lessonlib.costmodel --published``.
"""
from dataclasses import replace

from .compute import team_flops_per_token
from .hardware import CLUSTERS, GiB
from .record import memory_runs, published_runs
from .throughput import estimate, memory_estimate

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
            base = tokens[run.versus] if run.versus else estimate(
                run.model, run.versus_layout, CLUSTERS[run.cluster]).tokens_per_s
            value = est.tokens_per_s / base
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


def memory_rows(runs=None):
    """Per memory row: the row, the ``estimate`` (memory only), ``predicted`` GiB per GPU and
    ``error`` against the published GiB (None for a layout that must only fit)."""
    out = []
    for row in runs or memory_runs():
        est = memory_estimate(row.model, row.layout, CLUSTERS[row.cluster])
        gib = est.memory.total / GiB
        out.append({"row": row, "estimate": est, "predicted": gib,
                    "error": None if row.gib is None else gib / row.gib - 1})
    return out


def memory_report(runs=None):
    """A text table: peak memory per GPU predicted against published, by part, with the
    error; layouts that must fit with the usable GiB and the verdict."""
    lines = [f"{'memory row':44} {'published':>9} {'predicted':>9} {'error':>7}  "
             f"{'state':>5} {'acts':>5} {'logit':>5} {'work':>5}  usable / verdict"]
    for r in memory_rows(runs):
        row, est = r["row"], r["estimate"]
        mem = est.memory
        parts = " ".join(f"{x / GiB:5.1f}" for x in (mem.model_state, mem.activations,
                                                     mem.logits, mem.working))
        published = "ran" if row.gib is None else f"{row.gib:.1f}"
        error = "" if r["error"] is None else f"{r['error']:+.1%}"
        verdict = f"{est.memory_capacity_bytes / GiB:.1f} GiB: " + (
            "fits" if est.fits else "does NOT fit")
        lines.append(f"{row.source[:44]:44} {published:>9} {r['predicted']:>9.1f} {error:>7}  "
                     f"{parts}  {verdict}")
    lines.append("GiB per GPU on the busiest GPU: model state, activations held, the output "
                 "layer (final norm's and head's inputs, the loss's float32 peak), transient "
                 "working set (a recomputed layer, FSDP's gathered weights and gradients, "
                 "all-gathered K/V). torchtitan's figures are the allocator's reserved bytes.")
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


def versus_table(comparisons) -> str:
    """Several ``versus_planner`` results, three lines each: the ratio of the steps and the
    largest part that separates them, then each layout with its step and memory."""
    lines = []
    for r in comparisons:
        mine, best = r["published"], r["best"]
        part, seconds = r["parts"][0]
        lines.append(f"{r['run'].source}\n  published / best = {r['ratio']:.2f}; the largest "
                     f"difference: {part} {seconds:+.2f} s")
        for who, est, tail in (("published", mine, ""), ("best", best,
                                                          f" ({best.layout.schedule})")):
            memory = f"{est.memory.total / 1e9:.0f} GB" + ("" if est.fits else ", over memory")
            lines.append(f"  {who:<9} {est.layout.describe()}{tail} -> "
                         f"{est.step_time_s:.2f} s, {memory}")
    return "\n".join(lines)


# Whether a cost that separates a published layout from the planner's best is real, or a
# gap of the model, with the source that says so.
WHY = {
    "tp_comm": "a gap of the model: the recorded layout leaves every TP all-reduce exposed "
               "(async_tp off), while overlapping them is published (torchtitan's async TP: 1.09-1.10x, its "
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
MEMORY_GAP = ("a gap of the model: the run happened, so the layout fit; the model, which "
              "counts what the measured layer of this family keeps (costmodel/layer_bytes.py) "
              "for every micro-batch in flight, misses a saving the team made")
# What the model keeps that a team's report does not say how it avoided, per run (none left:
# DeepSeek-V3's layout fits once its MoE keeps what §3.3.3 lists, layer_bytes.moe_bytes).
MEMORY_GAPS = {}


# What each memory saving of a team bought: its layout with that one saving undone.
SAVINGS = {
    "Llama 3 Table 4, 8,192 GPUs 8K": {
        "gradients whole (FSDP as ZeRO-1)": {"zero_stage": 1},
        "no sequence parallelism": {"sequence_parallel": False},
        "SwiGLU unfused (eager)": {"kernels": "eager"}},
    "DeepSeek-V3 Table 1: 14.8T tokens in 2.664M H800 GPU hours": {
        "no recompute (§3.2.3)": {"recompute": "none"},
        "Adam moments in FP32 (§3.3.3: BF16)": {"moment_dtype": "fp32"},
        "BF16, no FP8 caching (§3.3.3)": {"precision": "bf16"}},
}


def memory_savings(run):
    """(what, memory-only ``Estimate``) for ``run`` as published and with each of its
    ``SAVINGS`` undone in turn."""
    rows = [("as the team ran it", run.layout)] + [
        (what, replace(run.layout, **change)) for what, change in SAVINGS[run.source].items()]
    return [(what, memory_estimate(run.model, lay, CLUSTERS[run.cluster])) for what, lay in rows]


def explain_versus_planner(run):
    """In words: the published layout's predicted step against the planner's best, and,
    when they differ by more than 10 %, the cost that separates them (and memory)."""
    r = versus_planner(run)
    mine, best = r["published"], r["best"]
    lines = [f"{run.source}: published {mine.layout.describe()} -> {mine.step_time_s:.2f} s "
             f"per step ({'fits' if mine.fits else 'over memory'}, "
             f"{mine.memory.total / GiB:.0f} GiB); planner's best {best.layout.describe()} "
             f"({best.layout.schedule}) -> {best.step_time_s:.2f} s "
             f"({best.memory.total / GiB:.0f} GiB): published / best = {r['ratio']:.2f}."]
    if r["ratio"] > 1.10 or not mine.fits:
        named = ", ".join(f"{k} {v:+.2f} s" for k, v in r["parts"][:3])
        lines.append(f"What separates them (published minus best): {named}"
                     + ("" if mine.fits else f"; and the model counts the published layout "
                        f"{mine.memory.total / GiB:.0f} GiB per GPU, over the "
                        f"{mine.memory_capacity_bytes / GiB:.0f} GiB usable") + ".")
        if r["ratio"] > 1.10:
            part = r["parts"][0][0]
            lines.append(f"The largest, {part}, is {WHY.get(part, 'not classified')}.")
        if not mine.fits:
            why = next((v for k, v in MEMORY_GAPS.items() if run.source.startswith(k)), "")
            lines.append(f"Memory: {MEMORY_GAP}" + (f"; {why}" if why else "") + ".")
    return "\n".join(lines)
