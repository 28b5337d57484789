"""One voice for every exercise checker: a ``Verdict``, shown as the checker cell's output.

A checker never prints; it returns a ``Verdict`` with one of three states, and the notebook
shows it because the checker call is the last line of its cell:

    ✅ Correct: ...       ok is True   (the answer is right, and why)
    ❌ Not yet: ...       ok is False  (what is wrong, and a hint)
    ✏️ Your turn: ...     ok is None   (the stub is untouched: None, or NotImplementedError)

``bool(verdict)`` is True only when the answer is right, so a solution cell (and a test)
can ``assert`` it. ``str(verdict)`` is the text a student reads.

    from lessonlib.exercises.verdict import correct, not_yet, your_turn
    correct("16 bytes per parameter")      # -> ✅ Correct: 16 bytes per parameter
"""
from __future__ import annotations

LABELS = {True: "✅ Correct", False: "❌ Not yet", None: "✏️ Your turn"}


class Verdict:
    """A checker's answer to the student: ``ok`` (True, False, or None when not answered yet)
    and ``text``, the explanation."""

    __slots__ = ("ok", "text")

    def __init__(self, ok: bool | None, text: str):
        if ok not in LABELS:
            raise ValueError(f"ok must be True, False or None; got {ok!r}")
        self.ok, self.text = ok, text.strip()

    def __bool__(self) -> bool:
        return self.ok is True

    def __str__(self) -> str:
        return f"{LABELS[self.ok]}: {self.text}"

    __repr__ = __str__

    def __contains__(self, words: str) -> bool:
        return words in str(self)

    def _repr_pretty_(self, printer, cycle):  # IPython shows the plain text, no quotes
        printer.text(str(self))


def correct(text: str) -> Verdict:
    return Verdict(True, text)


def not_yet(text: str) -> Verdict:
    return Verdict(False, text)


def your_turn(text: str) -> Verdict:
    return Verdict(None, text)


def unanswered(name: str = "your answer") -> Verdict:
    """The verdict for an answer the student has not filled in yet."""
    return your_turn(f"{name} is still None: replace None with your answer and run the cell.")


def unwritten(name: str) -> Verdict:
    """The verdict for a function that still raises ``NotImplementedError``."""
    return your_turn(f"{name} still raises NotImplementedError: write its body in place of "
                     f"that line and run the cell again.")


def number(answer) -> float | None:
    """The student's answer as a number, or None when it is not one (a string, a list...)."""
    try:
        return float(answer)
    except (TypeError, ValueError):
        return None


def still_a_stub(error_text: str) -> bool:
    """Whether an error's text (a traceback, a ``RankError`` message) ends in the stub's
    ``NotImplementedError``: the student has not written the function yet."""
    lines = [line.strip() for line in str(error_text).splitlines() if line.strip()]
    return bool(lines) and lines[-1].startswith("NotImplementedError")
