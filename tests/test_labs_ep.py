"""labs/ep.py runs end to end with tiny settings and writes the shared result shape; bad
settings stop it with a one-line message before any rank starts. Speed is not asserted."""
from functools import partial

import labrun
import pytest

_run = partial(labrun.run, "ep")


@pytest.mark.timeout(120)
def test_tiny_run_writes_the_result_shape(tmp_path):
    record = labrun.run_lab("ep", "--world-size", "2", "--steps", "2", "--warmup", "1",
                            "--experts", "4", "--batch", "2", "--seq", "8", "--hidden", "16",
                            tmp_path=tmp_path)
    labrun.check_shape(record, "ep", 2)
    moe = record["results"]["lessonlib"]["moe_layer"]
    assert moe["bytes_match_routing"] and moe["output_max_abs_error"] < 1e-5
    assert 0 < moe["alltoall_share"] < 1 and moe["alltoall_time_s"] < moe["step_time_s"]
    assert sum(moe["tokens_per_expert"]) + moe["dropped_share"] * 2 * 2 * 8 * 2 == 2 * 2 * 8 * 2
    assert record["results"]["torch"]["same_rows_as_lessonlib"]
    assert [(r["implementation"], r["part"], r["e"]) for r in record["rows"]] == \
        [("lessonlib", "moe_layer", 2), ("lessonlib", "all_to_all", 2), ("torch", "all_to_all", 2)]
    assert len({tuple(r) for r in record["rows"]}) == 1          # the same columns in every row


@pytest.mark.parametrize("flags,words", [
    (("--world-size", "3"), "--experts 8 must be divisible by e = --world-size 3"),
    (("--top-k", "9"), "--top-k 9 must be at most --experts 8"),
    (("--capacity-factor", "0"), "--capacity-factor must be a positive number"),
])
def test_bad_settings_get_one_line(flags, words):
    done = _run(*flags)
    assert done.returncode == 2 and words in done.stderr.strip().splitlines()[-1]
