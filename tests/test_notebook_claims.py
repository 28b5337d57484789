"""Every sentence that states a measured result is backed by a claim the notebook checks.

A heuristic, honest about what it sees: a markdown cell that follows a measuring code cell
of its section (one marked ``# NBVAL_IGNORE_OUTPUT``, whose numbers change from run to run)
and uses a comparison word or quotes a number printed above it is taken to state a
measured result; a code cell of that section above it must then check a
claim with ``lessonlib.instruments.claims``, which prints the sentence when it holds and raises when it
does not (the quoted numbers themselves are held to their outputs by
tests/test_prose_numbers.py). A cell may instead say why it states no measured result, in
an invisible HTML comment ``<!-- no measured claim: ... -->``. What it cannot see: a
comparison in words it does not list and with no number, a plot whose shape the prose
describes.

The second half shows the mechanism can fail: a notebook whose claim is false stops with
ClaimFailed when executed, as nbval would see it in CI.

And every bare ``claim(sentence, holds)`` in a notebook's source passes ``numbers=``, the
values it judged, so a reader sees what would make it false (``at_least``, ``at_most``,
``within`` and ``every`` write theirs from their bound or cases).
"""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import jupytext
import nbformat
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import notebooks  # noqa: E402  (tools/notebooks.py)
import prose_numbers  # noqa: E402  (tests/prose_numbers.py)

COMPARISON = re.compile(
    r"\b(faster|slower|beats?|above|below|within|more than|less than|fewer than|twice|"
    r"off by|exceeds?|outruns?|closer|nowhere near|double[sd]?|halve[sd]?|half as|"
    r"as (fast|slow|large|small) as|larger|smaller|wins?|loses?|cheaper|dearer)\b")
EXCUSED = "<!-- no measured claim:"
CHECKED = re.compile(r"\b(claim|within|at_least|at_most|every)\(")
SECTION = re.compile(r"^#{1,2}\s", re.M)


def unbacked(nb) -> list[tuple[int, list[str]]]:
    """(cell index, what looks like a measured statement) for each markdown cell that
    follows a measuring cell of its section (``##`` to ``##``) while no code cell of that
    section above it checks a claim. A measured statement is a comparison word or a number
    the cell quotes from a printed output (tests/prose_numbers.py), not a keyword alone."""
    quoted = {}                                 # cell: the numbers it quotes from outputs
    for n, kind in prose_numbers.classify(nb):
        if kind == "printed":
            quoted.setdefault(n.cell, []).append(n.text)
    found, measuring, checked = [], False, False
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            measuring |= "NBVAL_IGNORE_OUTPUT" in cell.source
            checked |= bool(CHECKED.search(cell.source))
            continue
        if SECTION.search(cell.source):
            measuring = checked = False
        if cell.cell_type != "markdown" or not measuring or checked or EXCUSED in cell.source:
            continue
        words = [m.group(0) for m in COMPARISON.finditer(cell.source)] + quoted.get(i, [])
        if words:
            found.append((i, words[:4]))
    return found


PAIRS = notebooks.pairs()


def bare_claims(nb) -> list[tuple[int, str]]:
    """(cell index, the call) for each ``claim(...)`` of a code cell that passes no
    ``numbers=``. IPython's ``%`` and ``!`` lines are blanked before parsing; a cell that
    still does not parse is returned as (index, "SyntaxError: ...") rather than skipped."""
    found = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        source = "\n".join("" if line.lstrip().startswith(("%", "!")) else line
                           for line in cell.source.splitlines())
        try:
            tree = ast.parse(source)
        except SyntaxError as error:
            found.append((i, f"SyntaxError: {error}"))
            continue
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call)
                    and getattr(node.func, "id", getattr(node.func, "attr", None)) == "claim"
                    and not any(k.arg == "numbers" for k in node.keywords)):
                found.append((i, ast.get_source_segment(source, node)))
    return sorted(found)


@pytest.mark.parametrize("py", [py for py, _ in PAIRS], ids=[py.stem[:2] for py, _ in PAIRS])
def test_every_claim_shows_the_numbers_it_judged(py):
    bare = bare_claims(jupytext.read(py))
    assert not bare, (f"{py.name}: claims that print no numbers= (pass the values judged, or "
                      f"use every/at_least/at_most/within): {bare}")


def test_a_bare_claim_is_found():
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("claim('in prose, not code', ok)"),
        nbformat.v4.new_code_cell("%matplotlib inline\n"
                                  "claim('shown', ok, numbers=f'{x} of {y}')\n"
                                  "claims.claim('bare, through the module', ok)\n"
                                  "every('a case holds', cases, bool)"),
        nbformat.v4.new_code_cell("for c in cases:\n    claim(f'case {c}', c > 0)"),
        nbformat.v4.new_code_cell("claim('unfinished', ok")])
    bare = bare_claims(nb)
    assert bare[:2] == [(1, "claims.claim('bare, through the module', ok)"),
                        (2, "claim(f'case {c}', c > 0)")]
    assert len(bare) == 3 and bare[2][0] == 3 and bare[2][1].startswith("SyntaxError")


@pytest.mark.parametrize("py", [py for py, _ in PAIRS], ids=[py.stem[:2] for py, _ in PAIRS])
def test_every_measured_sentence_is_backed_by_a_claim(py):
    missing = unbacked(nbformat.read(py.parent.parent / f"{py.stem}.ipynb", as_version=4))
    assert not missing, (f"{py.name}: markdown cells {missing} state what looks like a "
                         "measured result after a measuring cell that checks no claim")


def test_the_heuristic_sees_an_unbacked_sentence():
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("# NBVAL_IGNORE_OUTPUT\nt = measure()"),
        nbformat.v4.new_markdown_cell("The ring is twice as fast here."),
        nbformat.v4.new_code_cell("# NBVAL_IGNORE_OUTPUT\nclaim('the ring wins', t < 1)"),
        nbformat.v4.new_markdown_cell("As the line above says, the ring is faster."),
    ])
    assert unbacked(nb) == [(1, ["twice"])]


@pytest.mark.timeout(120)
def test_a_false_claim_stops_the_notebook():
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "from lessonlib.instruments.claims import claim\n"
        "ring_ms, server_ms = 9.0, 3.0   # a re-run where the ring lost\n"
        "claim('the ring beats the server at 16 MiB', ring_ms < server_ms)")])
    with pytest.raises(CellExecutionError, match="ClaimFailed"):
        NotebookClient(nb, timeout=60, kernel_name="python3").execute()
