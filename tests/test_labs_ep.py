"""labs/ep.py runs end to end with tiny settings and writes the shared result shape; bad
settings stop it with a one-line message before any rank starts. Speed is not asserted."""
from functools import partial

import labrun
import pytest

_run = partial(labrun.run, "ep")


@pytest.mark.timeout(120)
def test_tiny_run_writes_the_result_shape(tmp_path):
    """DeepSeek-V3's routing (sigmoid, the bias, dropless, 2 pretend nodes of 2 experts,
    each token on 1): nothing dropped, a node boundary crossed, the same record."""
    record = labrun.run_lab("ep", "--world-size", "2", "--steps", "2", "--warmup", "1",
                            "--experts", "4", "--batch", "2", "--seq", "8", "--hidden", "16",
                            "--gate", "sigmoid", "--balance", "bias", "--dropless",
                            "--max-nodes", "1", tmp_path=tmp_path)
    labrun.check_shape(record, "ep", 2)
    moe = record["results"]["lessonlib"]["moe_layer"]
    assert moe["bytes_match_routing"] and moe["output_max_abs_error"] < 1e-5
    assert 0 < moe["alltoall_share"] < 1 and moe["alltoall_time_s"] < moe["step_time_s"]
    assert moe["dropped_share"] == 0 and sum(moe["tokens_per_expert"]) == 2 * 2 * 8 * 2
    assert 0 < moe["off_node_share"] < 1 and moe["busiest_over_mean"] >= 1
    assert record["settings"]["routing"] == {"balance": "bias", "gate": "sigmoid",
                                             "bias_step": 0.001, "max_nodes": 1,
                                             "experts_per_node": 2}
    assert record["results"]["torch"]["same_rows_as_lessonlib"]
    assert [(r["implementation"], r["part"], r["e"]) for r in record["rows"]] == \
        [("lessonlib", "moe_layer", 2), ("lessonlib", "all_to_all", 2), ("torch", "all_to_all", 2)]
    assert len({tuple(r) for r in record["rows"]}) == 1          # the same columns in every row


@pytest.mark.parametrize("flags,words", [
    (("--world-size", "3"), "--experts 8 must be divisible by e = --world-size 3"),
    (("--top-k", "9"), "--top-k 9 must be at most --experts 8"),
    (("--capacity-factor", "0"), "--capacity-factor must be a positive number"),
    (("--balance", "bias", "--bias-step", "-0.01"), "--bias-step must be a finite number >= 0"),
    (("--max-nodes", "3"), "--max-nodes 3 must be between 1 and the 2 nodes (--experts 8 / "
                           "--experts-per-node 4)"),
    (("--experts-per-node", "3"), "--experts-per-node 3 must divide --experts 8"),
    (("--experts-per-node", "2"), "be a multiple of the E/e = 4 experts of one rank"),
    (("--top-k", "4", "--max-nodes", "1", "--world-size", "4"),
     "--max-nodes 1 nodes of 2 experts hold fewer than --top-k 4"),
])
def test_bad_settings_get_one_line(flags, words):
    done = _run(*flags)
    assert done.returncode == 2 and words in done.stderr.strip().splitlines()[-1]
