"""Checkers for the long-sequences deep dive (notebook 12): what the causal imbalance of a
contiguous split costs the ring, worked out by hand. Each returns a ``Verdict``; ``None`` is
"your turn".

    from lessonlib.exercises import context
    context.check_ring_speedup(1.875, c=8)     # contiguous ring time over zig-zag's
"""
from __future__ import annotations

from lessonlib.costmodel.context import document_work
from lessonlib.exercises.verdict import Verdict, correct, not_yet, number, unanswered


def ring_time_ratio(c: int, n: int = 256) -> float:
    """The causal ring's forward time, contiguous over zig-zag, in kept scores: each step
    lasts its busiest rank's work (one document of c n tokens is the plain causal mask)."""
    one_sequence = [c * n]
    return (document_work(one_sequence, c, "contiguous").ring
            / document_work(one_sequence, c, "zigzag").ring)


def check_ring_speedup(answer, c: int = 8) -> Verdict:
    """Exercise 1: under a causal mask, over c ranks whose ring steps wait for the busiest
    rank, how many times longer the forward takes with a contiguous split than zig-zag."""
    if answer is None:
        return unanswered("my_speedup")
    value = number(answer)
    if value is None:
        return not_yet(f"give a number, e.g. 1.5; got {answer!r}.")
    expected = ring_time_ratio(c)
    if abs(value - expected) <= 0.02 * expected:
        return correct(f"contiguous: step 0 is every rank's own triangle, n^2/2, and each of "
                       f"the c-1 = {c - 1} other steps has a rank with a full block, n^2: "
                       f"(c - 1/2) n^2 in all. Zig-zag: every step is half a block on every "
                       f"rank, c n^2/2. The ratio is (2c-1)/c = {(2 * c - 1) / c:g}, not "
                       f"2c-1 = {2 * c - 1}: the ring waits for the busiest rank of each "
                       f"step, not for the last rank's whole total against the first's.")
    if abs(value - (2 * c - 1)) < 0.5:
        return not_yet(f"2c-1 = {2 * c - 1} is the last rank's work over the first's. The "
                       f"ring's time is the sum over its steps of each step's busiest rank.")
    if abs(value - 2) < 0.02:
        return not_yet(f"2 is the limit for many ranks; count step 0 (every rank's own "
                       f"triangle) at c = {c} exactly.")
    return not_yet(f"in chunks of n tokens: which rank is busiest at each of the c steps, "
                   f"and how much does it keep, contiguous and zig-zag? You gave {value:g}.")
