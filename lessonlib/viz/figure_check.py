"""A figure that hides its data fails where it is drawn, instead of misleading a student.

What it teaches: a plot is a claim too. ``problems(fig)`` lists what a reader could not see
or could not tell apart: data drawn outside its axes' limits (a panel of a shared axis cut
short by a sibling's limits is the usual cause), and a panel of several series with no legend
(nor labels on the series themselves). With ``LESSONLIB_CHECK_FIGURES=1`` (the test suite
sets it), ``install()`` checks every figure as it is rendered and raises ``FigureProblem``
naming the panel, so nbval fails the cell that drew it.

Laptop:  ``LESSONLIB_CHECK_FIGURES=1 python -c "import lessonlib"`` (then draw)
GPU box: the same.
"""
from __future__ import annotations

import os

import numpy as np

ENV = "LESSONLIB_CHECK_FIGURES"
# Of the axis span: a point on the limit is inside. matplotlib's autoscale snaps a limit to
# a bar's edge (its sticky edges) within 1e-5 of the data's span (Axes.autoscale_view), so a
# bar whose edge lies that close to a neighbour's may start just past the limit: as wide.
SLACK = 1e-5


class FigureProblem(AssertionError):
    """A figure hides some of its data or does not say which series is which."""


def _title(ax) -> str:
    return ax.get_title() or ax.get_ylabel() or f"panel {ax.get_subplotspec()}"


def _extent(artist):
    """The data-space bounding box (x0, x1, y0, y1) of a line, collection or patch, or None."""
    from matplotlib.collections import Collection
    from matplotlib.lines import Line2D
    from matplotlib.patches import Rectangle

    if isinstance(artist, Line2D):
        if artist.get_transform() != artist.axes.transData:    # axhline, axvline: spans
            return None
        xy = np.asarray(artist.get_xydata(), dtype=float)        # categories as positions
        if xy.size == 0:
            return None
        x, y = xy[:, 0], xy[:, 1]
    elif isinstance(artist, Rectangle):
        if artist.get_data_transform() != artist.axes.transData:      # bars, not spans
            return None
        x0, y0 = artist.get_xy()
        x = np.array([x0, x0 + artist.get_width()], dtype=float)
        y = np.array([y0, y0 + artist.get_height()], dtype=float)
    elif isinstance(artist, Collection):
        offsets = np.asarray(artist.get_offsets(), dtype=float)
        if offsets.size and artist.get_offset_transform() == artist.axes.transData:
            x, y = offsets[:, 0], offsets[:, 1]                     # scatter points
        elif artist.get_transform() == artist.axes.transData:       # polygons, error bars
            box = artist.get_datalim(artist.axes.transData)
            if not np.all(np.isfinite(box.extents)) or box.width < 0:
                return None
            x, y = np.array([box.x0, box.x1]), np.array([box.y0, box.y1])
        else:
            return None
    else:
        return None
    keep = np.isfinite(x) & np.isfinite(y)
    if not keep.any():
        return None
    return x[keep].min(), x[keep].max(), y[keep].min(), y[keep].max()


def _outside(ax) -> list[str]:
    (x0, x1), (y0, y1) = sorted(ax.get_xlim()), sorted(ax.get_ylim())
    log_y = ax.get_yscale() == "log"
    dx, dy = (x1 - x0) * SLACK, 0 if log_y else (y1 - y0) * SLACK
    found = []
    for artist in [*ax.lines, *ax.collections, *ax.patches]:
        box = _extent(artist)
        if box is None or not artist.get_visible():
            continue
        a, b, c, d = box
        below = c < y0 - dy and not (log_y and c <= 0)     # zero has no place on a log axis
        if a < x0 - dx or b > x1 + dx or below or d > y1 + dy:
            label = artist.get_label()
            name = label if label and not label.startswith("_") else type(artist).__name__
            found.append(f"'{_title(ax)}': {name} spans x {a:.3g}..{b:.3g}, y {c:.3g}..{d:.3g}"
                         f" beyond the axes' x {x0:.3g}..{x1:.3g}, y {y0:.3g}..{y1:.3g}")
    return found


def _series(ax) -> int:
    """Lines of two points or more drawn in data space, and bar groups."""
    from matplotlib.container import BarContainer

    lines = [ln for ln in ax.lines if ln.get_transform() == ax.transData
             and len(ln.get_xdata()) >= 2]
    bars = [c for c in ax.containers if isinstance(c, BarContainer)]
    return len(lines) + len(bars)


def _unexplained(ax) -> list[str]:
    series = _series(ax)
    legend = ax.get_legend() or ax.figure.legends
    labelled = len(ax.texts) >= series               # each series labelled where it is drawn
    if series > 1 and not legend and not labelled:
        return [f"'{_title(ax)}': {series} series and no legend to tell them apart"]
    return []


def problems(fig) -> list[str]:
    """What ``fig`` hides or leaves unexplained, one line per problem."""
    found = []
    for ax in fig.axes:
        if not ax.get_visible() or ax.get_label() == "<colorbar>":
            continue
        found += _outside(ax) + _unexplained(ax)
    return found


def install() -> None:
    """Check every figure as it is rendered (inline in a notebook, or saved)."""
    from matplotlib.backend_bases import FigureCanvasBase

    if getattr(FigureCanvasBase.print_figure, "_checked", False):
        return
    plain = FigureCanvasBase.print_figure

    def print_figure(self, *args, **kwargs):
        found = problems(self.figure)
        if found:
            raise FigureProblem("this figure hides data or leaves its series unexplained:\n  "
                                + "\n  ".join(found))
        return plain(self, *args, **kwargs)

    print_figure._checked = True
    FigureCanvasBase.print_figure = print_figure


def install_if_asked() -> None:
    if os.environ.get(ENV) == "1":
        install()
