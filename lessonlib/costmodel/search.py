"""The planner over five axes: t, c, p, d, e for a model of today on a whole cluster.

``plan_job(model, cluster, n_gpus, global_batch, seq=)`` tries every (t, c, p, d, e) with
t*c*p*d = n_gpus (e dividing d and the model's experts), each with micro-batches b of 1 or
2, the 1F1B (with v = 1, 2, 4 or 8, even stages or the first and last one layer lighter),
ZB-H1, ZBV and (MoE models) DualPipe schedules, ZeRO-1 or FSDP (ZeRO-3) on d, and no,
selective or full recompute, then ranks them as ``planner.plan`` does (a ``Plan``).
``explain_axes(plan)`` says, axis by axis, why each value won, each time against the best
layout that differs on that axis alone.

Two priors keep the search to a few thousand estimates (well under a second on 16,384
GPUs): t stays inside a server (Megatron-LM 2021's takeaway #1; a layout with t beyond it
is never close), and SP goes with every t > 1 (Korthikanti et al. 2022). A third ranks the
result: a sequence is split (c > 1) only where it does not fit whole or the split gains
more than ``CP_MIN_GAIN`` (GPT-3 175B at 2K and 4K tokens: c = 1, as every team ran it).

What was fitted and what is only checked: nothing in the estimate is fitted (a GEMM's rate
comes from a published matmul sweep, ``gemm.py``; the memory-bound passes are counted,
``throughput.ELEMENTWISE_PASSES``); Megatron-LM 2021 Table 1
(``megatron2021.table1_report``), Korthikanti et al. 2022 Table 5 (``korthikanti2022``) and
Megatron-LM 2021 Fig. 13's 162 B model are checked, never fitted; nothing was fitted to
Llama 3 or DeepSeek-V3, whose published layouts the lesson prints beside the planner's
choice (``published.py``).

Run ``python -m lessonlib.costmodel --plan5 --model llama3-405B --seq 131072 --gpus 16384
--global-batch 128 --cluster dgx-h100``.
"""
from dataclasses import MISSING, fields, replace
from functools import lru_cache

from lessonlib.argcheck import positive_int

from .model import divisors
from .planner import check_plan_size, name_separating_term, rank
from .throughput import Layout

GB = 1e9

# Context parallelism is taken only where the sequence does not fit without it, or where it
# gains more than this over the best layout without it. Megatron-LM 2021 and MegaScale ran
# GPT-3 175B at 2K tokens with none; Llama 3 ran it only at 128K tokens (Table 4: CP 1 at 8K);
# the model prices CP's K/V exchange as hidden behind attention, which blocks of s/c tokens
# too short to hide it are not, and a gain of a few per cent is inside the model's own error
# (``--published`` prints its median): not a reason to split a sequence that fits whole.
CP_MIN_GAIN = 0.10

# What the search tries on each layout (see the module docstring).
MICROBATCHES = (1, 2)
SCHEDULES = (("1f1b", 1), ("1f1b", 2), ("1f1b", 4), ("1f1b", 8), ("zb-h1", 1), ("zbv", 1),
             ("dualpipe", 1))
SHARDING = (1, 3)
RECOMPUTE = ("none", "selective", "full")


def _stage_splits(model, p, v, m):
    """How v chunks of p stages split the layers: evenly where they can, else with the first
    and last stage one layer lighter (``uneven_stages``) where that makes it even; [] if
    neither."""
    if v > 1 and m % p:
        return []
    for uneven in (False, True):
        layers = model.L + (2 if uneven else 0)
        if uneven and p == 1:
            continue
        if layers % p == 0 and (layers // p) % v == 0 or (not uneven and v == 1):
            return [uneven]
    return []


def candidate_layouts_5d(model, cluster, n_gpus, global_batch, overlap_comm=False, **fixed):
    """Every Layout over (t, c, p, d, e) and the options above that ``model`` allows;
    ``overlap_comm`` for all of them (FSDP's gathers and the all-to-alls hidden); ``fixed``:
    settings of the job, not of the layout, for every one (``precision``, ``max_nodes``,
    ``cp_comm``)."""
    experts = model.moe.E if model.moe is not None else 1
    out = []
    for t in divisors(cluster.gpus_per_node):
        if model.a % t or model.h % t or n_gpus % t:
            continue
        for c in divisors(n_gpus // t):
            if c > 1 and model.s % (2 * c):
                continue
            for p in divisors(n_gpus // (t * c)):
                if p > model.L:
                    continue
                d = n_gpus // (t * c * p)
                for e in (k for k in divisors(d) if experts % k == 0):
                    for b in MICROBATCHES:
                        if global_batch % (b * d):
                            continue
                        m = global_batch // (b * d)
                        for sched, v in SCHEDULES if p > 1 else (("1f1b", 1),):
                            if sched == "dualpipe" and (p % 2 or model.moe is None):
                                continue       # DualPipe: an even p, for MoE all-to-alls
                            for uneven in _stage_splits(model, p, v, m):
                                out += [Layout(t=t, c=c, p=p, d=d, e=e, b=b, m=m, v=v,
                                               schedule=sched, zero_stage=zero,
                                               recompute=rc, sequence_parallel=t > 1,
                                               overlap_comm=overlap_comm,
                                               uneven_stages=uneven, **fixed)
                                        for zero in (SHARDING if d * c > 1 else (0,))
                                        for rc in RECOMPUTE]
    return out


def plan_job(model, cluster, n_gpus, global_batch, seq=None, overlap_comm=False, **fixed):
    """A ``Plan`` over all five axes for ``model`` (at ``seq`` tokens if given);
    ``overlap_comm``: assume FSDP's gathers and the MoE all-to-alls hidden behind compute
    (as prefetching and DeepSeek-V3's DualPipe do), else exposed; ``fixed``: the job's
    own settings (``precision``, ``max_nodes``, ``cp_comm``) for every layout."""
    check_plan_size(n_gpus, global_batch)
    if seq is not None:
        positive_int("seq", seq)
        model = replace(model, s=seq)
    job = (model, cluster, n_gpus, global_batch, overlap_comm, _settings(fixed))
    try:
        hash(job)
    except TypeError:             # an unhashable setting: not cached, and Layout refuses it
        return _plan(model, cluster, n_gpus, global_batch, overlap_comm, **fixed)
    plan = _planned(*job)
    # Each caller gets lists of its own; the estimates in them are frozen, shared.
    return replace(plan, ranked=list(plan.ranked), rejected=list(plan.rejected))


def _plan(model, cluster, n_gpus, global_batch, overlap_comm, **fixed):
    layouts = candidate_layouts_5d(model, cluster, n_gpus, global_batch, overlap_comm, **fixed)
    if not layouts:
        raise ValueError(f"global_batch={global_batch} admits no layout on n_gpus={n_gpus}: "
                         f"use a multiple of the data-parallel sizes, e.g. {n_gpus}")
    return prefer_whole_sequences(rank(model, cluster, n_gpus, global_batch, layouts))


def prefer_whole_sequences(plan):
    """The plan with CP's layouts ranked CP_MIN_GAIN slower while a layout without CP fits:
    a layout with c > 1 leads only if it beats the best with c = 1 by more than that."""
    if not any(e.layout.c == 1 for e in plan.ranked):
        return plan

    def weighed(e):
        return e.step_time_s * (1 + CP_MIN_GAIN if e.layout.c > 1 else 1)
    return replace(plan, ranked=sorted(plan.ranked, key=weighed))


# A lesson asks for the same job more than once (deep dive 15 prints the planner beside each
# published layout, then explains it; its exercise checker plans Llama 3's 128K job again):
# the last few plans are kept. Each holds some 10,000-35,000 estimates, a few tens of MB.
@lru_cache(maxsize=4)
def _planned(model, cluster, n_gpus, global_batch, overlap_comm, settings):
    return _plan(model, cluster, n_gpus, global_batch, overlap_comm, **dict(settings))


_LAYOUT_DEFAULTS = {f.name: f.default for f in fields(Layout)}


def _settings(fixed):
    """The job's settings as a cache key, those equal to ``Layout``'s default left out: a job
    spelled with them (``published.versus_planner``) or without is planned once."""
    def default(name, value):
        known = _LAYOUT_DEFAULTS.get(name, MISSING)
        return known is not MISSING and type(value) is type(known) and value == known
    return tuple(sorted((k, v) for k, v in fixed.items() if not default(k, v)))


def _versus(plan, best, axis, value):
    """'with axis=value the best layout ...' for the best layout differing on that axis."""
    keep = {k: getattr(best.layout, k) for k in ("t", "c", "p", "e") if k != axis}
    keep[axis] = value
    rival = next((e for e in plan.ranked + plan.rejected
                  if all(getattr(e.layout, k) == v for k, v in keep.items())), None)
    if rival is None:
        return ""
    if rival.fits:
        return (f" The best with {axis}={value} ({rival.layout.describe()}) takes "
                f"{rival.step_time_s:.1f} s per step, "
                f"{rival.step_time_s / best.step_time_s - 1:+.1%}; what separates them most: "
                f"{name_separating_term(rival, best)}.")
    return (f" With {axis}={value}: {rival.memory.total / GB:.0f} GB per GPU, "
            f"over the {rival.memory_capacity_bytes / GB:.0f} GB usable.")


def explain_axes(plan):
    """Why this t, c, p, d and e, one sentence (and a rival) per axis."""
    model, cluster, best = plan.model, plan.cluster, plan.best
    head = (f"{model.describe()} on {plan.n_gpus} x {cluster.gpu.name}, "
            f"global batch {plan.global_batch}.")
    if best is None:
        closest = plan.rejected[0]
        return head + (f"\nNo layout fits; the closest, {closest.layout.describe()}, needs "
                       f"{closest.memory.total / GB:.0f} GB per GPU.")
    lay, mem, time = best.layout, best.memory, best.time
    lines = [head, f"Best: {lay.describe()} ({lay.schedule}): {best.tflops_per_gpu:.0f} "
             f"TFLOP/s per GPU, {best.step_time_s:.1f} s per step, {mem.total / GB:.1f} GB "
             f"per GPU ({mem.model_state / GB:.1f} model state + {mem.activations / GB:.1f} "
             f"activations, {lay.recompute} recompute)."]
    half = lambda k: getattr(lay, k) // 2 if getattr(lay, k) > 1 else 2  # noqa: E731
    lines.append(f"t={lay.t}: " + (
        f"tensor parallelism splits every GEMM and its all-reduces stay inside a server "
        f"({time['tp_comm']:.2f} s per step)." if lay.t > 1 else
        "no tensor parallelism: every GEMM stays whole.") + _versus(plan, best, "t", half("t")))
    ring = time.get("cp_comm", 0.0)
    lines.append(f"c={lay.c}: " + (
        f"each sequence of {model.s} tokens is split over {lay.c} GPUs ({model.s // lay.c} "
        f"each), dividing activations by {lay.c}; the K/V ring leaves {ring:.2f} s exposed."
        if lay.c > 1 else f"each GPU keeps its sequences of {model.s} tokens whole (CP is "
        f"taken only where a sequence does not fit whole or it gains over "
        f"{CP_MIN_GAIN:.0%}).")
        + _versus(plan, best, "c", half("c")))
    lines.append(f"p={lay.p}: {model.L} layers in stages of {-(-model.L // lay.p)}, "
                 f"splitting the model state; the bubble takes {best.bubble_fraction:.1%} of "
                 f"the step." + _versus(plan, best, "p", half("p")))
    sharding = "FSDP (ZeRO-3)" if lay.zero_stage == 3 else f"ZeRO-{lay.zero_stage}"
    lines.append(f"d={lay.d}: the rest are replicas ({sharding} over {lay.d * lay.c} GPUs "
                 f"with the c ranks; gathers "
                 f"{'overlapped' if lay.overlap_comm else 'taken as exposed'}); the "
                 f"exchange costs {time['dp_comm']:.2f} s per step.")
    if model.moe is not None:
        lines.append(f"e={lay.e}: {model.moe.E // lay.e} of the {model.moe.E} experts per GPU;"
                     f" the all-to-alls take {time.get('ep_comm', 0.0):.2f} s per step "
                     f"({'what is left after overlap' if lay.overlap_comm else 'exposed'})."
                     + _versus(plan, best, "e", half("e")))
    return "\n".join(lines)
