"""A figure that hides data or leaves its series unexplained fails where it is drawn.
The suite sets LESSONLIB_CHECK_FIGURES=1 (conftest.py), so every figure the notebooks draw
under nbval goes through the same check; these tests show what it catches. Pure."""
import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from lessonlib.viz import figure_check  # noqa: E402


def test_a_shared_axis_that_cuts_one_panel_short_is_caught():
    fig, axes = plt.subplots(2, 1, sharex=True)        # notebook 09's Gantt charts, before
    axes[0].barh([0], [33])
    axes[0].set_xlim(0, 34)
    axes[1].barh([0], [28])
    axes[1].set_xlim(0, 28.8)                          # the last limit set wins for both
    (problem,) = figure_check.problems(fig)
    assert "spans x 0..33" in problem and "x 0..28.8" in problem
    plt.close(fig)


def test_a_bar_autoscale_snapped_past_is_inside_but_one_cut_short_is_not():
    """Notebook 03's measured timeline: matplotlib snaps the left limit to the nearest bar
    edge within 1e-5 of the span, here the second bar's, 1 us past the first's; that is
    no hidden data. A bar a thousandth of the span past the limit still is."""
    fig, ax = plt.subplots()
    for row, left in enumerate((4.830, 4.831, 185.0)):
        ax.barh(row, 5.0, left=left, color="C0", label="spans" if row == 0 else None)
    ax.legend()
    fig.canvas.draw()
    assert ax.get_xlim()[0] == 4.831 and figure_check.problems(fig) == []
    ax.set_xlim(5.0, None)
    assert "beyond the axes'" in figure_check.problems(fig)[0]
    plt.close(fig)


def test_series_need_a_legend_and_spans_or_error_bars_are_not_series():
    fig, ax = plt.subplots()
    ax.plot([1, 2], [1, 2])
    ax.plot([1, 2], [2, 1])
    assert figure_check.problems(fig) == [
        "'panel GridSpec(1, 1)[0:1, 0:1]': 2 series and no legend to tell them apart"]
    ax.legend(["formula", "measured"])
    assert figure_check.problems(fig) == []
    fig2, ax2 = plt.subplots()
    ax2.errorbar([1, 2], [1, 2], yerr=[0.1, 0.2])
    ax2.axhline(5)                                     # a reference line, drawn across
    assert figure_check.problems(fig2) == []
    plt.close("all")


def test_a_point_outside_the_limits_fails_the_rendering(monkeypatch):
    figure_check.install()
    fig, ax = plt.subplots()
    ax.plot([1, 2], [1, 2])
    ax.set_ylim(0, 1.5)
    with pytest.raises(figure_check.FigureProblem, match="beyond the axes'"):
        fig.savefig(__import__("io").BytesIO(), format="png")
    plt.close(fig)


def test_categories_are_read_at_their_positions():
    fig, ax = plt.subplots()                           # labs/sweep_published.py's x axis
    ax.plot(["8", "16"], [82.7, 85.1], "o-", label="predicted")
    ax.legend()
    assert figure_check.problems(fig) == []
    plt.close(fig)
