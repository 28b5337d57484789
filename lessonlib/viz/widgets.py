"""One way to put controls over a plot, for every lesson's widgets.

``explorer(draw, name=control, ...)`` redraws ``draw(**values)`` into an ipywidgets Output
each time a control moves. The picture is put into the Output as data (a PNG), not captured
from a running cell: ``interactive`` + ``plt.show()`` leaves headless runs (nbclient,
nbconvert) waiting on the captured output after the cell has finished, and the stored
notebook would show no picture. The box carries ipywidgets' ``widget-interact`` class, so
it is styled like ``interact()`` and the browser test finds it.

Laptop and GPU box alike::

    from ipywidgets import IntSlider
    from lessonlib.viz.widgets import explorer
    explorer(lambda p: my_plot(p), p=IntSlider(4, 1, 16))
"""
from __future__ import annotations

import io

import matplotlib.pyplot as plt


def current_figure(draw):
    """``draw`` for ``explorer`` from a plot function that draws on the current figure
    (and returns an Axes, a Figure or nothing)."""
    def wrapped(**values):
        plt.close("all")
        made = draw(**values)
        return getattr(made, "figure", None) or plt.gcf()
    return wrapped


def explorer(draw, **controls):
    """Controls (ipywidgets; each one's description defaults to its name) over
    ``draw(**values) -> figure`` or ``-> (figure, text)``; returns the box to display."""
    import ipywidgets as w
    from IPython.display import Image

    out = w.Output()

    def redraw(_=None):
        made = draw(**{name: c.value for name, c in controls.items()})
        fig, text = made if isinstance(made, tuple) else (made, None)
        png = io.BytesIO()
        fig.savefig(png, format="png", dpi=80, bbox_inches="tight")
        plt.close(fig)
        out.outputs = ()
        out.append_display_data(Image(png.getvalue()))
        if text:
            out.append_stdout(text)

    for name, control in controls.items():
        control.description = control.description or name
        control.observe(redraw, names="value")
    redraw()
    box = w.VBox([w.HBox(list(controls.values()), layout=w.Layout(flex_flow="row wrap")), out])
    box.add_class("widget-interact")
    return box
