"""labs/hybrid.py runs end to end with tiny settings and writes the shared result shape; bad
settings stop it with a one-line message before any rank starts. Speed is not asserted."""
import json
from functools import partial

import labrun
import pytest

_run = partial(labrun.run, "hybrid")


@pytest.mark.timeout(300)
def test_tiny_run_writes_the_result_shape(tmp_path):
    out = tmp_path / "hybrid.json"
    done = _run("--world-size", "4", "--steps", "1", "--warmup", "1", "--layouts",
                "t2p2d1,t1p2d2", "--hidden", "32", "--seq", "8", "--global-batch", "8",
                "--microbatches", "2", "--json", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["lab"] == "hybrid" and record["world_size"] == 4
    assert record["backend"] == "gloo" and record["device"] == "cpu"
    assert record["settings"]["layouts"] == ["t2p2d1", "t1p2d2"]
    assert record["command"].startswith("python labs/hybrid.py")
    assert set(record["results"]) == {"t2p2d1", "t1p2d2"}
    for key, row in record["results"].items():
        assert row["step_time_s"] > 0 and row["tokens_per_s"] > 0
        assert row["max_weight_diff_vs_one_process"] < 1e-5
        assert row["param_bytes_per_rank"] == row["expected_param_bytes_per_rank"]
        assert row["traffic_per_step_rank0"] == row["expected_traffic_rank0"]
        assert row["predicted_bubble"] == pytest.approx(1 / 3)  # p = 2, m = 2
        assert 0 <= row["idle_share_median"] < 1
    assert record["results"]["t1p2d2"]["b"] == 2 and record["results"]["t2p2d1"]["b"] == 4


@pytest.mark.parametrize("args,message", [
    (["--layouts", "2x2x2"], "cannot read the layout '2x2x2'; write t<t>p<p>d<d>"),
    (["--layouts", "t2p2d1"], "world_size=8"),
    (["--layouts", "t2p2d2", "--global-batch", "12"], "global_batch=12 is not divisible"),
    (["--layouts", "t1p8d1"], "pp=8 stages but the model has layers=4"),
    (["--heads", "3"], "--hidden 64 must be divisible by --heads 3"),
])
def test_bad_settings_stop_before_any_rank_starts(args, message):
    done = _run("--world-size", "8", *args)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr
