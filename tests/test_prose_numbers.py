"""Every number in a notebook's prose is printed above it, set by the code above it, or a
published figure of a source the cell names (tests/prose_numbers.py says how each is read);
and editing one number alone, of any of the three kinds, fails this test. Pure: reads the
committed notebooks and their outputs."""
from __future__ import annotations

import copy
import re
import sys
from pathlib import Path

import nbformat
import pytest

import prose_numbers as pn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import notebooks  # noqa: E402  (tools/notebooks.py)

PAIRS = notebooks.pairs()
IDS = [py.stem[:2] for py, _ in PAIRS]


def _read(ipynb):
    return nbformat.read(ipynb, as_version=4)


@pytest.mark.parametrize("ipynb", [nb for _, nb in PAIRS], ids=IDS)
def test_every_number_in_the_prose_is_backed(ipynb):
    missing = pn.unchecked(_read(ipynb))
    assert not missing, (f"{ipynb.name}: numbers that nothing printed, set or cited above "
                         "backs (print it, set it in the code, or list the published figure "
                         "in lessonlib/references.py and name its source):\n  "
                         + "\n  ".join(map(str, missing)))


def _edited(nb, number: pn.Number, factor: float):
    """``nb`` with ``number`` alone changed in its cell (the first time its context occurs)."""
    new = f"{number.value * factor + 1:,.{number.decimals}f}"
    new = new if "," in number.text else new.replace(",", "")
    out = copy.deepcopy(nb)
    cell = out.cells[number.cell]
    at = cell.source.find(number.text, max(0, cell.source.find(number.context[:8])))
    cell.source = cell.source[:at] + new + cell.source[at + len(number.text):]
    return out, new


@pytest.mark.parametrize("ipynb", [nb for _, nb in PAIRS], ids=IDS)
def test_editing_one_number_of_each_kind_alone_fails(ipynb):
    nb = _read(ipynb)
    by_kind = {}
    for number, kind in pn.classify(nb):
        by_kind.setdefault(kind, []).append(number)
    for kind, numbers in by_kind.items():
        if kind == "unchecked":
            continue
        number = numbers[len(numbers) // 2]                 # one of each kind, mid-notebook
        for factor in (1.37, 1.73, 2.9, 0.61):
            edited, new = _edited(nb, number, factor)
            if any(n.text == new for n in pn.unchecked(edited)):
                break
        else:
            pytest.fail(f"{ipynb.name}: {number} ({kind}) edited alone still passes")


def test_what_counts_as_a_number():
    text = ("### 2.1 Heading\nSee §3.3.2, Table 4 and issue 783, at 06:56, in 2024: "
            "`b = 4096` and 3 ranks, but 3 % and 1,088 GiB and 0.25 and 7x count."
            "<!-- numbers: 12345 because it is the sum above -->12345")
    assert [n.text for n in pn.numbers_in(text)] == ["3", "1,088", "0.25", "7"]


def test_a_number_is_backed_by_output_setting_or_citation_in_its_own_section():
    code = nbformat.v4.new_code_cell("steps = 240\nprint(f'{1087.6:.1f} GiB')")
    code.outputs = [nbformat.v4.new_output("stream", text="1087.6 GiB\n")]
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("## One"), code,
        nbformat.v4.new_markdown_cell("About 1,088 GiB after 240 steps; GPT-3 has 96 layers."),
        nbformat.v4.new_markdown_cell("## Two\nAgain 1,088 GiB and 240 steps, 96 layers.")])
    kinds = [(n.text, kind) for n, kind in pn.classify(nb)]
    assert kinds == [("1,088", "printed"), ("240", "setting"), ("96", "published"),
                     ("1,088", "unchecked"), ("240", "unchecked"), ("96", "unchecked")]


@pytest.mark.parametrize("ipynb", [nb for _, nb in PAIRS], ids=IDS)
def test_every_claims_printed_sentence_says_the_bound_its_code_tests(ipynb):
    nb = _read(ipynb)
    assert not pn.bounds_not_printed(nb), pn.bounds_not_printed(nb)
    for i, cell in enumerate(nb.cells):              # editing one bound alone fails it
        if cell.cell_type == "code" and pn.claim_bounds(cell.source):
            _, bound, (line, col) = pn.claim_bounds(cell.source)[0]
            lines = cell.source.split("\n")
            edited, new_lines, text = copy.deepcopy(nb), list(lines), lines[line - 1]
            col = len(text.encode()[:col].decode())      # ast counts UTF-8 bytes, not characters
            end = col + len(re.match(r"[\d.e+-]+", text[col:]).group(0))
            new_lines[line - 1] = text[:col] + repr(bound * 1.37 + 1) + text[end:]
            edited.cells[i].source = "\n".join(new_lines)
            assert pn.bounds_not_printed(edited), f"{ipynb.name} cell {i}: bound edit passes"
            break
