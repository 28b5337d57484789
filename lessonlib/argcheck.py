"""Settings checked before anything runs: one validator for every whole-number setting.

What it teaches: bad input gets one clear line (which setting, which value, what would work)
before any process starts. Every module that takes a count (ranks, stages, micro-batches,
layers, steps) checks it here, so the rule and its wording live in one place; every command
line of the course (the labs, the sweep) reads its flags with ``LabParser``, whose refusals
are that one line too, and whose numbers are bounded before any check sees them.

Laptop:  ``python -c "from lessonlib.argcheck import positive_int; positive_int('p', 0)"``
GPU box: the same; pure Python.
"""
from __future__ import annotations

import argparse
import math
import operator
import sys


def positive_int(name: str, value, *, most: int | None = None, what: str = "") -> int:
    """``value`` as an ``int`` if it is a whole number >= 1 (and <= ``most``), else ValueError.

    Accepts any integer type (``numpy.int64`` included) but not ``bool`` or a float; ``what``
    says what the number counts, e.g. ``"the number of pipeline stages"``."""
    if type(value) is int and value >= 1 and (most is None or value <= most):
        return value      # the common case, taken first: the planner checks ~100,000 layouts
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


LARGEST = 1e12  # no lab setting is a number beyond this; inf and 1e308 overflow in sizes
LARGEST_COUNT = 2 ** 31 - 1  # nor a whole number beyond a C int (threads, sizes, torch's dims)


def number(text: str) -> float:
    """A float flag's value: finite and at most ``LARGEST`` in size (NaN is left to the
    flag's own check, which names what would work)."""
    value = float(text)
    if abs(value) > LARGEST:
        raise argparse.ArgumentTypeError(f"{text!r} is beyond any setting a lab takes; give a "
                                         f"finite number, at most {LARGEST:g}")
    return value


def count(text: str) -> int:
    """An int flag's value: a whole number of at most ``LARGEST_COUNT`` in size (its sign is
    left to the flag's own check)."""
    value = int(text)
    if abs(value) > LARGEST_COUNT:
        raise argparse.ArgumentTypeError(f"{text!r} is beyond any count a lab takes; give a "
                                         f"whole number, at most {LARGEST_COUNT}")
    return value


class LabParser(argparse.ArgumentParser):
    """argparse, whose refusals are one line: the usage is printed for ``--help`` and for a
    flag it does not know (or a missing one), not above every bad value. A float flag
    takes only finite numbers (``number``), an int flag only a C int's (``count``)."""

    def add_argument(self, *names, **kwargs):
        if kwargs.get("type") in (float, int):
            kwargs["type"] = {float: number, int: count}[kwargs["type"]]
        return super().add_argument(*names, **kwargs)

    def error(self, message):
        if message.startswith(("unrecognized arguments", "the following arguments are",
                               "ambiguous option")):
            self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")
