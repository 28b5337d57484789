"""Every widget of a notebook moved in its own kernel, after nbval has run all its cells.

The browser test (tests/test_browser.py) opens the core notebooks in JupyterLab and moves
their widgets as a student would. What a front end adds (the widget manager, the comm, the
page) is the same for every notebook; what differs from one notebook to the next is on the
kernel's side: each box's controls, the callbacks they are wired to and the plot those draw.
So for every other notebook with a widget (the deep dives), this runs in the kernel that
nbval has just used for every cell, where the widgets already stand: each box that carries
ipywidgets' ``widget-interact`` class (every lesson's widget, ``viz.widgets.explorer`` and
``viz.live.live_explorer``) gets its controls moved one at a time, as the browser test moves
them (a dropdown to its next option, a slider three steps right, or left at its end), until
its plot changes. Nothing is re-run: the measured runs the widgets read are nbval's.

``conftest.py`` at the repository root adds the item "widgets respond" after the last cell
of each such notebook; ``BROWSER_NOTEBOOKS`` says which ones the browser takes instead.
"""
from __future__ import annotations

import time

BROWSER_NOTEBOOKS = ("01", "02", "03", "04", "05")   # the core: moved in JupyterLab
PATIENCE_S = {"plain": 15.0, "live": 90.0}   # a live widget re-runs ranks for each move
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def widget_cells(notebook) -> list[int]:
    """Indices (among code cells) of the cells of a stored notebook (nbformat) that show an
    interactive widget, by their stored output or by their source."""
    code = [c for c in notebook.cells if c.cell_type == "code"]
    return [i for i, c in enumerate(code)
            if any(WIDGET_VIEW in o.get("data", {}) for o in c.get("outputs", []))
            or "widget(" in c.source or "interact" in c.source]


def _walk(widget):
    yield widget
    for child in getattr(widget, "children", ()):
        yield from _walk(child)


def interact_boxes() -> list:
    """The lesson widgets standing in this kernel, in the order they were made (ipywidgets
    keeps every open widget in ``_instances``)."""
    import ipywidgets as w
    from ipywidgets.widgets.widget import _instances
    return [x for x in list(_instances.values())
            if isinstance(x, w.Box) and "widget-interact" in x._dom_classes]


def _controls(box) -> list:
    import ipywidgets as w
    movable = (w.widgets.widget_selection._Selection, w.widgets.widget_int._Int,
               w.widgets.widget_float._Float)
    return [c for c in _walk(box.children[0]) if isinstance(c, movable) and not c.disabled]


def move(control) -> str:
    """Change one control as the browser test does; returns what was done."""
    if hasattr(control, "options"):
        values = [v for _, v in control._options_full]   # (label, value) of every option
        index = (values.index(control.value) + 1) % len(values)
        control.value = values[index]
        return f"{control.description} -> {control.value!r}"
    before, step = control.value, getattr(control, "step", None) or 1
    low, high = getattr(control, "min", before - 3 * step), getattr(control, "max", None)
    target = before + 3 * step
    if high is not None and target > high:
        target = max(low, before - 3 * step) if before >= high else high
    control.value = target
    return f"{control.description} {before!r} -> {control.value!r}"


def _plot(box):
    """What the box's Output shows now (its last Output: the plot), or None."""
    outs = [c for c in _walk(box) if type(c).__name__ == "Output"]
    return (tuple(str(o.get("data", o)) for o in outs[-1].outputs) or None) if outs else None


def move_every_widget() -> list[str]:
    """Moves each box's controls until its plot changes; one line per box, or an
    AssertionError that names the box and what was tried."""
    boxes = interact_boxes()
    assert boxes, "the notebook shows no interactive widget after running every cell"
    lines = []
    for number, box in enumerate(boxes, 1):
        kind = "live" if "live-widget" in box._dom_classes else "plain"
        before = _wait(lambda: _plot(box), PATIENCE_S[kind])
        assert before, f"widget {number} shows no plot"
        controls = _controls(box)
        assert controls, f"widget {number} has no control that can be moved"
        tried = []
        for control in controls:
            tried.append(move(control))
            if _wait(lambda: _plot(box) not in (None, before), PATIENCE_S[kind]):
                break
        else:
            raise AssertionError(f"widget {number}'s plot never changed; tried {tried}")
        lines.append(f"widget {number} ({kind}): {tried[-1]} changed the plot")
    return lines


def _wait(check, timeout: float):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.1)
