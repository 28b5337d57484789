"""Checkers for the pipeline half of lesson 04: each runs the student's answer through the
schedule validator or the cost model and says what is wrong in plain words.

    from lessonlib.exercises import pipeline as ex
    ex.check_1f1b_order("F0 F1 B0 F2 B1 ...", p=4, m=6, stage=1)   # one stage's 1F1B order
    ex.check_bubble(my_bubble)                                    # (p, m) -> bubble of wall time
    ex.check_min_microbatches(answer, p=8, target=0.1)
"""
from __future__ import annotations

import math

from lessonlib.costmodel import bubble_fraction, stashed_microbatches
from lessonlib.pipeline.schedules import (add_communication, compute_only, gpipe,
                                          one_f_one_b, one_f_one_b_order, parse)
from lessonlib.pipeline.validate import ScheduleError, simulate


def _report(ok: bool, message: str) -> bool:
    print(("Correct. " if ok else "Not yet. ") + message)
    return ok


def check_1f1b_order(order, p: int = 4, m: int = 6, stage: int = 1) -> bool:
    """Exercise: the compute order (F and B only) of stage ``stage`` under 1F1B.

    ``order`` is a string like "F0 F1 B0 ..." or a list of such words. The other stages run
    the reference 1F1B; the whole pipeline is then validated and simulated (F = 1, B = 2)."""
    if order is None or order == "" or order == []:
        return _report(False, "write the order as a string, e.g. 'F0 F1 B0 F2 ...'.")
    try:
        mine = parse(order)
    except ValueError as exc:
        return _report(False, str(exc))
    words = [str(a) for a in mine]
    for kind, what in (("F", "forward"), ("B", "backward")):
        for i in range(m):
            n = words.count(f"{kind}{i}")
            if n != 1:
                return _report(False, f"the {what} of micro-batch {i} ({kind}{i}) appears {n} "
                                      f"times; each of the m={m} micro-batches needs exactly one "
                                      f"forward and one backward on every stage.")
    extra = [w for w in words if int(w[1:]) >= m]
    if extra:
        return _report(False, f"{extra[0]} does not exist: micro-batches are numbered 0..{m - 1}.")
    orders = [one_f_one_b_order(p, m, s) for s in range(p)]
    orders[stage] = mine
    try:
        sim = simulate(add_communication(orders))
    except ScheduleError as exc:
        text = str(exc)
        if text.startswith("deadlock"):
            text = ("with this order the pipeline deadlocks: " + text.split(": ", 1)[1] +
                    "\n(sends never wait, so the first stage that waits for something the "
                    "others cannot yet send stalls the whole line)")
        return _report(False, text)
    ref = simulate(one_f_one_b(p, m))
    limit = stashed_microbatches("1f1b", p, m, stage)
    if sim.makespan > ref.makespan + 1e-9:
        return _report(False, f"the order runs, but the step takes {sim.makespan:g} time units "
                              f"instead of 1F1B's {ref.makespan:g}: some stage waits for your "
                              f"stage. Start with as many forwards as the pipeline needs to fill "
                              f"(p - stage - 1 = {p - stage - 1}), then alternate.")
    if sim.peak_stash[stage] > limit:
        return _report(False, f"the order runs as fast as 1F1B, but stage {stage} holds "
                              f"{sim.peak_stash[stage]} micro-batches of activations at once; "
                              f"1F1B holds at most min(p - stage, m) = {limit}. Run the backward "
                              f"of the oldest micro-batch as soon as its gradient can arrive.")
    same = ([str(a) for a in compute_only(orders[stage])] ==
            [str(a) for a in one_f_one_b_order(p, m, stage)])
    return _report(True, f"no deadlock, bubble {sim.bubble[stage]:.1%} of wall time (as 1F1B), "
                         f"at most {sim.peak_stash[stage]} micro-batches held on stage {stage}"
                         + ("." if same else " (a different order with the same cost)."))


def check_bubble(fn) -> bool:
    """Exercise: ``fn(p, m)`` returns the bubble as a share of the step's wall time; compared
    with the simulated GPipe schedule (balanced stages, F = 1, B = 2)."""
    if not callable(fn):
        return _report(False, "pass a function bubble(p, m) that returns a number.")
    for p in (1, 2, 3, 4, 8):
        for m in (1, 2, 3, 4, 8, 16):
            want = simulate(gpipe(p, m)).bubble[0]
            try:
                got = float(fn(p, m))
            except Exception as exc:  # the student's code may raise anything
                return _report(False, f"bubble({p}, {m}) raised {type(exc).__name__}: {exc}")
            if not math.isclose(got, want, abs_tol=1e-9):
                hint = ""
                if p > 1 and math.isclose(got, (p - 1) / m):
                    hint = (" That is Megatron-LM's convention, idle time over the *ideal* "
                            "compute time; here we want the idle share of the wall time.")
                elif math.isclose(got, (p - 1) / p):
                    hint = " That is the bubble without micro-batches (m = 1) for every m."
                return _report(False, f"for p={p}, m={m} the simulated bubble is {want:.4f} of "
                                      f"the wall time, yours is {got:.4f}.{hint}")
    return _report(True, "(p-1)/(m+p-1) of wall time, as GPipe §2.3 states, for every p and m "
                         "tried.")


def check_min_microbatches(answer, p: int = 8, target: float = 0.1) -> bool:
    """Exercise: the fewest micro-batches that bring the bubble to ``target`` of wall time or
    below, for p stages."""
    m = 1
    while bubble_fraction(p, m, convention="wall") > target:
        m += 1
    ideal = 1
    while bubble_fraction(p, ideal, convention="ideal") > target:
        ideal += 1
    if answer == m:
        return _report(True, f"m={m}: bubble {bubble_fraction(p, m):.1%} of wall time; "
                             f"m={m - 1} would give {bubble_fraction(p, m - 1):.1%}.")
    if answer == ideal:
        return _report(False, f"m={ideal} brings Megatron's (p-1)/m (idle over ideal time) to "
                              f"{target:.0%}; the question asks for the share of wall time, "
                              f"(p-1)/(m+p-1), which needs fewer.")
    try:
        got = bubble_fraction(p, int(answer), convention="wall")
    except (TypeError, ValueError):
        return _report(False, f"give a positive whole number of micro-batches; got {answer!r}.")
    if got <= target:
        return _report(False, f"m={answer} works (bubble {got:.1%}) but a smaller m does too.")
    return _report(False, f"with m={answer} the bubble is still {got:.1%} of wall time; "
                          f"solve (p-1)/(m+p-1) <= {target} for m.")
