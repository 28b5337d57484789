"""Sentences that state a measured result, checked on the numbers they are about.

What it teaches: prose that says "the ring beats the server at 16 MiB" is a claim about a
measurement, and a re-run can make it false. A notebook cell states each such claim through
``claim`` (or ``within``) on the numbers that cell computed: the sentence is printed when it
holds, so the markdown beside it can quote it, and ``ClaimFailed`` is raised when it does not,
so an executed notebook (and nbval in CI) stops instead of shipping a contradiction. Noisy
measurements get a tolerance, and the sentence says it.

A claim is one object: ``at_least``, ``at_most``, ``within`` and ``every`` write their
sentence from the same bound and values they test, so a changed bound changes the sentence
(and tests/test_prose_numbers.py finds a printed sentence that no longer matches its code),
and they refuse a measurement that no bound can fail (not a finite number).

Laptop:  ``python -c "from lessonlib.instruments.claims import at_least; at_least('the ratio', 1.8, 1.5)"``
GPU box: the same; pure Python.
"""
from __future__ import annotations

import math
import numbers


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


class ClaimCannotFail(ValueError):
    """A claim whose test no measurement could fail: a bound on NaN or infinity."""


def _finite(what: str, *values: float) -> None:
    for value in values:
        if not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise ClaimCannotFail(f"the claim '{what}' is tested on {value!r}, which no bound "
                                  f"can fail: measure something finite (a ratio over zero?)")


def at_least(what: str, measured: float, bound: float, *, unit: str = "",
             digits: int = 3) -> None:
    """Claim that ``measured`` is at least ``bound``; the sentence says both."""
    _bounded(what, measured, bound, "at least", measured >= bound, unit, digits)


def at_most(what: str, measured: float, bound: float, *, unit: str = "",
            digits: int = 3) -> None:
    """Claim that ``measured`` is at most ``bound``; the sentence says both."""
    _bounded(what, measured, bound, "at most", measured <= bound, unit, digits)


def _bounded(what, measured, bound, words: str, holds: bool, unit: str, digits: int) -> None:
    _finite(what, measured, bound)
    claim(f"{what} is {words} {bound:g}{unit}", holds,
          numbers=f"measured {measured:.{digits}g}{unit}")


def every(what: str, cases: dict, holds) -> None:
    """Claim ``what`` of every case of ``cases`` ({label: value}), naming each label, so the
    sentence says exactly which cases were checked; ``holds(value)`` tests one."""
    failed = [label for label, value in cases.items() if not holds(value)]
    if not cases:
        raise ClaimCannotFail(f"the claim '{what}' is tested on no case")
    claim(f"{what}, for every one of {', '.join(map(str, cases))}", not failed,
          numbers=f"false for {', '.join(map(str, failed))}" if failed else "")


def within(what: str, measured: float, expected: float, tolerance: float, *,
           unit: str = "") -> None:
    """Claim that ``measured`` is within ``tolerance`` (a fraction, 0.15 for 15 %) of
    ``expected``, and say by how much."""
    _finite(what, measured, expected, tolerance)
    off = measured / expected - 1 if expected else float("inf")
    numbers = f"{measured:.4g}{unit} vs {expected:.4g}{unit}, {off:+.1%}"
    claim(f"{what} is within {tolerance:.0%} of the prediction", abs(off) <= tolerance,
          numbers=numbers)
