"""The activation widget draws the cost model's curves and the measured points where they
belong; no processes."""
import pytest
import matplotlib

matplotlib.use("Agg")

from lessonlib.costmodel import MODELS  # noqa: E402
from lessonlib.costmodel.memory import course_layer_activation_bytes  # noqa: E402
from lessonlib.viz import activations  # noqa: E402


def test_the_preset_curves_follow_table2_and_sp_divides_by_t():
    curves = activations.preset_curves("gpt3-175B", 8, 1, [2048])
    assert set(curves) == set(activations.MODES)
    gpt3 = MODELS["gpt3-175B"]
    sbh = 2048 * gpt3.h
    assert curves["TP+SP + selective"][0] * 1e9 == pytest.approx(
        (sbh * 34 / 8 + 16 * 2048 / 8) * gpt3.L)         # + the norms' statistics
    assert curves["no parallelism"][0] > curves["TP"][0] > curves["TP+SP"][0]


def test_the_plot_puts_measured_points_on_the_formula():
    kept = course_layer_activation_bytes(2, 16, 32, 4, 2, True, "none", 8)
    measured = {"b": 2, "h": 32, "a": 4, "t": 2, "element_size": 8,
                "points": [("tp+sp", 16, kept), ("dense", 16, 2 * kept)]}
    fig = activations.activation_plot("gpt2-small", t=2, b=1, measured=measured)
    left, right = fig.axes
    assert len(left.lines) == len(activations.MODES)
    dots = [line for line in right.lines if line.get_marker() == "o"]
    assert [tuple(d.get_xydata()[0]) for d in dots] == [(16, kept / 1e3), (16, 2 * kept / 1e3)]
    assert activations.activation_widget(measured).children
