"""Checkers for lesson 05's exercises: the grid's coordinates, and the system-design question.

    from lessonlib.exercises import hybrid
    hybrid.check_coords(my_coords_function)          # rank -> (dp, pp, tp)
    hybrid.check_design(t=8, p=64, d=2, b=1, m=1024)  # 1 T parameters on 128 servers of 8 GPUs
    hybrid.check_design(t=8, p=16, d=8, b=1, m=256, zero_stage=1)  # Adam state sharded

``check_design`` rebuilds the student's layout, asks the cost model (``estimate``) whether it
fits and how fast it runs, and compares it with the best layout the planner (``plan``) finds
for the same GPUs and batch (without ZeRO, and with the student's ZeRO stage), all in plain
words. With ``zero_stage`` (ZeRO, Rajbhandari et al. 2020: 1 shards the optimizer state over
the d replicas, as Megatron's distributed optimizer does; 2 also the gradients; 3 also the
weights) it says what sharding saved and what it costs.

Laptop and GPU box alike (pure arithmetic): ``python -c "from lessonlib.exercises import
hybrid; hybrid.check_design(t=8, p=16, d=8, b=1, m=256, zero_stage=1)"``.
"""
from __future__ import annotations

from functools import lru_cache

from lessonlib.costmodel import CLUSTERS, MODELS, Layout, estimate, plan
from lessonlib.costmodel.memory import OPTIMIZER_BYTES
from lessonlib.grid import placements

GB = 1e9
PART_NAMES = {"compute": "the matrix products (the slowest stage sets the pace)",
              "elementwise": "the memory-bound kernels", "tp_comm": "the TP all-reduces",
              "pp_comm": "the pipeline's sends", "dp_comm": "the DP gradient all-reduce",
              "bubble": "the pipeline bubble"}
QUESTION = {"model": "megatron-1T", "cluster": "dgx-a100", "servers": 128, "global_batch": 2048}


def _report(ok: bool, message: str) -> bool:
    print(("Correct. " if ok else "Not yet. ") + message)
    return ok


def check_coords(coords, shapes=((2, 2, 2), (1, 2, 4), (4, 1, 2), (2, 3, 2))) -> bool:
    """Exercise 1: ``coords(rank, dp, pp, tp)`` must return the rank's (dp, pp, tp) in the grid
    ``arange(world).view(dp, pp, tp)``."""
    for dp, pp, tp in shapes:
        for pl in placements(dp, pp, tp):
            got = coords(pl.rank, dp, pp, tp)
            want = (pl.dp, pl.pp, pl.tp)
            if tuple(got) != want:
                hint = ("tp is the innermost axis: consecutive ranks differ in tp first"
                        if tuple(got)[::-1] == want else
                        "rank = (dp_index * pp + pp_index) * tp + tp_index")
                return _report(False, f"for (dp, pp, tp) = ({dp}, {pp}, {tp}), rank {pl.rank} "
                                      f"should be at {want}, you gave {tuple(got)}; {hint}.")
    return _report(True, "rank // (pp*tp) is the replica, (rank // tp) % pp the stage and "
                         "rank % tp the place in the TP group.")


@lru_cache(maxsize=8)
def _plan(model: str, cluster: str, n_gpus: int, global_batch: int, zero_stage: int = 0):
    # The student chooses (t, p, d, b, m) without interleaving, so compare with v = 1.
    return plan(MODELS[model], CLUSTERS[cluster], n_gpus, global_batch, interleave=(1,),
                zero_stage=zero_stage)


def _zero_note(est, plain, d: int, zero_stage: int) -> str:
    """What ZeRO saved on this layout (``plain``: the same layout without it) and its price."""
    mem, was = est.memory, plain.memory
    shards = {1: "the Adam state (fp32 master weights, momentum, variance: "
                 f"{OPTIMIZER_BYTES} bytes per parameter)",
              2: "the Adam state and the gradients", 3: "the Adam state, gradients and weights"}
    price = ("the gradients are reduce-scattered and the updated weights all-gathered, the "
             "same bytes as the all-reduce it replaces" if zero_stage < 3 else
             "the weights are all-gathered before every forward and backward, more bytes "
             "than an all-reduce")
    parts = [f"{name} {getattr(was, part) / GB:.1f} -> {getattr(mem, part) / GB:.1f} GB"
             for name, part in (("optimizer", "optimizer"), ("gradients", "gradients"),
                                ("weights", "weights"))[:zero_stage]]
    return (f"ZeRO-{zero_stage} shards {shards[zero_stage]} over the d={d} replicas: "
            f"{', '.join(parts)} per GPU, so "
            f"{was.total / GB:.1f} GB becomes {mem.total / GB:.1f} GB (with "
            f"{mem.activations / GB:.1f} GB of activations). The price: {price} "
            f"({est.time['dp_comm']:.1f} s per step against {plain.time['dp_comm']:.1f} s). ")


def check_design(t: int, p: int, d: int, b: int, m: int, zero_stage: int = 0,
                 model: str = QUESTION["model"], cluster: str = QUESTION["cluster"],
                 servers: int = QUESTION["servers"],
                 global_batch: int = QUESTION["global_batch"]) -> bool:
    """Exercise 2: a layout for ``model`` on ``servers`` servers of ``cluster`` with a global
    batch of ``global_batch`` sequences, optionally with ZeRO stage ``zero_stage`` over the d
    replicas. Correct when it fits and is within 5 % of the best layout the planner finds
    without ZeRO or with the same stage."""
    if zero_stage not in (0, 1, 2, 3) or isinstance(zero_stage, bool):
        return _report(False, f"zero_stage={zero_stage!r} must be 0 (no sharding), 1 (the "
                              f"optimizer state), 2 (and the gradients) or 3 (and the weights).")
    gpt, hw = MODELS[model], CLUSTERS[cluster]
    n = servers * hw.gpus_per_node
    if t * p * d != n:
        return _report(False, f"t*p*d = {t}*{p}*{d} = {t * p * d} GPUs, but {servers} servers "
                              f"of {hw.gpus_per_node} have {n}: every GPU must be used once.")
    if b * m * d != global_batch:
        return _report(False, f"b*m*d = {b}*{m}*{d} = {b * m * d} sequences per step, but the "
                              f"global batch is {global_batch}: with b={b} and d={d}, "
                              f"m = {global_batch}/({b}*{d})"
                              + (f" = {global_batch // (b * d)}." if global_batch % (b * d) == 0
                                 else ", which is not a whole number: change b or d."))
    try:
        layout = Layout(t=t, p=p, d=d, b=b, m=m, zero_stage=zero_stage)
        est = estimate(gpt, layout, hw)
        plain = estimate(gpt, Layout(t=t, p=p, d=d, b=b, m=m), hw)
        sharded = estimate(gpt, Layout(t=t, p=p, d=d, b=b, m=m, zero_stage=1), hw)
    except ValueError as exc:
        return _report(False, f"this layout cannot run the model: {exc}.")
    best = min((pl.best for pl in (_plan(model, cluster, n, global_batch),
                                   _plan(model, cluster, n, global_batch, zero_stage))
                if pl.best), key=lambda e: e.step_time_s)
    mem = est.memory
    zero = _zero_note(est, plain, d, zero_stage) if zero_stage and d > 1 else ""
    if not est.fits:
        biggest = max(("model state (weights, gradients, Adam)", mem.model_state),
                      ("activations", mem.activations), key=lambda kv: kv[1])
        fix = "use smaller micro-batches (b)."
        if biggest[0].startswith("model"):
            fix = "split the model over more GPUs (a larger t*p)"
            if not zero_stage and d > 1 and sharded.fits:
                fix += (f", or shard the Adam state over the d={d} replicas with ZeRO-1 "
                        f"(zero_stage=1: {sharded.memory.total / GB:.1f} GB per GPU, it fits)")
            fix += "."
        return _report(False, zero + (
            f"t={t}, p={p} puts {mem.total / GB:,.0f} GB on each GPU of the first stage, "
            f"{(mem.total - est.memory_capacity_bytes) / GB:,.0f} GB more than the "
            f"{est.memory_capacity_bytes / GB:.0f} GB usable. Most of it is the "
            f"{biggest[0]} ({biggest[1] / GB:,.0f} GB): " + fix))
    ratio = est.step_time_s / best.step_time_s
    verdict = zero + (f"It fits ({mem.total / GB:.1f} GB per GPU) and runs at "
               f"{est.tflops_per_gpu:.0f} TFLOP/s per GPU, {est.step_time_s:.0f} s per step "
               f"(bubble {est.bubble_fraction:.1%}). The best layout the planner finds, "
               f"{best.layout.describe()}, runs at {best.tflops_per_gpu:.0f} TFLOP/s per GPU, "
               f"{best.step_time_s:.0f} s per step")
    if ratio <= 1.05:
        return _report(True, verdict + (": yours is that layout." if layout == best.layout
                                        else f": yours is within {ratio - 1:.0%} of it."))
    why = []
    if t > hw.gpus_per_node:
        why.append(f"t={t} stretches each TP group over {t // hw.gpus_per_node} servers, so its "
                   f"all-reduces leave NVLink ({est.time['tp_comm']:.0f} s per step of them)")
    if est.bubble_fraction > 2 * best.bubble_fraction:
        why.append(f"the bubble takes {est.bubble_fraction:.0%} of the step "
                   f"(best: {best.bubble_fraction:.0%}): fewer stages or more micro-batches help")
    if b > best.layout.b:
        why.append(f"b={b} leaves fewer micro-batches (m={m}) to fill the pipeline")
    part = max(est.time, key=lambda k: est.time[k] - best.time[k])
    why.append(f"the largest difference is {PART_NAMES.get(part, part)}: "
               f"{est.time[part]:.0f} s per step against {best.time[part]:.0f} s")
    return _report(False, verdict + f"; yours takes {ratio:.2f}x as long. Why: "
                   + "; ".join(why) + ".")
