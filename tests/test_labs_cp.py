"""labs/cp.py runs end to end with tiny settings and writes the shared result shape (ring,
all-gather and Ulysses attention equal to one-process SDPA, the bytes each rank sent equal
to the formula, per-rank work and key/value bytes equal to the
formulas, PyTorch's context parallelism's outcome recorded); bad settings stop it with a
one-line message before any rank starts. Speed is not asserted."""
import json
from functools import partial

import labrun
import pytest

_run = partial(labrun.run, "cp")


@pytest.mark.timeout(300)
def test_tiny_run_writes_the_result_shape(tmp_path):
    out = tmp_path / "cp.json"
    done = _run("--world-size", "2", "--steps", "2", "--warmup", "1", "--seq", "16",
                "--heads", "2", "--head-dim", "4", "--json", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["lab"] == "cp" and record["world_size"] == 2
    assert record["settings"] == {"method": "ring", "batch": 1, "seq": 16, "heads": 2,
                                  "kv_heads": 2, "head_dim": 4, "causal": True, "steps": 2,
                                  "warmup": 1, "dtype": "fp32"}
    rows = {(r["implementation"], r["layout"]): r for r in record["rows"]}
    assert set(rows) == {("lessonlib", "zigzag"), ("lessonlib", "contiguous"),
                         ("torch", "one process"), ("torch_context_parallel", "torch's")}
    for layout in ("zigzag", "contiguous"):
        row = rows["lessonlib", layout]
        assert row["max_abs_error"] < 1e-5 and row["step_time_s"] > 0
        assert row["work_per_rank"] == row["work_predicted"]
        assert row["kv_bytes_received_per_rank"] == [row["kv_bytes_predicted"]] * 2
        assert row["kv_bytes_predicted"] == (1 + 3) * 2 * 2 * 8 * 4 * 4    # 4 blocks of K+V
        assert row["bytes_sent_per_rank"] == [row["bytes_sent_predicted"]] * 2 == \
            [row["kv_bytes_predicted"]] * 2                                # a ring: as received
    assert rows["lessonlib", "zigzag"]["work_max_over_min"] == 1.0
    assert rows["lessonlib", "contiguous"]["work_max_over_min"] == 100 / 36   # 64 + 36 vs 36
    theirs = rows["torch_context_parallel", "torch's"]
    assert theirs["error"] or theirs["max_abs_error"] < 1e-5
    assert record["results"]["torch"]["step_time_s"] > 0
    assert record["headline"]["x"] == "c"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("method", ["ulysses"])     # all-gather: the same path, another name
def test_another_method_with_grouped_query_attention(tmp_path, method):
    out = tmp_path / "cp.json"
    done = _run("--world-size", "2", "--steps", "1", "--warmup", "0", "--seq", "16",
                "--heads", "4", "--kv-heads", "2", "--head-dim", "4", "--method", method,
                "--json", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {(r["implementation"], r["layout"]): r for r in json.loads(out.read_text())["rows"]}
    for layout in ("zigzag", "contiguous"):
        row = rows["lessonlib", layout]
        assert row["method"] == method and row["max_abs_error"] < 1e-5
        # s/c = 8 tokens, fp32: K and V 2 heads (512 bytes), q 4 heads (512 bytes)
        assert row["bytes_sent_per_rank"] == [row["bytes_sent_predicted"]] * 2 == [
            {"allgather": 2 * 512, "ulysses": 2 * (512 + 2 * 512) // 2}[method]] * 2
        assert row["work_per_rank"] is None and row["kv_bytes_received_per_rank"] is None


def test_bad_settings_stop_before_any_rank_starts():
    done = _run("--world-size", "2", "--seq", "10")
    assert done.returncode == 2
    assert "--seq 10 must be a multiple of 2c = 4" in done.stderr
    done = _run("--world-size", "2", "--dtype", "bf16")
    assert done.returncode == 2 and "runs only --dtype fp32" in done.stderr
    for args, said in ((("--method", "ulysses", "--heads", "3"),
                        "--heads 3 must be a multiple of c = 2 under --method ulysses"),
                       (("--method", "ulysses", "--heads", "4", "--kv-heads", "1"),
                        "--kv-heads 1 must be a multiple of c = 2 under --method ulysses"),
                       (("--method", "allgather", "--heads", "4", "--kv-heads", "3"),
                        "--kv-heads 3 must divide --heads 4"),
                       (("--kv-heads", "2",), "--method ring takes K and V of all --heads 4"),
                       (("--method", "tree"), "invalid choice: 'tree'")):
        done = _run("--world-size", "2", *args)
        assert done.returncode == 2 and said in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
