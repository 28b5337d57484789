"""labs/tp.py runs end to end with tiny settings and writes the shared result shape; bad
settings stop it with a one-line message before any rank starts. Speed is not asserted."""
import json
from functools import partial

import labrun
import pytest

_run = partial(labrun.run, "tp")


@pytest.mark.timeout(300)
def test_tiny_run_writes_the_result_shape(tmp_path):
    out = tmp_path / "tp.json"
    done = _run("--world-size", "2", "--steps", "2", "--warmup", "1", "--batch", "2",
                "--seq", "8", "--hidden", "32", "--heads", "4", "--json", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["lab"] == "tp" and record["world_size"] == 2
    assert record["backend"] == "gloo" and record["device"] == "cpu"
    assert record["settings"] == {"batch": 2, "seq": 8, "hidden": 32, "heads": 4, "steps": 2,
                                  "warmup": 1, "dtype": "fp32", "sequence_parallel": False,
                                  "recompute": "none"}
    payload = 2 * 8 * 32 * 4
    for name in ("lessonlib", "torch"):
        result = record["results"][name]
        assert result["step_time_s"] > 0
        for kind in ("mlp", "block"):
            row = result["layers"][kind]
            assert row["output_max_abs_error"] < 1e-5 and row["input_grad_max_abs_error"] < 1e-5
            assert row["matrix_bytes_per_rank"] == [record["dense"][kind]["matrix_bytes"] // 2] * 2
            assert row["step_time_s"] > 0
        assert result["layers"]["mlp"]["all_reduces"] == 2
        assert result["layers"]["mlp"]["comm_bytes"] == 2 * payload
    assert record["results"]["lessonlib"]["layers"]["block"]["comm_bytes"] == 4 * payload
    assert record["matrix_bytes_fraction_of_dense"] == {"mlp": 0.5, "block": 0.5}
    assert set(record["ratio_lessonlib_over_torch"]) == {"mlp", "block"}
    assert all(r > 0 for r in record["paired_ratio_lessonlib_over_torch"].values())


@pytest.mark.timeout(300)
def test_sequence_parallel_with_recompute_against_pytorch_plan(tmp_path):
    out = tmp_path / "tp.json"
    done = _run("--world-size", "2", "--steps", "1", "--warmup", "0", "--batch", "2",
                "--seq", "8", "--hidden", "32", "--heads", "4", "--sequence-parallel",
                "--recompute", "selective", "--overlap", "--json", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["settings"]["sequence_parallel"] is True
    assert record["settings"]["recompute"] == "selective"
    for row in record["rows"]:
        assert row["output_max_abs_error"] < 1e-5 and row["input_grad_max_abs_error"] < 1e-5
        assert row["sequence_parallel"] and row["saved_bytes"] > 0
    # ours keeps only this rank's rows of the column layers' input; PyTorch's plan keeps the
    # gathered input
    kept = record["saved_bytes"]["block"]
    assert kept["lessonlib"] < kept["torch"]
    assert set(record["paired_ratio_lessonlib_over_torch"]) == {"mlp", "block"}
    # --overlap: async TP computes what plain SP does; plain SP's communication is all exposed
    for kind, entry in record["overlap"].items():
        assert entry["output_max_abs_diff"] < 1e-5 and entry["input_grad_max_abs_diff"] < 1e-5
        assert entry["plain"]["exposed_s"] == entry["plain"]["comm_s"] > 0, kind
        assert 0 <= entry["overlapped"]["exposed_s"] <= entry["overlapped"]["comm_s"], kind


def test_bad_settings_stop_before_any_rank_starts():
    done = _run("--world-size", "2", "--heads", "3", "--hidden", "48")
    assert done.returncode == 2
    assert "--heads 3 must be divisible by the TP degree t = --world-size 2" in done.stderr
    done = _run("--world-size", "2", "--hidden", "100", "--heads", "8")
    assert done.returncode == 2 and "--hidden 100 must be divisible by --heads 8" in done.stderr
    done = _run("--world-size", "4", "--seq", "6", "--heads", "4", "--hidden", "32",
                "--sequence-parallel")
    assert done.returncode == 2 and "--seq 6 (s) must be divisible by t = --world-size 4" \
        in done.stderr


def test_overlap_without_sequence_parallel_stops_before_any_rank_starts(capsys):
    with pytest.raises(SystemExit) as exit_info:
        labrun.load_lab("tp").main(["--world-size", "2", "--overlap"])
    assert exit_info.value.code == 2 and "add --sequence-parallel" in capsys.readouterr().err
