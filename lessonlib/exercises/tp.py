"""Checkers for the model-parallel (03) and tensor-parallel (04) exercises.

Each checker runs the student's function (or reads the student's number) and returns a
``Verdict`` (``lessonlib.exercises.verdict``) that says what is right or wrong in plain
words. An untouched stub, ``None`` or a function that still raises ``NotImplementedError``,
is "your turn", not an error.

The tensor-parallel checkers run the student's code on 2 real ranks: the launcher sends a
function written in a notebook cell by value (``cloudpickle``), with the globals it uses, so
the cell that defines it must import what it uses (``torch``, ``dist``, ``F``, ``comm``).

Laptop:  the notebooks call these; e.g. ``check_stage_split(my_split)``.
GPU box: the same (the 2-rank checks use NCCL when 2 GPUs are visible).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from lessonlib import comm, device
from lessonlib.costmodel import tp_elements_per_layer
from lessonlib.exercises.verdict import (Verdict, correct, not_yet, number, still_a_stub,
                                         unanswered, unwritten)
from lessonlib.launcher import LaunchTimeout, RankError, launch
from lessonlib.model_parallel.line_runs import idle_fraction


# ---------------------------------------------------------------- notebook 03, in process
def check_stage_split(fn) -> Verdict:
    """``fn(n_layers, p)`` -> p lists of consecutive layer indices, sizes differing by <= 1."""
    if fn is None:
        return unanswered("my_split")
    for n, p in ((8, 4), (6, 4), (7, 2), (5, 5), (12, 3)):
        try:
            got = fn(n, p)
        except NotImplementedError:
            return unwritten(fn.__name__)
        got = [list(s) for s in got]
        if len(got) != p:
            return not_yet(f"{fn.__name__}({n}, {p}) gave {len(got)} stages; "
                           f"p={p} asks for {p}")
        if [i for s in got for i in s] != list(range(n)):
            return not_yet(f"{fn.__name__}({n}, {p}) = {got}: every layer 0..{n - 1} must "
                           f"appear once, in order, stage after stage")
        sizes = [len(s) for s in got]
        if min(sizes) < 1 or max(sizes) - min(sizes) > 1:
            return not_yet(f"{fn.__name__}({n}, {p}) = {got}: stage sizes {sizes} are not "
                           f"balanced; they should differ by at most one layer")
    return correct("contiguous, complete and balanced for every case tried")


def check_idle_share(fn, results: list[dict]) -> Verdict:
    """``fn(timeline, wall)`` -> idle share of one rank, on the notebook's real timelines."""
    if fn is None or results is None:
        return unanswered("my_idle_share")
    line = [r for r in results if r.rank < results[0].p]            # the first line
    wall = max(x.end for r in line for x in r.timeline)
    for r in line:
        try:
            got = fn(r.timeline, wall)
        except NotImplementedError:
            return unwritten(fn.__name__)
        want = idle_fraction(r.timeline, wall)
        if abs(got - want) > 1e-9:
            return not_yet(f"rank {r.rank}: you got {got:.3f}, but the rank worked "
                           f"(F, B and OPT spans) {1 - want:.3f} of the wall time, so it "
                           f"idled {want:.3f}. Waiting and sending count as idle.")
    return correct("idle share right for every rank")


def check_unbalanced_idle(answer, stage_ms=(1.0, 1.0, 1.0, 3.0), stage: int = 0) -> Verdict:
    """Exercise: the idle share of ``stage``'s step when one batch goes through stages that
    compute (forward + backward) ``stage_ms`` each, messages free."""
    if answer is None:
        return unanswered("my_idle")
    got = number(answer)
    if got is None:
        return not_yet(f"give a share between 0 and 1, e.g. 0.5; got {answer!r}")
    step, p = sum(stage_ms), len(stage_ms)
    want = 1 - stage_ms[stage] / step
    if abs(got - want) < 5e-3:
        return correct(f"one batch visits the stages one after another, so the step lasts "
                       f"{' + '.join(f'{x:g}' for x in stage_ms)} = {step:g} ms and stage "
                       f"{stage} works {stage_ms[stage]:g} of them: idle {want:.1%}. The slow "
                       f"stage stretches everyone's step, not only its own.")
    if abs(got - 100 * want) < 0.5:
        return not_yet("that is a percentage; give the share (0.5, not 50)")
    if abs(got - (p - 1) / p) < 5e-3:
        return not_yet(f"(p-1)/p = {(p - 1) / p:.0%} holds for equal stages; here one stage is "
                       f"slower. Add up how long one step lasts, then ask how much of it "
                       f"stage {stage} works.")
    slowest = max(range(p), key=lambda s: stage_ms[s])
    if abs(got - (1 - stage_ms[slowest] / step)) < 5e-3:
        return not_yet(f"that is the idle share of stage {slowest}, the slow one; the question "
                       f"asks for stage {stage}")
    return not_yet(f"the step lasts as long as all stages' work together (one batch, one stage "
                   f"at a time); stage {stage}'s idle share is 1 - its work / the step. You "
                   f"gave {got:.3f}.")


# ---------------------------------------------------------------- notebook 04
def check_tp_traffic_ratio(answer, t_from: int = 4, t_to: int = 8) -> Verdict:
    """Exercise: by what factor the bytes one rank sends per layer and micro-batch change when
    the tensor-parallel degree goes from ``t_from`` to ``t_to`` (ring all-reduces)."""
    if answer is None:
        return unanswered("my_ratio")
    got = number(answer)
    if got is None:
        return not_yet(f"give one number, the factor; got {answer!r}")
    per_rank = {t: tp_elements_per_layer(1, 1, 1, t) for t in (t_from, t_to)}
    want = per_rank[t_to] / per_rank[t_from]
    if abs(got - want) < 5e-3 * want:
        return correct(f"8bsh(t-1)/t goes from (t-1)/t = {t_from - 1}/{t_from} to "
                       f"{t_to - 1}/{t_to}: x{want:.3f}. Each rank holds half the weights but "
                       f"sends slightly more: tensor parallelism's traffic does not shrink "
                       f"with t.")
    if abs(got - t_from / t_to) < 1e-3:
        return not_yet(f"x{t_from / t_to:g} is what happens to the weights per rank; the "
                       f"all-reduced tensors are (b, s, h) whatever t is. Look at how the ring's "
                       f"2(t-1)/t changes.")
    if abs(got - t_to / t_from) < 1e-3:
        return not_yet("the traffic per rank does not grow as t: a ring all-reduce sends "
                       "2(t-1)/t of the payload per rank, which tends to 2, not to infinity")
    if abs(got - 1) < 1e-3:
        return not_yet("close: it hardly changes, but the ring's factor (t-1)/t still grows a "
                       "little between the two t")
    return not_yet(f"the bytes per rank are 8bsh(t-1)/t elements; divide the value at "
                   f"t={t_to} by the value at t={t_from} (b, s and h cancel). You gave {got:g}.")


def launch_student(worker, *fns) -> list | dict | str:
    """Run ``worker(*fns)`` on 2 ranks, the student's functions sent by value; return the
    ranks' results, ``{"status": "todo"}`` for a stub, or what went wrong in plain words."""
    try:
        return launch(worker, 2, *fns, timeout=60)
    except RankError as exc:
        if still_a_stub(exc):
            return {"status": "todo"}
        return f"your code raised on rank {exc.rank}:\n{exc}"
    except LaunchTimeout:
        return ("the 2 ranks waited on each other for 60 s: does every rank call the same "
                "collectives, in the same order, with tensors of the same shape?")


def run_pair(worker, forward, backward, names: str) -> list | Verdict:
    """The student's ``forward`` and ``backward`` run by ``worker`` on 2 ranks: the ranks'
    results, or the verdict to give at once (unanswered, still a stub, what went wrong)."""
    if forward is None or backward is None:
        return unanswered(names)
    ranks = launch_student(worker, forward, backward)
    if isinstance(ranks, str):
        return not_yet(ranks)
    if isinstance(ranks, dict) or ranks[0]["status"] == "todo":
        return unwritten(f"{forward.__name__} or {backward.__name__}")
    return ranks


class _StudentF(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, fwd, bwd):
        ctx.bwd = bwd
        return fwd(x, None)

    @staticmethod
    def backward(ctx, grad):
        return ctx.bwd(grad, None), None, None


def _run_f(forward, backward) -> dict:
    """On each rank: x = rank + 1, y = f(x), loss = sum(y * (rank + 1))."""
    rank, dev = dist.get_rank(), device.current_device()
    x = torch.full((4,), float(rank + 1), device=dev, requires_grad=True)
    try:
        with comm.ledger() as fwd_book:
            y = _StudentF.apply(x, forward, backward)
        with comm.ledger() as bwd_book:
            (y * (rank + 1)).sum().backward()
    except NotImplementedError:
        return {"status": "todo"}
    return {"status": "ran", "y": y.tolist(), "x": x.tolist(), "grad": x.grad.tolist(),
            "forward_all_reduces": fwd_book.count("all_reduce"),
            "backward_all_reduces": bwd_book.count("all_reduce")}


def check_f_operator(forward, backward) -> Verdict:
    """Megatron's f from two functions ``forward(x, group)`` and ``backward(grad, group)``.

    On 2 ranks, x = rank + 1 and the loss weighs f(x) by rank + 1, so the right input
    gradient is 1 + 2 = 3 on both ranks."""
    ranks = run_pair(_run_f, forward, backward, "my_f_forward or my_f_backward")
    if isinstance(ranks, Verdict):
        return ranks
    for r in ranks:
        if r["y"] != r["x"]:
            return not_yet(f"f must not change x in the forward pass: got {r['y']} for "
                           f"x = {r['x']}")
        if r["grad"] != [3.0] * 4:
            return not_yet(f"input gradient {r['grad']}, expected [3.0, ...]: every rank used "
                           f"the whole x, so its gradient is the sum of the ranks' gradients "
                           f"(1 + 2): all-reduce it in backward")
        if r["forward_all_reduces"] != 0 or r["backward_all_reduces"] != 1:
            return not_yet(f"{r['forward_all_reduces']} all-reduce(s) forward and "
                           f"{r['backward_all_reduces']} backward through lessonlib.comm; f "
                           f"has none forward and exactly one backward")
    return correct("identity forward, one all-reduce backward: that is Megatron's f")
