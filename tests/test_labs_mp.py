"""labs/mp.py runs the assembly line at every p in one launch of 2 CPU ranks and writes the
shared result shape with the prediction (p-1)/p beside each measurement; bad settings stop it
before any rank starts; the notebook's plot draws from the shipped table without a kernel.
(Speed is the lab's to report, not this test's to assert.)"""
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from labrun import check_shape, load_lab, run_lab  # noqa: E402

from lessonlib import model_parallel as mp  # noqa: E402
from lessonlib.viz import mp as mpviz  # noqa: E402

SHIPPED = Path(__file__).resolve().parent.parent / "data" / "mp_cpu_results.json"
TINY = ["--world-size", "2", "--steps", "2", "--warmup", "1", "--rounds", "2", "--layers", "2",
        "--hidden", "16", "--batch", "2"]


@pytest.mark.timeout(170)
def test_the_lab_writes_the_shared_shape_with_the_prediction(tmp_path):
    record = run_lab("mp", *TINY, tmp_path=tmp_path)
    check_shape(record, "mp", 2)
    ours = record["results"]["lessonlib"]
    assert set(ours["by_p"]) == {"1", "2"} and ours["step_time_s"] > 0
    whole = record["theory"]["param_bytes_model"]
    for key, row in ours["by_p"].items():
        p = int(key)
        assert row["p"] == p and row["idle_predicted"] == (p - 1) / p
        assert len(row["idle_per_rank"]) == p and all(0 <= x < 1 for x in row["idle_per_rank"])
        assert row["param_bytes_per_rank"] == row["param_bytes_split"]
        assert sum(row["param_bytes_per_rank"]) == whole and row["param_bytes_even"] == whole / p
        assert len(row["stash_bytes_per_rank"]) == p and min(row["stash_bytes_per_rank"]) > 0
        assert row["parity"]["loss_max_abs_diff"] < 1e-5
        assert row["parity"]["weights_max_abs_diff"] < 1e-6
    assert record["theory"]["idle_share"] == {str(p): (p - 1) / p for p in range(1, 9)}
    fig = mpviz.plot_measured(tmp_path / "mp.json", this_run=[ours["by_p"]["2"]])
    assert len(fig.axes) == 3
    plt.close(fig)


@pytest.mark.parametrize("flags, message", [
    (["--world-size", "0"], "--world-size must be a positive integer"),
    (["--steps", "0"], "--steps must be a positive integer"),
    (["--world-size", "2", "--p", "3"], "--p [3]: every p must be in 1..2"),
    (["--hidden", "30"], "--hidden 30 must be a multiple of the GPT's 4 heads"),
    (["--model", "mlp", "--layers", "1", "--world-size", "2", "--p", "2"],
     "every p must be in 1..1"),
])
def test_bad_settings_stop_the_lab_before_any_rank(flags, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        load_lab("mp").main(flags)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_lines_let_any_p_run_in_one_launch_but_must_fit():
    assert mp.check_line(4, p=3, lines=1) == 3
    with pytest.raises(ValueError, match="lines=2 lines of p=3 ranks do not fit a world of 4"):
        mp.check_line(4, p=3, lines=2)
    with pytest.raises(ValueError, match="lines=0"):
        mp.check_line(4, p=2, lines=0)


def test_the_plot_draws_from_the_shipped_table():
    rows = mpviz.load_table(SHIPPED)
    assert sorted(r["p"] for r in rows) == [1, 2, 3, 4]
    assert all(r["idle_predicted"] == (r["p"] - 1) / r["p"] for r in rows)
    this_run = [{"p": 2, "idle_per_rank": [0.5, 0.6], "idle_mean": 0.55, "step_time_s": 0.05,
                 "param_bytes_per_rank": [800, 700]}]
    fig = mpviz.plot_measured(str(SHIPPED), this_run)
    idle, memory, time = fig.axes
    assert any("this run" in t.get_text() for t in idle.get_legend().get_texts())
    assert len(memory.lines) > 2 and len(time.lines) > 1
    plt.close(fig)
    with pytest.raises(ValueError, match="not from labs/mp.py"):
        mpviz.load_table([{"lab": "pp"}])
