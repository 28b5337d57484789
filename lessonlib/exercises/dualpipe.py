"""Checkers for the low-precision-and-overlap deep dive (notebook 16): DualPipeV's bubble,
worked out from the DualPipe README's formula and held to the played schedule. Each returns
a ``Verdict``; ``None`` is "your turn".

    from lessonlib.exercises import dualpipe
    dualpipe.check_dualpipev_bubble(9.0)      # the most idle device, in time units
"""
from __future__ import annotations

from lessonlib.exercises.verdict import Verdict, correct, not_yet, number, unanswered
from lessonlib.pipeline.dualpipe import dualpipev, readme_times
from lessonlib.pipeline.validate import simulate


def played_idle(p: int, forward: float, backward: float, weight: float,
                overlapped: float) -> float:
    """The most idle device's idle time when DualPipeV runs on p devices with 2p
    micro-batches, each action taking the README's times (``validate.simulate``)."""
    times = readme_times(forward, backward, weight, overlapped)
    return max(simulate(dualpipev(p, 2 * p), **times).idle)


def check_dualpipev_bubble(answer, p: int = 6, forward: float = 1.0, backward: float = 2.0,
                           weight: float = 1.0, overlapped: float = 2.8) -> Verdict:
    """Exercise 1: how long the most idle of p devices stands still in one DualPipeV step,
    with a chunk's forward F, its whole backward B (weight part W) and an F&B slot."""
    if answer is None:
        return unanswered("dualpipev_idle")
    value = number(answer)
    if value is None:
        return not_yet(f"give a number of time units, e.g. 4.5; got {answer!r}.")
    idle = played_idle(p, forward, backward, weight, overlapped)
    stages = 2 * p
    slot_ignored = (p - 1) * (forward + 2 * backward - 3 * weight)   # F&B = F + B
    if abs(value - idle) <= 0.01:
        return correct(
            f"{idle:.1f}: with PP = 2p = {stages} stages, (PP/2 - 1)(F&B + B - 3W) = "
            f"{p - 1} x {overlapped + backward - 3 * weight:.1f}, and the played schedule's most "
            f"idle device waits as long. Had the slot hidden nothing (F&B = F + B = "
            f"{forward + backward:g}), it would be {slot_ignored:.1f}: "
            f"every time unit the overlap saves in a slot comes off the bubble {p - 1} times. "
            f"1F1B over the same {stages} stages, one per device, idles (PP - 1)(F + B) = "
            f"{(stages - 1) * (forward + backward):g}.")
    if abs(value - slot_ignored) <= 0.01:
        return not_yet("that is the bubble of a slot that hides nothing: an F&B slot lasts "
                       f"F&B = {overlapped:g}, not F + B = {forward + backward:g}.")
    if abs(value - (p / 2 - 1) * (overlapped + backward - 3 * weight)) <= 0.01:
        return not_yet(f"PP in the formula counts stages, two per device: PP = 2p = {stages}, "
                       f"so PP/2 - 1 = {p - 1}.")
    if abs(value - (stages - 1) * (forward + backward)) <= 0.01:
        return not_yet("that is 1F1B's bubble over the same stages; DualPipeV's is "
                       "(PP/2 - 1)(F&B + B - 3W), section 6.")
    return not_yet(f"not {value:g}. Section 6's formula, (PP/2 - 1)(F&B + B - 3W), holds here "
                   f"(F = B - W = W); PP counts the {stages} stages.")
