"""The published record, predicted: each run of ``record.py`` against what its team measured,
with one set of constants, and the planner's best layout beside each team's.

``published_rows()`` predicts each run in the kind of figure its team published (step time,
TFLOP/s per GPU or MFU by the team's own FLOP count, tokens/s per GPU) and every other figure
its table prints for the row (``beside``); ``published_report()`` prints predicted against
published with the error, the course's MFU beside the team's where the counts differ, the
ratio over another row beside a row measured against it (never instead), and the error as a
distribution: the median and the worst, for time here and for memory in
``memory_report()``. ``versus_planner(run)`` and ``explain_versus_planner(run)`` set a
published layout against the planner's best and say whether what separates them is real or
a gap of the model; ``versus_table(comparisons)`` lines several of them up, three lines
each. The rows, their sources and their columns are in ``record.py``.

One job: the published record set against the model, row by row, as records
(``PublishedRow``, ``MemoryRow``, ``VersusPlanner``) and as the reports printed from them.

Run ``python -m lessonlib.costmodel --published``.
"""
from dataclasses import dataclass, replace
from statistics import median

from .compute import team_flops_per_token
from .hardware import CLUSTERS, GiB
from .layout import DEGREE_FREE
from .planner import separating_terms
from .record import memory_runs, published_runs
from .throughput import attention_time_s, estimate, memory_estimate


def cluster_of(run):
    """The run's cluster: a preset's name or the cluster itself (BLOOM's Jean Zay)."""
    return CLUSTERS[run.cluster] if isinstance(run.cluster, str) else run.cluster


def _mfu(model, formula, tokens_per_gpu, peak):
    return team_flops_per_token(model, formula) * tokens_per_gpu / peak


def _figure(run, est, metric, flops):
    """The estimate as a figure of this kind: seconds, TFLOP/s or MFU by ``flops``'s count
    (Eq. 3's TFLOP/s is the estimate's own hardware count), or tokens/s per GPU."""
    tokens = est.tokens_per_s / run.layout.n_gpus
    if metric == "seconds":
        return est.step_time_s
    if metric == "tokens":
        return tokens
    if metric == "tflops":
        if flops == "megatron-eq3":
            return est.tflops_per_gpu
        return team_flops_per_token(run.model, flops) * tokens / 1e12
    return _mfu(run.model, flops, tokens, est.cluster.gpu.peak_flops)


def _mfus(run, est):
    """Predicted MFU by the team's count and by the course's (a dict by count; Eq. 3
    counts recompute, so it is never a team's MFU)."""
    counts = {"course"} | ({run.flops} if run.flops not in ("", "megatron-eq3") else set())
    tokens = est.tokens_per_s / run.layout.n_gpus
    return {f: _mfu(run.model, f, tokens, est.cluster.gpu.peak_flops) for f in counts}


@dataclass(frozen=True)
class PublishedRow:
    """One published run predicted: the run, ``predicted`` (in its metric), ``error``
    (predicted / published - 1), ``beside`` ([(metric, published, predicted, error)] for its
    other figures), ``ratio`` ((published, predicted) over its ``versus`` row, or None),
    ``mfu`` (by FLOP count: the team's and the course's) and the ``estimate``."""
    run: object
    predicted: float
    error: float
    beside: list
    ratio: tuple | None
    mfu: dict
    estimate: object


@dataclass(frozen=True)
class MemoryRow:
    """One memory row predicted: the row, the memory-only ``estimate``, ``predicted`` GiB per
    GPU and ``error`` against the published GiB (None for a layout that must only fit)."""
    row: object
    estimate: object
    predicted: float
    error: float | None


def published_rows(runs=None) -> list[PublishedRow]:
    """Per run, a ``PublishedRow``."""
    runs = runs or published_runs()
    out, tokens = [], {}
    for run in runs:
        est = estimate(run.model, run.layout, cluster_of(run))
        value = _figure(run, est, run.metric, run.flops)
        tokens[run.source] = (run.published, est.tokens_per_s / run.n_gpus)
        beside = [(metric, published, _figure(run, est, metric, flops))
                  for metric, published, flops in run.beside]
        ratio = None
        if run.versus:
            (base_pub, base_pred), mine = tokens[run.versus], est.tokens_per_s / run.n_gpus
            ratio = (run.published / base_pub, mine / base_pred)
        out.append(PublishedRow(run=run, predicted=value, error=value / run.published - 1,
                                beside=[(m, p, q, q / p - 1) for m, p, q in beside],
                                ratio=ratio, mfu=_mfus(run, est), estimate=est))
    return out


_UNITS = {"tflops": ("TFLOP/s", 1, 1), "mfu": ("MFU %", 100, 1), "tokens": ("tok/s/GPU", 1, 1),
          "seconds": ("s/step", 1, 2)}


def _value(metric, value):
    _, scale, digits = _UNITS[metric]
    return f"{value * scale:.{digits}f}"


def error_summary(errors):
    """(median of the absolute errors, the worst error with its sign) of a list of
    relative errors; (None, None) when there are none."""
    if not errors:
        return None, None
    return median(abs(e) for e in errors), max(errors, key=abs)


def published_step_s(row):
    """The step time a time row's published figure implies: the figure itself for a step
    time, else the predicted step scaled by predicted over published (TFLOP/s, MFU and
    tokens/s per GPU each run inversely to the step)."""
    if row.run.metric == "seconds":
        return row.run.published
    return row.estimate.step_time_s * row.predicted / row.run.published


def gap_share(row, part):
    """The gap between a time row's published and predicted step in units of one ``part``
    of the predicted step: one of ``Estimate.time``'s parts, or "attention", the attention
    cores inside "compute" (``throughput.attention_time_s``). -1.0 means the run took the
    predicted step less that whole part. A miss the size of one part says where to look
    first; it does not say the part is wrong. ValueError for a part the step spends no
    time in."""
    est = row.estimate
    seconds = attention_time_s(est) if part == "attention" else est.time.get(part, 0.0)
    if seconds <= 0:
        spent = [name for name, value in est.time.items() if value > 0]
        raise ValueError(f"part={part!r}: this step spends no time there; use 'attention' "
                         f"or one of {', '.join(spent)}")
    return (published_step_s(row) - est.step_time_s) / seconds


def attention_gap(row):
    """(attention's share of the predicted step, the gap between the published and the
    predicted step as a share of the predicted attention time) for a time row
    (``gap_share``). Where rows whose attention share differs widely all miss by about the
    same share of their attention time, the cost the model lacks grows with attention, not
    with the rest of the step."""
    return (attention_time_s(row.estimate) / row.estimate.step_time_s,
            gap_share(row, "attention"))


# A row the model misses by more than this is missed (``published_report``'s count, and
# ``tests/test_costmodel_published.py``'s bar).
MISSED_BEYOND = 0.15


def _summary_line(what, rows):
    """One line: how many rows, the median and the worst error (with its row), how many
    within 15 %; ``rows`` from ``published_rows`` or ``memory_rows``."""
    errors = [r.error for r in rows]
    if not errors:
        return f"{what}: no rows."
    mid, worst = error_summary(errors)
    missed = next(r for r in rows if r.error == worst)
    source = (missed.run if isinstance(missed, PublishedRow) else missed.row).source
    return (f"{what}: {len(errors)} rows, median |error| {mid:.1%}, worst {worst:+.1%} "
            f"({source}); {sum(abs(e) <= MISSED_BEYOND for e in errors)} within 15 %.")


def published_report(runs=None):
    """A text table: published against predicted in what each team published, with the
    error; the MFU by the team's count and the course's; the row's other figures and any
    ratio beside; then the error's median and worst."""
    rows = published_rows(runs)
    lines = [f"{'run':50} {'GPUs':>6} {'metric':>9} {'published':>9} {'predicted':>9} "
             f"{'error':>7}  {'MFU: team / course':18} beside"]
    for r in rows:
        run, mfu = r.run, r.mfu
        team = f"{mfu[run.flops]:.1%}" if run.flops in mfu else "-"
        extra = [f"{_UNITS[m][0]} {_value(m, p)} -> {_value(m, q)} ({e:+.1%})"
                 for m, p, q, e in r.beside]
        if r.ratio:
            pub, pred = r.ratio
            extra.append(f"over {run.versus.split(', ')[-1]}: {pub:.3f} -> {pred:.3f}")
        lines.append(f"{run.source[:50]:50} {run.n_gpus:>6} {_UNITS[run.metric][0]:>9} "
                     f"{_value(run.metric, run.published):>9} "
                     f"{_value(run.metric, r.predicted):>9} {r.error:>+7.1%}  "
                     f"{team:>6} / {mfu['course']:>6.1%}   {'; '.join(extra)}"
                     + (" [sets the constants]" if run.role != "checked" else ""))
    lines.append(_summary_line("Time (each row in what its team published)",
                               [r for r in rows if r.run.role == "checked"])
                 + " No row sets a constant: every row is a check.")
    lines.append("MFU: the team's own FLOP count (Korthikanti 2022 App. A; Megatron-LM's for "
                 "Nemotron-4; PaLM's for Llama 3, which its TFLOP/s use; torchtitan's, its "
                 "April 2024 rows by its count of then, the embedding included) / the "
                 "course's (today's shapes' causal scores halved). TFLOP/s: by the team's "
                 "count (Megatron-LM 2021 Eq. 3 counts recompute: hardware FLOPs). "
                 "DeepSeek-V3's row is an average over its whole pre-training, not a step.")
    return "\n".join(lines)


def memory_rows(runs=None) -> list[MemoryRow]:
    """Per memory row, a ``MemoryRow``."""
    out = []
    for row in runs or memory_runs():
        est = memory_estimate(row.model, row.layout, cluster_of(row))
        gib = est.memory.total / GiB
        out.append(MemoryRow(row=row, estimate=est, predicted=gib,
                             error=None if row.gib is None else gib / row.gib - 1))
    return out


def memory_report(runs=None):
    """A text table: peak memory per GPU predicted against published, by part, with the
    error; layouts that must fit with the usable GiB and the verdict."""
    lines = [f"{'memory row':44} {'published':>9} {'predicted':>9} {'error':>7}  "
             f"{'state':>5} {'acts':>5} {'logit':>5} {'work':>5}  usable / verdict"]
    rows = memory_rows(runs)
    for r in rows:
        row, est = r.row, r.estimate
        mem = est.memory
        parts = " ".join(f"{x / GiB:5.1f}" for x in (mem.model_state, mem.activations,
                                                     mem.logits, mem.working))
        published = "ran" if row.gib is None else f"{row.gib:.1f}"
        error = "" if r.error is None else f"{r.error:+.1%}"
        verdict = f"{est.memory_capacity_bytes / GiB:.1f} GiB: " + (
            "fits" if est.fits else "does NOT fit")
        lines.append(f"{row.source[:44]:44} {published:>9} {r.predicted:>9.1f} {error:>7}  "
                     f"{parts}  {verdict}")
    lines.append(_summary_line("Memory (GiB per GPU, rows with a published figure)",
                               [r for r in rows if r.error is not None]))
    lines.append("GiB per GPU on the busiest GPU: model state, activations held, the output "
                 "layer (final norm's and head's inputs, the loss's float32 peak), transient "
                 "working set (a recomputed layer, FSDP's gathered weights and gradients, "
                 "all-gathered K/V). torchtitan's figures are the allocator's reserved bytes.")
    return "\n".join(lines)


# The published setups the planner is asked about (item: the planner agrees with the teams).
PLANNED = ("Llama 3 Table 4, 8,192 GPUs 8K", "Llama 3 Table 4, 16,384 GPUs 8K",
           "Llama 3 Table 4, 128K", "DeepSeek-V3 Table 1: 14.8T tokens in 2.664M H800 GPU hours")


# What a team's framework and recipe set whatever the degrees (``layout.DEGREE_FREE``), its
# routing and its SMs for communication: every layout the planner weighs against the team's
# takes them too, so that a verdict is about the layout alone.
TEAM_SETTINGS = DEGREE_FREE + ("max_nodes", "comm_sm_share")


@dataclass(frozen=True)
class VersusPlanner:
    """A published layout against the planner's best for its setup: the run, both
    estimates, the ratio of their steps, and the (part, seconds) that separate them,
    largest first."""
    run: object
    published: object
    best: object
    ratio: float
    parts: list


def versus_planner(run) -> VersusPlanner:
    """The planner's best layout for the run's setup (model, cluster, GPUs, batch, sequence,
    and its precision and routing) against the published layout: both estimates, the ratio
    of their steps, and the parts of the step that separate them, largest first."""
    from .search import plan_job      # the planner sits above this module's estimate
    lay = run.layout
    fixed = {name: getattr(lay, name) for name in TEAM_SETTINGS}
    plan = plan_job(run.model, cluster_of(run), lay.n_gpus, lay.global_batch,
                    overlap_comm=lay.overlap_comm, **fixed)
    mine = estimate(run.model, lay, cluster_of(run))
    best = plan.best
    parts = separating_terms(mine, best)
    return VersusPlanner(run=run, published=mine, best=best,
                         ratio=mine.step_time_s / best.step_time_s, parts=parts)


def versus_table(comparisons) -> str:
    """Several ``versus_planner`` results, three lines each: the ratio of the steps and the
    largest part that separates them, then each layout with its step and memory."""
    lines = []
    for r in comparisons:
        mine, best = r.published, r.best
        part, seconds = r.parts[0]
        lines.append(f"{r.run.source}\n  published / best = {r.ratio:.2f}; the largest "
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
    "dp_comm": "real: the data-parallel exchange, its bytes through each GPU's share of "
               "the network ports at the bus bandwidth nccl-tests measures, hidden only "
               "beside the last micro-batch's backward (Megatron-Core syncs gradients there "
               "and under no_sync before, schedules.py) and cut into buckets that each pay "
               "their latency (axes.exchange_collectives)",
    "elementwise": "real: memory-bound kernels on each GPU's share of the activations",
    "contention": "real: compute runs slower beside the transfers it hides, 18.9 % on average "
                  "(Lee et al. 2025, abstract)",
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
    return [(what, memory_estimate(run.model, lay, cluster_of(run))) for what, lay in rows]


def explain_versus_planner(run):
    """In words: the published layout's predicted step against the planner's best, and,
    when they differ by more than 10 %, the cost that separates them (and memory)."""
    r = versus_planner(run)
    mine, best = r.published, r.best
    lines = [f"{run.source}: published {mine.layout.describe()} -> {mine.step_time_s:.2f} s "
             f"per step ({'fits' if mine.fits else 'over memory'}, "
             f"{mine.memory.total / GiB:.0f} GiB); planner's best {best.layout.describe()} "
             f"({best.layout.schedule}) -> {best.step_time_s:.2f} s "
             f"({best.memory.total / GiB:.0f} GiB): published / best = {r.ratio:.2f}."]
    if r.ratio > 1.10 or not mine.fits:
        named = ", ".join(f"{k} {v:+.2f} s" for k, v in r.parts[:3])
        lines.append(f"What separates them (published minus best): {named}"
                     + ("" if mine.fits else f"; and the model counts the published layout "
                        f"{mine.memory.total / GiB:.0f} GiB per GPU, over the "
                        f"{mine.memory_capacity_bytes / GiB:.0f} GiB usable") + ".")
        if r.ratio > 1.10:
            part = r.parts[0][0]
            lines.append(f"The largest, {part}, is {WHY[part]}." if part in WHY else
                         f"No verdict on the team's choice: the largest, {part}, has no "
                         f"published source in the course's record.")
            error = _figure(run, mine, run.metric, run.flops) / run.published - 1
            if abs(error) > MISSED_BEYOND:
                lines.append(f"But the model misses this run itself by {error:+.1%}: until "
                             f"that is explained, the gap is the model's, not evidence "
                             f"against the team's choice.")
        if not mine.fits:
            why = next((v for k, v in MEMORY_GAPS.items() if run.source.startswith(k)), "")
            lines.append(f"Memory: {MEMORY_GAP}" + (f"; {why}" if why else "") + ".")
    return "\n".join(lines)
