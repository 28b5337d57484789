"""Live widgets: each re-runs real ranks for its sliders and draws measured over predicted;
a value overtaken by a newer one is dropped, a failed run shows its error."""
import threading
import time

import matplotlib
import pytest

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from lessonlib.viz import live  # noqa: E402


def _fake(delay=0.05):
    seen, drawn, done = [], [], threading.Event()

    def measure(x):
        seen.append(x)
        time.sleep(delay)
        if x < 0:
            raise ValueError(f"x={x} must be >= 0")
        return x * 10

    def show(result, values):
        drawn.append((values["x"], result))
        done.set()

    return seen, drawn, done, measure, show


def test_newer_values_overtake_older_ones_and_only_the_newest_is_drawn():
    seen, drawn, done, measure, show = _fake(delay=0.3)
    run = live.LiveRun(measure, show)
    run.request({"x": 1})
    time.sleep(0.1)                     # x=1 is running now
    for x in (2, 3, 4):                 # 2 and 3 wait and are overtaken before they start
        run.request({"x": x})
    deadline = time.time() + 10
    while (not drawn or drawn[-1][0] != 4) and time.time() < deadline:
        time.sleep(0.05)
    assert seen == [1, 4]
    assert drawn == [(4, 40)]           # x=1's result came after newer values: not drawn
    assert run.dropped == 3


def test_a_failed_run_reaches_the_widget_as_an_error_and_the_next_run_works():
    seen, drawn, done, measure, show = _fake()
    run = live.LiveRun(measure, show)
    run.run_now({"x": -1})
    assert isinstance(drawn[-1][1], ValueError)
    run.run_now({"x": 2})
    assert drawn[-1] == (2, 20)


def test_the_box_draws_once_when_built_and_shows_errors_as_text():
    box = live.live_explorer(lambda x: 1 / x, lambda r, x: plt.figure(),
                             x=live.w.IntSlider(0, 0, 3))
    out = box.children[-1]
    assert "failed" in out.outputs[0]["text"] and "ZeroDivisionError" in out.outputs[0]["text"]
    assert box.live.runs == 1


@pytest.mark.timeout(240)
@pytest.mark.usefixtures("no_children_left")
def test_every_live_measurement_runs_and_draws_at_its_smallest_setting():
    ring = live.measure_allreduce(2, 16, budget_s=0.05)
    assert set(ring) == {"ring", "parameter_server"}
    assert ring["parameter_server"]["busiest_link_bytes"] == 16 * 1024   # n = 2: S each way
    live.draw_allreduce(ring, 2, 16)
    line = live.measure_assembly_line(2)
    assert len(line.record.idle_per_rank) == 2 and line.record.idle_predicted == 0.5
    live.draw_assembly_line(line, 2)
    pipe = live.measure_pipeline("1f1b", 2, 2)
    assert len(pipe.spans) == 2 and 0 < pipe.row.bubble_mean < 1
    live.draw_pipeline(pipe, "1f1b", 2, 2)
    lay = live.measure_layout("t1p1d2")
    assert lay["measured"].dp_all_reduce == lay["predicted"].dp_all_reduce
    live.draw_layout(lay, "t1p1d2")


@pytest.mark.timeout(240)
@pytest.mark.usefixtures("no_children_left")
@pytest.mark.parametrize("d", [1, 4])
def test_the_sharding_widget_measures_at_either_end_of_its_slider(d):
    from lessonlib.viz import zero

    stages = zero.measure_stages(d)
    assert all(r["sent"] == r["sent_formula"] for r in stages.values())
    assert stages["3"]["sent"] == 1.5 * stages["2"]["sent"]   # both padded to d equal shards
    zero.draw_stages(stages, d)
