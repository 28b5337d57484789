"""tools/build_site.py: the static site of notebook 01 has an index, its plots embedded as
images (the widgets' plots included, frozen as they were left), and folded solutions."""
import re
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import build_site  # noqa: E402  (tools/ is not a package)

NB01 = ROOT / "notebooks" / "01-why-scale.ipynb"


@pytest.mark.timeout(120)
def test_site_of_notebook_01(tmp_path):
    report = build_site.build(tmp_path, ["01-why-scale"])
    assert report["pages"] == ["01-why-scale.html"] and report["warnings"] == []
    index = (tmp_path / "index.html").read_text()
    assert 'href="01-why-scale.html"' in index and "Why scale" in index

    nb = nbformat.read(NB01, as_version=4)
    static = sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code"
                 for o in c.outputs)
    widgets = sum(build_site.WIDGET_VIEW in o.get("data", {}) for c in nb.cells
                  if c.cell_type == "code" for o in c.outputs)
    solutions = sum("solution" in c.metadata.get("tags", []) for c in nb.cells)
    assert static >= 1 and widgets >= 1 and solutions >= 1

    page = (tmp_path / "01-why-scale.html").read_text()
    images = re.findall(r'<img[^>]+src="data:image/png;base64,', page)
    assert len(images) >= static + widgets, "a static or widget plot is missing"
    assert page.count('class="static-widget"') == widgets
    assert build_site.WIDGET_VIEW not in page and "IPY_MODEL_" not in page
    assert page.count('<details class="solution">') == solutions
    assert 'href="index.html"' in page


def test_a_widget_with_no_plot_anywhere_is_reported():
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("w")
    cell.outputs = [nbformat.v4.new_output(
        "execute_result", data={build_site.WIDGET_VIEW: {"model_id": "abc"}, "text/plain": "w"},
        execution_count=1)]
    nb.cells = [cell]
    nb.metadata["widgets"] = {build_site.WIDGET_STATE: {"state": {"abc": {
        "model_name": "VBoxModel", "state": {"children": []}}}}}
    warnings = build_site.freeze_widgets(nb)
    assert warnings == ["cell 0: the widget stored no plot, and no static plot stands before it"]
    assert "widgets" not in nb.metadata


def test_lessons_link_to_each_others_pages_and_the_index_renders_markdown():
    built = {"02-data-parallelism.html", "07-deep-dive-ddp-buckets.html"}
    body = ('<a href="02-data-parallelism.ipynb">02</a> <a href="02-data-parallelism.ipynb#4-'
            'Buckets">4</a> <a href="13-deep-dive-mixture-of-experts.ipynb">13</a>')
    assert build_site.link_pages(body, built) == (
        '<a href="02-data-parallelism.html">02</a> <a href="02-data-parallelism.html#4-Buckets">'
        '4</a> <a href="13-deep-dive-mixture-of-experts.ipynb">13</a>')   # 13 is not built
    nb = nbformat.read(ROOT / "notebooks" / "07-deep-dive-ddp-buckets.ipynb", as_version=4)
    blurb = build_site.link_pages(build_site.markdown_inline(build_site.title_and_blurb(nb)[1]),
                                  built)
    assert '<a href="02-data-parallelism.html">02 · Data parallelism</a>' in blurb
    assert "](" not in blurb and not blurb.startswith("<p>")
    long = "x " * 140 + "[a link that would be cut](02-data-parallelism.ipynb) **bold words here**"
    cell = nbformat.v4.new_markdown_cell("# Title\n\n" + long)
    cut = build_site.title_and_blurb(nbformat.v4.new_notebook(cells=[cell]))[1]
    assert cut.endswith(" ...") and "[" not in cut and "*" not in cut
