"""What a notebook asks of its reader is what it says: the core notebooks stay within 1,500
words of prose and 45 cells, and a stated reading time is the one its text, code and output
take (200 words, 10 lines of code or 20 lines of output a minute). Pure: reads the committed
notebooks."""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import nbformat
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import notebooks  # noqa: E402  (tools/notebooks.py)

PAIRS = notebooks.pairs()
CORE = [nb for _, nb in PAIRS if nb.name[:2] <= "05"]
STATED = re.compile(r"[Aa]bout (\d+) minutes to read")


def prose_words(nb) -> int:
    return sum(len(re.sub(r"<!--.*?-->", "", c.source, flags=re.S).split())
               for c in nb.cells if c.cell_type == "markdown")


def reading_minutes(nb) -> float:
    """Prose at 200 words a minute, code at 10 lines (comments and blank lines aside), the
    printed output at 20 lines."""
    code = sum(1 for c in nb.cells if c.cell_type == "code" for line in c.source.splitlines()
               if line.strip() and not line.lstrip().startswith("#"))
    output = sum(len((o.get("text") or "".join(o.get("data", {}).get("text/plain", "")))
                     .splitlines()) for c in nb.cells for o in c.get("outputs", []))
    return prose_words(nb) / 200 + code / 10 + output / 20


@pytest.mark.parametrize("ipynb", CORE, ids=[nb.name[:2] for nb in CORE])
def test_a_core_notebook_stays_short(ipynb):
    nb = nbformat.read(ipynb, as_version=4)
    assert prose_words(nb) <= 1500, f"{ipynb.name}: {prose_words(nb)} words of prose"
    assert len(nb.cells) <= 45, f"{ipynb.name}: {len(nb.cells)} cells"


@pytest.mark.parametrize("ipynb", [nb for _, nb in PAIRS], ids=[nb.name[:2] for _, nb in PAIRS])
def test_a_stated_reading_time_is_the_measured_one(ipynb):
    nb = nbformat.read(ipynb, as_version=4)
    stated = [int(m) for c in nb.cells if c.cell_type == "markdown"
              for m in STATED.findall(c.source)]
    measured = reading_minutes(nb)
    for minutes in stated:
        assert abs(minutes - measured) <= max(5, 0.25 * measured), (
            f"{ipynb.name} says about {minutes} minutes; its prose, code and output take "
            f"{measured:.0f} (200 words, 10 code lines or 20 output lines a minute)")


SHOW = re.compile(r"(?<![.\w])show\(")


@pytest.mark.parametrize("ipynb", CORE, ids=[nb.name[:2] for nb in CORE])
def test_a_core_notebook_shows_the_library_code_it_runs(ipynb):
    """At least one cell displays lessonlib's own code (``viz.source.show``), so the lesson's
    core is on the student's screen, not only its results."""
    nb = nbformat.read(ipynb, as_version=4)
    assert any(SHOW.search(c.source) for c in nb.cells if c.cell_type == "code"), ipynb.name


def deep_indexes(source: str) -> list[str]:
    """Expressions of a cell's code that index three levels deep, ``x[a][b][c]``: a report
    read by keys a student has to know, where a record would name its fields."""
    try:
        tree = ast.parse(source)
    except SyntaxError:                    # a magic: not Python
        return []
    inner = {id(n.value) for n in ast.walk(tree)
             if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Subscript)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and id(node) not in inner:
            depth, value = 1, node.value
            while isinstance(value, ast.Subscript):
                depth, value = depth + 1, value.value
            if depth >= 3:
                found.append(ast.unparse(node))
    return found


@pytest.mark.parametrize("ipynb", [nb for _, nb in PAIRS], ids=[nb.name[:2] for _, nb in PAIRS])
def test_no_notebook_line_indexes_a_report_three_levels_deep(ipynb):
    nb = nbformat.read(ipynb, as_version=4)
    deep = [expr for c in nb.cells if c.cell_type == "code" for expr in deep_indexes(c.source)]
    assert not deep, f"{ipynb.name}: read these through a record's fields: {deep}"


TAKES_ANY_NUMBER = {"show", "max", "min", "print", "zip", "display"}   # their own *args


def positional_crowds(source: str) -> list[str]:
    """Calls of a cell's code that pass more than three arguments by position."""
    try:
        tree = ast.parse(source)
    except SyntaxError:                    # a magic: not Python
        return []
    return [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Call)
            and len(n.args) > 3 and not any(isinstance(a, ast.Starred) for a in n.args)
            and getattr(n.func, "id", getattr(n.func, "attr", "")) not in TAKES_ANY_NUMBER]


@pytest.mark.parametrize("ipynb", [nb for _, nb in PAIRS], ids=[nb.name[:2] for _, nb in PAIRS])
def test_a_call_with_more_than_three_arguments_names_them(ipynb):
    nb = nbformat.read(ipynb, as_version=4)
    crowded = [call for c in nb.cells if c.cell_type == "code"
               for call in positional_crowds(c.source)]
    assert not crowded, f"{ipynb.name}: pass these by keyword: {crowded}"
