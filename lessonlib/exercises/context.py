"""Checkers for the long-sequences deep dive (notebook 12): the causal imbalance of a
contiguous split, worked out by hand. Each returns a ``Verdict``; ``None`` is "your turn".

    from lessonlib.exercises import context
    context.check_contiguous_imbalance(15, c=8)     # the last rank's work over the first's
"""
from __future__ import annotations

from lessonlib.costmodel.context import imbalance
from lessonlib.exercises.verdict import Verdict, correct, not_yet, number, unanswered


def check_contiguous_imbalance(answer, c: int = 8) -> Verdict:
    """Exercise 1: under a causal mask and a contiguous split over c ranks, how many times
    the first rank's attention work the last rank does (long sequences)."""
    if answer is None:
        return unanswered("my_ratio")
    value = number(answer)
    if value is None:
        return not_yet(f"give a number, e.g. 3; got {answer!r}.")
    expected = imbalance(4096 * c, c, "contiguous")
    if abs(value - expected) <= 0.02 * expected:
        return correct(f"the first rank scores its own chunk under the triangle, about n^2/2; "
                       f"the last scores c-1 = {c - 1} full chunks of n^2 and its own triangle: "
                       f"(c-1 + 1/2) / (1/2) = 2c-1 = {2 * c - 1}. The zig-zag split makes it 1.")
    if abs(value - c) < 0.5:
        return not_yet(f"{c} counts whole chunks; the first rank's own chunk is a triangle, "
                       f"half a chunk of work.")
    return not_yet(f"count the (query, key) scores each rank keeps under the mask, in chunks "
                   f"of n tokens: the first rank's own triangle, the last rank's c-1 full "
                   f"chunks and its triangle; you gave {value:g}.")
