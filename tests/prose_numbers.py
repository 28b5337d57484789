"""Every number a student reads in a notebook's prose is tied to where it comes from.

A number in a markdown cell must be one of:

* **printed**: a value printed by a code cell above it in the same section (a ``##``
  heading starts one), compared at the prose's rounding (``57 %`` matches a printed
  ``56.8%``; ``1,088`` a printed ``1087.6``);
* **a setting**: a literal in the source of a code cell above it in the same section (the
  rank count, the size, the step the cell runs with);
* **published**: a figure of ``lessonlib.references.PUBLISHED`` whose source the cell names
  (``GPT-3``, ``Megatron-LM 2021``, ...), so editing the number alone leaves it unlisted.

Not counted as numbers: a heading's own numbering, small integers (16 or less) that are not
a percentage or a ratio, years, clock times (``06:56``), what follows ``§``, ``Table``,
``Fig.``, ``Eq.``, ``issue`` or ``#``, anything inside backticks (code), and what an
``<!-- numbers: ... -->`` comment names with its reason (a derivation the cell itself
spells out, say). ``unchecked(nb)`` lists the rest: the numbers nothing backs.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from lessonlib.references import PUBLISHED

NUMBER = re.compile(r"(?<![\w.,§/:^-])(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(?!(?!x\b)[\w:]|[.,]\d)")
RATIO_OR_SHARE = re.compile(r"\s*(%|x\b|×|times\b)")
NOT_A_QUANTITY = re.compile(r"(§|\bTables?|\bFig(?:ure)?s?\.?|\bEqs?\.|\bissues?|#|\bAlg\.|"
                            r"\bsteps?|\bcell|\bcells|\bsection|\bSection|\bitem|\bexercise|"
                            r"\bExercise|\bnotebook|\blesson)\s*$")
HEADING = re.compile(r"^#{1,6}\s+[\d.]+\s", re.M)
CODE_SPAN = re.compile(r"`[^`]*`")
EXCUSED = re.compile(r"<!--\s*numbers:(.*?)-->", re.S)
SECTION = re.compile(r"^#{1,2}\s", re.M)


@dataclass(frozen=True)
class Number:
    cell: int
    text: str           # as written: "1,088", "57", "0.3"
    value: float
    decimals: int
    context: str        # the words around it, for the message

    def __str__(self):
        return f"cell {self.cell}: {self.text!r} in '...{self.context}...'"


def numbers_in(text: str, cell: int = 0) -> list[Number]:
    """The numbers of a markdown cell that count (see the module's docstring)."""
    excused = {n.strip() for m in EXCUSED.finditer(text) for n in
               re.findall(r"[\d,.]+\d", m.group(1).split("because")[0])}
    text = EXCUSED.sub(lambda m: " " * len(m.group(0)), text)
    text = CODE_SPAN.sub(lambda m: " " * len(m.group(0)), text)
    text = HEADING.sub(lambda m: m.group(0)[0] + " " * (len(m.group(0)) - 1), text)
    found = []
    for m in NUMBER.finditer(text):
        whole, frac, value = m.group(1), m.group(2) or "", _value(m)
        decimals = len(frac) - 1 if frac else 0
        before, after = text[max(0, m.start() - 12):m.start()], text[m.end():m.end() + 8]
        small = decimals == 0 and value <= 16 and not RATIO_OR_SHARE.match(after)
        year = decimals == 0 and 1950 <= value <= 2100 and "," not in whole
        if small or year or NOT_A_QUANTITY.search(before) or m.group(0) in excused:
            continue
        context = text[max(0, m.start() - 30):m.end() + 20].replace("\n", " ")
        found.append(Number(cell, m.group(0), value, decimals, context))
    return found


def _value(match) -> float:
    return float(match.group(1).replace(",", "") + (match.group(2) or ""))


def _values(text: str) -> list[float]:
    return [_value(m) for m in NUMBER.finditer(text)]


def printed_text(cell) -> str:
    """What a code cell printed: streams, and the text and markdown of its displays."""
    parts = []
    for out in cell.get("outputs", []):
        if "text" in out:
            parts.append(out["text"] if isinstance(out["text"], str) else "".join(out["text"]))
        for kind in ("text/plain", "text/markdown", "text/html"):
            data = out.get("data", {}).get(kind)
            if data:
                parts.append(data if isinstance(data, str) else "".join(data))
    return "\n".join(parts)


def is_printed(n: Number, printed: list[float]) -> bool:
    return any(abs(round(v, n.decimals) - n.value) < 1e-9 for v in printed)


def published_for(text: str) -> set[float]:
    """The published figures whose source the cell names."""
    return {v for source in PUBLISHED.values() if any(name in text for name in source.names)
            for v in source.figures}


def classify(nb) -> list[tuple[Number, str]]:
    """Every counted number of ``nb``'s markdown cells with what backs it: "printed",
    "setting", "published" or "unchecked" (nothing)."""
    printed, settings, out = [], set(), []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            printed += _values(printed_text(cell))
            settings.update(_values(cell.source))
            continue
        if cell.cell_type != "markdown":
            continue
        heading = SECTION.search(cell.source)
        parts = ([cell.source[:heading.start()], None, cell.source[heading.start():]]
                 if heading else [cell.source])
        for part in parts:
            if part is None:                          # a new section starts here
                printed, settings = [], set()
                continue
            out += [(n, _kind(n, printed, settings, cell.source)) for n in numbers_in(part, i)]
    return out


def unchecked(nb) -> list[Number]:
    """The numbers of ``nb``'s markdown cells that nothing above them backs."""
    return [n for n, kind in classify(nb) if kind == "unchecked"]


def _kind(n: Number, printed: list[float], settings: set[float], text: str) -> str:
    if is_printed(n, printed):
        return "printed"
    if n.value in settings:
        return "setting"
    return "published" if n.value in published_for(text) else "unchecked"


# ---------------------------------------------------------------- claims' bounds
BOUND_WORDS = {"at_least": (2, "bound", "is at least {:g}"),
               "at_most": (2, "bound", "is at most {:g}"),
               "within": (3, "tolerance", "within {:.0%}")}


def claim_bounds(source: str) -> list[tuple[str, float, tuple[int, int]]]:
    """Each ``at_least``/``at_most``/``within`` call of a code cell with a literal bound:
    (the words its printed sentence must hold, the bound, where the literal is: line, col)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:                       # a cell with IPython magics: no claims there
        return []
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in BOUND_WORDS):
            continue
        index, keyword, words = BOUND_WORDS[node.func.id]
        arg = (node.args[index] if len(node.args) > index else
               next((k.value for k in node.keywords if k.arg == keyword), None))
        if isinstance(arg, ast.Constant) and isinstance(arg.value, (int, float)):
            found.append((words.format(arg.value), arg.value, (arg.lineno, arg.col_offset)))
    return found


def bounds_not_printed(nb) -> list[str]:
    """The claims whose printed sentence does not say the bound their code tests (the code
    was edited and not run again, or the sentence was written by hand)."""
    return [f"cell {i}: {words!r} not in its printed claim" for i, cell in enumerate(nb.cells)
            if cell.cell_type == "code"
            for words, _, _ in claim_bounds(cell.source)
            if not re.search(re.escape(words) + r"(?![\d.e])", printed_text(cell))]
