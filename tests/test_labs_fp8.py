"""labs/fp8.py runs end to end with tiny settings and writes the shared result shape; bad
settings stop it with a one-line message before any rank starts. Speed is not asserted."""
import json
from functools import partial

import labrun
import pytest

_run = partial(labrun.run, "fp8")


@pytest.mark.timeout(300)
def test_tiny_run_writes_the_result_shape(tmp_path):
    out = tmp_path / "fp8.json"
    done = _run("--world-size", "1", "--steps", "1", "--warmup", "0", "--gemm-size", "64",
                "--json", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["lab"] == "fp8" and record["device"] == "cpu"
    assert [r["recipe"] for r in record["rows"]] == ["none", "tensorwise", "rowwise",
                                                     "blockwise"]
    res = record["results"]
    assert res["blockwise"]["gemm_relative_error_outliers"] \
        < res["tensorwise"]["gemm_relative_error_outliers"]
    assert all(r["step_time_s"] > 0 for r in record["rows"])
    assert "say nothing about a GPU" in record["gemm_tflops"]["note"]


def test_bad_settings_stop_before_any_rank_starts():
    done = _run("--gemm-size", "100")
    assert done.returncode == 2 and "--gemm-size 100 must be a multiple of 16" in done.stderr
