"""The in-kernel widget check (tests/widget_moves.py, added to nbval's notebooks by the root
conftest.py): it passes a widget whose plot follows its controls, fails one whose plot does
not, waits for a live one, and every notebook with a widget is moved by it or by the browser."""
from pathlib import Path

import ipywidgets as w
import matplotlib
import pytest

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

import widget_moves  # noqa: E402
from lessonlib.viz.live import live_explorer  # noqa: E402
from lessonlib.viz.widgets import explorer  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _figure(label):
    fig, ax = plt.subplots(figsize=(2, 1))
    ax.set_title(str(label))
    return fig


@pytest.fixture
def only(monkeypatch):
    """Only the boxes a test makes count as the kernel's widgets."""
    def keep(*boxes):
        monkeypatch.setattr(widget_moves, "interact_boxes", lambda: list(boxes))
    return keep


def test_a_plot_that_follows_its_controls_passes(only):
    only(explorer(lambda n, kind: _figure(f"{n} {kind}"), n=w.IntSlider(10, 0, 10),
                  kind=w.Dropdown(options=["a", "b"])))
    [line] = widget_moves.move_every_widget()
    assert "n 10 -> 7" in line               # at its end a slider moves left


def test_a_plot_that_ignores_its_first_control_is_moved_by_the_next(only, monkeypatch):
    monkeypatch.setitem(widget_moves.PATIENCE_S, "plain", 0.5)
    only(explorer(lambda n, kind: _figure(kind), n=w.IntSlider(0, 0, 10),
                  kind=w.Dropdown(options=["a", "b"])))
    [line] = widget_moves.move_every_widget()
    assert "kind -> 'b'" in line


def test_a_plot_that_never_changes_fails_and_says_what_was_tried(only, monkeypatch):
    monkeypatch.setitem(widget_moves.PATIENCE_S, "plain", 0.2)
    only(explorer(lambda n: _figure("same"), n=w.IntSlider(0, 0, 10)))
    with pytest.raises(AssertionError, match=r"widget 1's plot never changed; tried \['n 0 -> 3'\]"):
        widget_moves.move_every_widget()


def test_a_live_widget_is_given_the_time_of_its_run(only):
    box = live_explorer(lambda p: p * 10, lambda result, p: _figure(result),
                        p=w.IntSlider(2, 1, 8))
    only(box)
    [line] = widget_moves.move_every_widget()
    assert line.startswith("widget 1 (live): p 2 -> 5")


def test_no_widget_at_all_fails(only):
    only()
    with pytest.raises(AssertionError, match="shows no interactive widget"):
        widget_moves.move_every_widget()


def test_every_notebook_with_a_widget_is_moved_in_the_browser_or_in_its_kernel():
    import nbformat
    import test_browser
    shown = [p for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]-*.ipynb"))
             if widget_moves.widget_cells(nbformat.read(p, as_version=4))]
    browser = {p.stem[:2] for p in test_browser.NOTEBOOKS}
    in_kernel = {p.stem[:2] for p in shown} - set(widget_moves.BROWSER_NOTEBOOKS)
    assert {"06", "07", "09", "11", "14"} <= in_kernel, in_kernel
    assert browser | in_kernel == {p.stem[:2] for p in shown}
