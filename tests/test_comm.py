"""The communication ledger counts every call lessonlib makes, with its payload bytes."""
import pytest
import torch

import lessonlib
import rank_workers


@pytest.mark.timeout(120)
def test_ledger_records_each_operation_with_its_bytes():
    out = lessonlib.launch(rank_workers.every_comm_op, 2)
    for rank, result in enumerate(out):
        s = result["summary"]
        assert {op: v["calls"] for op, v in s.items()} == {
            "all_reduce": 1, "broadcast": 1, "all_gather": 1, "reduce_scatter": 1,
            "send": 1, "recv": 1, "barrier": 1}
        assert s["all_reduce"]["bytes"] == 16 and s["reduce_scatter"]["bytes"] == 16
        assert s["send"]["bytes"] == (12 if rank == 0 else 20)
        assert s["recv"]["bytes"] == (20 if rank == 0 else 12)
        assert result["seconds_recorded"]
        torch.testing.assert_close(result["x"], torch.full((4,), 3.0))
        torch.testing.assert_close(result["gathered"], torch.full((8,), 3.0))
        torch.testing.assert_close(result["scattered"], torch.full((2,), 2.0))


def test_ledger_outside_a_block_records_nothing():
    from lessonlib import comm
    with comm.ledger() as book:
        pass
    assert book.count() == 0 and book.summary() == {}
