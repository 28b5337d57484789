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


@pytest.mark.timeout(200)
def test_the_lab_writes_the_shared_shape(tmp_path):
    out = tmp_path / "pp.json"
    done = _run(*TINY, "--schedules", "gpipe", "1f1b", "interleaved", "--json", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads(out.read_text())
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
