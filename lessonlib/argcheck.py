"""Settings checked before anything runs: one validator for every whole-number setting.

What it teaches: bad input gets one clear line (which setting, which value, what would work)
before any process starts. Every module that takes a count (ranks, stages, micro-batches,
layers, steps) checks it here, so the rule and its wording live in one place.

Laptop:  ``python -c "from lessonlib.argcheck import positive_int; positive_int('p', 0)"``
GPU box: the same; pure Python.
"""
from __future__ import annotations

import math
import operator


def positive_int(name: str, value, *, most: int | None = None, what: str = "") -> int:
    """``value`` as an ``int`` if it is a whole number >= 1 (and <= ``most``), else ValueError.

    Accepts any integer type (``numpy.int64`` included) but not ``bool`` or a float; ``what``
    says what the number counts, e.g. ``"the number of pipeline stages"``."""
    try:
        number = None if isinstance(value, bool) else operator.index(value)
    except TypeError:
        number = None
    if number is None or number < 1 or (most is not None and number > most):
        bound = f" at most {most}" if most is not None else ""
        counts = f" ({what})" if what else ""
        raise ValueError(f"{name}={value!r} must be a positive integer{bound}{counts}, e.g. 2")
    return number


def positive_number(name: str, value, *, most: float | None = None, example: str = "1") -> float:
    """``value`` as a ``float`` if it is finite and > 0 (and <= ``most``), else ValueError."""
    try:
        number = None if isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        number = None
    if number is None or not math.isfinite(number) or number <= 0 \
            or (most is not None and number > most):
        bound = f" and at most {most:g}" if most is not None else ""
        raise ValueError(f"{name}={value!r} must be a finite positive number{bound}, "
                         f"e.g. {example}")
    return number
