"""Checkers for the pipeline exercises (lesson 04, the interleaving deep dive 09, and 14): each
runs the student's answer through the schedule validator or the cost model and returns a
``Verdict`` (``lessonlib.exercises.verdict``) that says what is wrong in plain words; an
untouched ``None`` is "your turn".

    from lessonlib.exercises import pipeline as ex
    ex.check_1f1b_order("F0 F1 B0 F2 B1 ...", p=3, m=5, stage=0)   # one stage's 1F1B order
    ex.check_capped_bubble(answer, p=4, capacity=4)               # GPipe under a memory cap
    ex.check_min_microbatches(answer, p=8, target=0.1)
    ex.check_interleaved_microbatches(answer, p=4, v=2, m_plain=16)   # deep dive 09
"""
from __future__ import annotations

import math

from lessonlib.costmodel import bubble_fraction, stashed_microbatches
from lessonlib.exercises.verdict import Verdict, correct, not_yet, number, unanswered
from lessonlib.pipeline.actions import add_communication, compute_only, parse
from lessonlib.pipeline.schedules import gpipe, one_f_one_b, one_f_one_b_order
from lessonlib.pipeline.validate import ScheduleError, simulate


def _whole(answer) -> int | None:
    """The answer as a positive whole number, or None."""
    value = number(answer)
    return int(value) if value is not None and value == int(value) and value >= 1 else None


def check_1f1b_order(order, p: int = 4, m: int = 6, stage: int = 1) -> Verdict:
    """Exercise: the compute order (F and B only) of stage ``stage`` under 1F1B.

    ``order`` is a string like "F0 F1 B0 ..." or a list of such words. The other stages run
    the reference 1F1B; the whole pipeline is then validated and simulated (F = 1, B = 2)."""
    if order is None:
        return unanswered("my_order")
    if order == "" or order == []:
        return not_yet("write the order as a string, e.g. 'F0 F1 B0 F2 ...'.")
    try:
        mine = parse(order)
    except ValueError as exc:
        return not_yet(str(exc))
    words = [str(a) for a in mine]
    for kind, what in (("F", "forward"), ("B", "backward")):
        for i in range(m):
            n = words.count(f"{kind}{i}")
            if n != 1:
                return not_yet(f"the {what} of micro-batch {i} ({kind}{i}) appears {n} "
                               f"times; each of the m={m} micro-batches needs exactly one "
                               f"forward and one backward on every stage.")
    extra = [w for w in words if int(w[1:]) >= m]
    if extra:
        return not_yet(f"{extra[0]} does not exist: micro-batches are numbered 0..{m - 1}.")
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
        return not_yet(text)
    ref = simulate(one_f_one_b(p, m))
    limit = stashed_microbatches("1f1b", p, m, stage)
    if sim.makespan > ref.makespan + 1e-9:
        return not_yet(f"the order runs, but the step takes {sim.makespan:g} time units "
                       f"instead of 1F1B's {ref.makespan:g}: some stage waits for your "
                       f"stage. Start with as many forwards as the pipeline needs to fill "
                       f"(p - stage - 1 = {p - stage - 1}), then alternate.")
    if sim.peak_stash[stage] > limit:
        return not_yet(f"the order runs as fast as 1F1B, but stage {stage} holds "
                       f"{sim.peak_stash[stage]} micro-batches of activations at once; "
                       f"1F1B holds at most min(p - stage, m) = {limit}. Run the backward "
                       f"of the oldest micro-batch as soon as its gradient can arrive.")
    same = ([str(a) for a in compute_only(orders[stage])] ==
            [str(a) for a in one_f_one_b_order(p, m, stage)])
    return correct(f"no deadlock, bubble {sim.bubble[stage]:.1%} of wall time (as 1F1B), "
                   f"at most {sim.peak_stash[stage]} micro-batches held on stage {stage}"
                   + ("." if same else " (a different order with the same cost)."))


def check_capped_bubble(answer, p: int = 4, capacity: int = 4) -> Verdict:
    """Exercise: the smallest bubble (share of wall time) GPipe can reach with p stages when
    a stage has room for the activations of at most ``capacity`` micro-batches."""
    if answer is None:
        return unanswered("my_bubble")
    got = number(answer)
    if got is None:
        return not_yet(f"give the bubble as a share of the step, e.g. 0.25; got "
                       f"{answer!r}.")
    # GPipe holds all m micro-batches on every stage at its peak: m <= capacity.
    m = max(k for k in range(1, capacity + 1)
            if all(n <= capacity for n in simulate(gpipe(p, k)).peak_stash))
    want = bubble_fraction(p, m, convention="wall")
    if math.isclose(got, want, abs_tol=5e-3):
        cap = (f" 1F1B holds at most p = {p} on stage 0 whatever m is, so it can raise m "
               f"and shrink the bubble: that is what its memory cap buys." if p <= capacity
               else "")
        return correct(f"GPipe keeps all m micro-batches on every stage, so m <= "
                       f"{capacity} and the bubble stays at (p-1)/(m+p-1) = "
                       f"{p - 1}/{m + p - 1} = {want:.1%}.{cap}")
    if math.isclose(got, 100 * want, abs_tol=0.5):
        return not_yet("that is a percentage; give the share (0.25, not 25).")
    if math.isclose(got, bubble_fraction(p, m, convention="ideal"), abs_tol=5e-3):
        return not_yet(f"{got:.3g} is (p-1)/m, idle time over the ideal compute time "
                       f"(Megatron-LM's convention); the question asks for the share "
                       f"of the step's wall time.")
    if math.isclose(got, (p - 1) / p, abs_tol=5e-3):
        return not_yet("(p-1)/p is the bubble with one micro-batch; GPipe can use "
                       "more, as many as fit.")
    if got < want:
        return not_yet(f"{got:.1%} needs more micro-batches than fit: GPipe runs all "
                       f"m forwards before the first backward, so every stage holds "
                       f"m micro-batches of activations at its peak. How large may m "
                       f"be with room for {capacity}?")
    return not_yet(f"find the largest m whose activations fit ({capacity} "
                   f"micro-batches per stage under GPipe), then its bubble "
                   f"(p-1)/(m+p-1). You gave {got:.3g}.")


def check_min_microbatches(answer, p: int = 8, target: float = 0.1) -> Verdict:
    """Exercise: the fewest micro-batches that bring the bubble to ``target`` of wall time or
    below, for p stages."""
    if answer is None:
        return unanswered("my_m")
    m = 1
    while bubble_fraction(p, m, convention="wall") > target:
        m += 1
    ideal = 1
    while bubble_fraction(p, ideal, convention="ideal") > target:
        ideal += 1
    if answer == m:
        return correct(f"m={m}: bubble {bubble_fraction(p, m):.1%} of wall time; "
                       f"m={m - 1} would give {bubble_fraction(p, m - 1):.1%}.")
    if answer == ideal:
        return not_yet(f"m={ideal} brings Megatron's (p-1)/m (idle over ideal time) to "
                       f"{target:.0%}; the question asks for the share of wall time, "
                       f"(p-1)/(m+p-1), which needs fewer.")
    try:
        got = bubble_fraction(p, int(answer), convention="wall")
    except (TypeError, ValueError):
        return not_yet(f"give a positive whole number of micro-batches; got {answer!r}.")
    if got <= target:
        return not_yet(f"m={answer} works (bubble {got:.1%}) but a smaller m does too.")
    return not_yet(f"with m={answer} the bubble is still {got:.1%} of wall time; "
                   f"solve (p-1)/(m+p-1) <= {target} for m.")


def check_interleaved_microbatches(answer, p: int = 4, v: int = 2, m_plain: int = 16) -> Verdict:
    """Exercise (deep dive 09): the fewest micro-batches with which interleaved 1F1B (v chunks
    per device) idles no more of the step than plain 1F1B with ``m_plain`` micro-batches."""
    if answer is None:
        return unanswered("my_m_interleaved")
    target = bubble_fraction(p, m_plain, convention="wall")
    m = next(k for k in range(1, m_plain + 1)
             if k % p == 0 and bubble_fraction(p, k, v, convention="wall") <= target + 1e-12)
    got = _whole(answer)
    if got is None:
        return not_yet(f"give a positive whole number of micro-batches; got {answer!r}.")
    if got == m:
        return correct(f"m={m}: (p-1)/(v*m+p-1) with v*m = {v * m} equals plain 1F1B's "
                       f"(p-1)/(m+p-1) with m = {m_plain}: {target:.1%} of the step. "
                       f"Interleaving v chunks acts like v times the micro-batches, "
                       f"with about {v} times the messages between devices.")
    if got == m_plain:
        return not_yet(f"with m={m_plain} interleaving idles less than plain 1F1B "
                       f"({bubble_fraction(p, m_plain, v, convention='wall'):.1%} "
                       f"instead of {target:.1%}): fewer micro-batches do.")
    if got % p:
        return not_yet(f"this schedule needs m to be a multiple of p={p} (the "
                       f"micro-batches go round the devices in groups of p).")
    theirs = bubble_fraction(p, got, v, convention="wall")
    if theirs <= target:
        return not_yet(f"m={got} works ({theirs:.1%}) but a smaller multiple of "
                       f"p={p} does too.")
    return not_yet(f"with m={got} interleaving idles {theirs:.1%}, more than plain "
                   f"1F1B's {target:.1%} at m={m_plain}; compare (p-1)/(v*m+p-1) with "
                   f"(p-1)/(m+p-1).")
