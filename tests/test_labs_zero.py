"""labs/zero.py runs end to end with tiny settings, writes the shared result shape with
lessonlib's and torch's step times and their ratio, and refuses bad settings before any
process starts."""
import pytest
from labrun import check_shape, load_lab, run_lab


@pytest.mark.timeout(300)
def test_zero_lab_times_every_stage_against_fully_shard(tmp_path):
    record = run_lab("zero", "--world-size", "2", "--steps", "2", "--warmup", "1",
                     "--rounds", "1", "--layers", "2", "--hidden", "16", "--seq", "8",
                     "--stages", "0,1,2,3,3-noprefetch,torch-fsdp2", "--overlap",
                     tmp_path=tmp_path)
    check_shape(record, "zero", 2)
    results = record["results"]
    assert set(results) == {"lessonlib_stage0", "lessonlib_stage1", "lessonlib_stage2",
                            "lessonlib", "lessonlib_no_prefetch", "torch"}
    for name, entry in results.items():
        assert entry["step_time_s"] > 0 and entry["samples_per_s"] > 0
        assert 0 <= entry["max_weight_diff_vs_one_process"] <= 1e-4     # float32
        held, want = entry["bytes_held_per_rank"], entry["predicted"]["bytes_held"]
        assert len(held) == 2 and held[0]["gradients"] == want["gradients"]
        assert held[0]["optimizer"] == want["optimizer"] or name == "lessonlib_stage1"
        if name.startswith("lessonlib"):
            assert entry["bytes_sent_per_rank"] == [pytest.approx(
                entry["predicted"]["bytes_sent_per_rank"])] * 2
    assert results["lessonlib"]["bytes_sent_per_rank"][0] == pytest.approx(
        1.5 * results["lessonlib_stage0"]["bytes_sent_per_rank"][0], rel=0.01)
    assert record["lessonlib_vs_torch_step_time"] > 0
    assert record["prefetch_vs_none_step_time"] > 0
    overlap = record["overlap"]       # --overlap: what communication held a rank, per step
    assert overlap["prefetch"] > 0 and overlap["no_prefetch"] > 0
    assert overlap["prefetch_over_none"] == pytest.approx(overlap["prefetch"]
                                                          / overlap["no_prefetch"])


def test_zero_parity_names_the_stage_rank_and_weight_that_differ_from_one_process():
    zero = load_lab("zero")
    want, _ = zero.train_single("sgd", steps=zero.PARITY_STEPS, global_batch=4, dtype="float32")
    ranks = [{"parity_weights": {"3": {k: v.double() for k, v in want.items()}}}
             for _ in range(2)]
    assert zero.compare_parity(ranks, "sgd") == {"3": 0.0}
    ranks[1]["parity_weights"]["3"]["head.out.weight"][0, 0] += 0.05    # one SGD step, missed
    with pytest.raises(AssertionError, match="stage 3, rank 1: head.out.weight differs"):
        zero.compare_parity(ranks, "sgd")


@pytest.mark.parametrize("flags, message", [
    (["--stages", "3,4"], "choose from 0,1,2,3"),
    (["--batch", "0"], "--batch must be a positive integer"),
    (["--hidden", "10", "--heads", "4"], "--hidden 10 must be divisible by --heads 4"),
    (["--warmup", "-1"], "--warmup must be 0 or more"),
    (["--stages", "0,3", "--overlap"], "--stages must hold 3 and 3-noprefetch"),
])
def test_zero_lab_refuses_bad_settings_before_any_process_starts(flags, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        load_lab("zero").main(flags)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
