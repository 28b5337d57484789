"""A sentence quoted from a real system is the source's, word for word: every quote in
``lessonlib.references.QUOTES`` is printed as listed by the notebooks that name it, every
passage those notebooks put in quotation marks is one of the listed quotes, and a quote from
an installed package (torch, torchao) is still in that package's file.

Pure: reads the committed notebooks and the installed files, imports neither torch nor
torchao."""
from __future__ import annotations

import functools
import importlib.util
import re
import sys
from pathlib import Path

import nbformat
import pytest

from lessonlib.references import QUOTES

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import notebooks  # noqa: E402  (tools/notebooks.py)

BY_NUMBER = {ipynb.name[:2]: ipynb for _, ipynb in notebooks.pairs()}
QUOTING = sorted({n for q in QUOTES.values() for n in q.notebooks})
PASSAGE = re.compile(r'"([^"]+)"')      # a passage in quotation marks
COMMENT = re.compile(r"<!--.*?-->", re.S)
MARKUP = re.compile(r"<!--.*?-->|<[^>]*>", re.S)     # comments and HTML tags (attributes)


def flat(text: str) -> str:
    return " ".join(text.split())


@functools.cache
def printed(number: str) -> str:
    """What a student reads in a notebook: its markdown (comments aside) and its outputs."""
    nb = nbformat.read(BY_NUMBER[number], as_version=4)
    parts = [COMMENT.sub("", c.source) for c in nb.cells if c.cell_type == "markdown"]
    for c in nb.cells:
        for out in c.get("outputs", []):
            parts.append(out.get("text", "") + "".join(out.get("data", {}).get("text/plain", "")))
    return flat("\n".join(parts))


@pytest.mark.parametrize("name", sorted(QUOTES))
def test_a_quote_is_printed_as_listed(name):
    quote = QUOTES[name]
    for number in quote.notebooks:
        assert quote.text in printed(number), (
            f"notebook {number} no longer prints {name} as lessonlib/references.py lists it "
            f"({quote.source}): {quote.text!r}")


@pytest.mark.parametrize("number", QUOTING)
def test_every_quoted_passage_is_a_listed_quote(number):
    texts = [q.text for q in QUOTES.values()]
    nb = nbformat.read(BY_NUMBER[number], as_version=4)
    for at, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        for passage in PASSAGE.findall(flat(MARKUP.sub("", cell.source))):
            if len(passage.split()) >= 4:
                assert any(passage in text for text in texts), (
                    f"notebook {number}, cell {at} quotes {passage!r}, which is not (part of) "
                    f"a quote in lessonlib/references.py QUOTES")


@pytest.mark.parametrize("name", sorted(n for n, q in QUOTES.items() if q.installed))
def test_a_quote_from_an_installed_package_is_in_its_file(name):
    quote = QUOTES[name]
    package, *inner = quote.installed.split(".")
    spec = importlib.util.find_spec(package)        # finds the package without importing it
    assert spec is not None and spec.origin, f"{package} is not installed"
    path = Path(spec.origin).parent.joinpath(*inner).with_suffix(".py")
    assert quote.text in flat(path.read_text()), f"{path} no longer says {quote.text!r}"
