"""labs/pp.py runs end to end on 2 CPU ranks and writes the shared result shape; bad
settings stop it with a one-line message before any rank starts. (Speed is the lab's to
report, not this test's to assert.)"""
import json
from functools import partial

import labrun
import pytest

TINY = ["--world-size", "2", "--steps", "1", "--warmup", "1", "--microbatches", "2", "4",
        "--width", "32", "--layers-per-stage", "2", "--microbatch-size", "4"]


_run = partial(labrun.run, "pp")


def _record(tmp_path, *schedules):
    """The lab's run (exit code, output) and the record it wrote, for these schedules."""
    out = tmp_path / "pp.json"
    done = _run(*TINY, "--schedules", *schedules, "--json", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    return done, json.loads(out.read_text())


@pytest.mark.timeout(200)
def test_the_lab_writes_the_shared_shape(tmp_path):
    _, record = _record(tmp_path, "gpipe", "1f1b", "interleaved")
    assert record["lab"] == "pp" and record["world_size"] == 2 and record["backend"] == "gloo"
    assert {"lessonlib", "torch"} <= set(record["results"])
    for engine in ("lessonlib", "torch"):
        assert record["results"][engine]["step_time_s"] > 0
        for m in ("m=2", "m=4"):
            case = record["results"][engine]["schedules"]["1f1b"][m]
            assert len(case["bubble_per_stage"]) == 2
            assert case["peak_stash_per_stage"] == [2, 1]
            assert record["results"][engine]["schedules"]["gpipe"][m]["peak_stash_per_stage"] == [int(m[2:])] * 2
    assert set(record["results"]["lessonlib"]["schedules"]) == {"gpipe", "1f1b", "interleaved"}
    assert set(record["ratio_lessonlib_over_torch"]) == {"gpipe", "1f1b"}
    assert record["theory"]["bubble_wall"]["1f1b m=4"] == pytest.approx(1 / 5)
    assert record["theory"]["bubble_ideal"]["1f1b m=4"] == pytest.approx(1 / 4)


@pytest.mark.parametrize("args,words", [
    (["--microbatches", "0"], "--microbatches must be positive"),
    (["--width", "0"], "--width must be a positive integer"),
    (["--schedules", "interleaved", "--microbatches", "3"], "multiple of p=2"),
])
def test_bad_settings_stop_the_lab_before_any_rank(args, words):
    done = _run("--world-size", "2", *args)
    assert done.returncode == 2 and words in done.stderr


@pytest.mark.timeout(200)
def test_the_lab_races_the_zero_bubble_schedules_against_pytorchs(tmp_path):
    done, record = _record(tmp_path, "1f1b", "zb-h1", "zbv")
    assert {(r["implementation"], r["schedule"]) for r in record["rows"]} == {
        (e, s) for e in ("lessonlib", "torch") for s in ("1f1b", "zb-h1", "zbv")}
    assert set(record["ratio_zb_h1_over_1f1b"]) == {"m=2", "m=4"}
    assert set(record["ratio_lessonlib_over_torch"]["zbv"]) == {"m=2", "m=4"}
    for row in record["rows"]:
        if row["schedule"] != "1f1b" and row["implementation"] == "lessonlib":
            assert row["peak_stash_per_stage"] == row["peak_stash_predicted"], row
    assert "ZB-H1 step / lessonlib 1F1B step" in done.stdout
    assert "PyTorch's ScheduleZBVZeroBubble step" in done.stdout


def test_zbv_needs_an_even_number_of_layers_per_stage():
    done = _run("--world-size", "2", "--schedules", "zbv", "--layers-per-stage", "3")
    assert done.returncode == 2 and "must be even" in done.stderr
