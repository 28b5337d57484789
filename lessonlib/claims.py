"""Sentences that state a measured result, checked on the numbers they are about.

What it teaches: prose that says "the ring beats the server at 16 MiB" is a claim about a
measurement, and a re-run can make it false. A notebook cell states each such claim through
``claim`` (or ``within``) on the numbers that cell computed: the sentence is printed when it
holds, so the markdown beside it can quote it, and ``ClaimFailed`` is raised when it does not,
so an executed notebook (and nbval in CI) stops instead of shipping a contradiction. Noisy
measurements get a tolerance, and the sentence says it.

Laptop:  ``python -c "from lessonlib.claims import within; within('step', 1.1, 1.0, 0.15)"``
GPU box: the same; pure Python.
"""
from __future__ import annotations


class ClaimFailed(AssertionError):
    """A sentence the lesson makes is false on the numbers it was checked on."""


def claim(sentence: str, holds: bool, *, numbers: str = "") -> None:
    """Print ``sentence`` (and the ``numbers`` behind it) if ``holds``; else raise
    ClaimFailed naming the sentence, so that the cell fails where the prose would lie.
    Returns nothing, so a claim that ends a cell shows only its printed line."""
    said = f"{sentence} ({numbers})" if numbers else sentence
    if not holds:
        raise ClaimFailed(f"the lesson says '{sentence}', but it is false here"
                          + (f": {numbers}" if numbers else ""))
    print(f"✔ {said}")


def within(what: str, measured: float, expected: float, tolerance: float, *,
           unit: str = "") -> None:
    """Claim that ``measured`` is within ``tolerance`` (a fraction, 0.15 for 15 %) of
    ``expected``, and say by how much."""
    off = measured / expected - 1 if expected else float("inf")
    numbers = f"{measured:.4g}{unit} vs {expected:.4g}{unit}, {off:+.1%}"
    claim(f"{what} is within {tolerance:.0%} of the prediction", abs(off) <= tolerance,
          numbers=numbers)
