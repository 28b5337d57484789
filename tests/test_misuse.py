"""Misuse that used to surface raw torch or gloo errors now names the pairing or the
collective at fault (issue: no open door)."""
import pytest

import lessonlib
import rank_workers


@pytest.mark.timeout(120)
def test_full_input_to_a_row_parallel_layer_and_a_lost_bucket_peer_are_named():
    out = lessonlib.launch(rank_workers.misuse_messages, 2)[0]
    assert "RowParallelLinear(input_is_parallel=True)" in out["row_parallel"]
    assert "in/t = 4, but got 8 (the full input?)" in out["row_parallel"]
    assert "input_is_parallel=False" in out["row_parallel"]
    assert out["data_parallel"].startswith("DataParallel: the all-reduce of gradient bucket 0")
    assert "every rank of the group must run backward()" in out["data_parallel"]
    assert "Connection closed by peer" in out["data_parallel"]
