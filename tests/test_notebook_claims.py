"""Every sentence that states a measured result is backed by a claim the notebook checks.

A heuristic, honest about what it sees: a markdown cell right after a measuring code cell
(one marked ``# NBVAL_IGNORE_OUTPUT``, whose numbers change from run to run) that uses a
comparison word or a number with a unit is taken to state a measured result; the code cell
before it must then check that result with ``lessonlib.claims`` (``claim(`` or
``within(``), which prints the sentence when it holds and raises when it does not. A cell
may instead say why it states no measured result, in an invisible HTML comment
``<!-- no measured claim: ... -->``. What it cannot see: a claim two cells away from its
numbers, a comparison in words it does not list, a plot whose shape the prose describes.

The second half shows the mechanism can fail: a notebook whose claim is false stops with
ClaimFailed when executed, as nbval would see it in CI.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import jupytext
import nbformat
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import notebooks  # noqa: E402  (tools/notebooks.py)

COMPARISON = re.compile(
    r"\b(faster|slower|beats?|above|below|within|more than|less than|fewer than|twice|"
    r"off by|exceeds?|outruns?|closer)\b|\d+(\.\d+)?\s*(%|x\b|ms\b|MiB\b|GB\b|s\b)", re.I)
EXCUSED = "<!-- no measured claim:"
CHECKED = re.compile(r"\b(claim|within)\(")


def unbacked(nb) -> list[tuple[int, list[str]]]:
    """(cell index, the words that look like a measured statement) for each markdown cell
    after a measuring cell that no claim backs."""
    found = []
    for i, cell in enumerate(nb.cells[1:], 1):
        before = nb.cells[i - 1]
        measuring = before.cell_type == "code" and "NBVAL_IGNORE_OUTPUT" in before.source
        if cell.cell_type != "markdown" or not measuring or EXCUSED in cell.source:
            continue
        if CHECKED.search(before.source):
            continue
        words = [m.group(0) for m in COMPARISON.finditer(cell.source)]
        if words:
            found.append((i, words[:4]))
    return found


PAIRS = notebooks.pairs()


@pytest.mark.parametrize("py", [py for py, _ in PAIRS], ids=[py.stem[:2] for py, _ in PAIRS])
def test_every_measured_sentence_is_backed_by_a_claim(py):
    missing = unbacked(jupytext.read(py))
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
        "from lessonlib.claims import claim\n"
        "ring_ms, server_ms = 9.0, 3.0   # a re-run where the ring lost\n"
        "claim('the ring beats the server at 16 MiB', ring_ms < server_ms)")])
    with pytest.raises(CellExecutionError, match="ClaimFailed"):
        NotebookClient(nb, timeout=60, kernel_name="python3").execute()
