"""labs/allreduce.py and labs/ddp.py run end to end with tiny settings, write the shared
result shape, and refuse bad settings before any process starts."""
import pytest
from labrun import check_shape, load_lab, run_lab

@pytest.mark.timeout(160)
def test_allreduce_lab_writes_times_busbw_and_ledger_bytes(tmp_path):
    record = run_lab("allreduce", "--world-size", "3", "--size-mb", "0.25", "--budget-s", "0.2",
                     "--steps", "3", tmp_path=tmp_path)
    check_shape(record, "allreduce", 3)
    results, size = record["results"], record["settings"]["size_bytes"]
    assert set(results) == {"ring", "naive_ring", "parameter_server", "torch"}
    for entry in results.values():
        assert entry["time_s"] > 0 and entry["busbw_GBps"] > 0 and entry["max_error"] < 1e-4
    theory = results["ring"]["bytes_theory_per_rank"]      # 2(n-1)/n x S
    for sent in results["ring"]["bytes_sent_per_rank"]:    # chunks differ by one element
        assert abs(sent - theory) <= 2 * (3 - 1) * 4
    assert results["naive_ring"]["bytes_sent_per_rank"] == [2 * size] * 3
    assert results["parameter_server"]["server_link_bytes"] == \
        results["parameter_server"]["server_link_bytes_theory"] == 4 * size
    assert record["ring_vs_torch_busbw"] > 0


@pytest.mark.timeout(160)
def test_allreduce_sweep_fits_alpha_beta(tmp_path):
    record = run_lab("allreduce", "--sweep", "--world-sizes", "1,2", "--sizes-kb", "1,64",
                     "--budget-s", "0.1", "--steps", "3", "--algorithms", "ring,torch",
                     tmp_path=tmp_path)
    check_shape(record, "allreduce", 2)
    assert record["settings"]["world_sizes"] == [1, 2]
    for name in ("ring", "torch"):
        points = record["results"][name]["points"]
        assert [(q["world_size"], q["size_bytes"]) for q in points] == \
            [(1, 1024), (1, 65536), (2, 1024), (2, 65536)]
        fit = record["results"][name]["fit"]
        assert fit["alpha_s"] >= 0 and fit["bandwidth_Bps"] > 0 and fit["points"] == 2


@pytest.mark.timeout(160)
def test_ddp_lab_times_every_rung(tmp_path):
    record = run_lab("ddp", "--world-size", "2", "--model", "tiny", "--steps", "2",
                     "--warmup", "1", "--rounds", "1", "--rungs", "bucketed,naive,torch",
                     "--bucket-cap-mb", "0.01", tmp_path=tmp_path)
    check_shape(record, "ddp", 2)
    results = record["results"]
    assert set(results) == {"lessonlib", "lessonlib_naive", "torch"}
    for entry in results.values():
        assert entry["step_time_s"] > 0 and entry["samples_per_s"] > 0
        assert entry["gradient_bytes_per_step"] == 4 * record["settings"]["parameters"]
        assert 0 <= entry["max_weight_diff_vs_one_process"] <= 1e-4     # float32
    assert results["lessonlib_naive"]["all_reduces_per_step"] == 37
    grad_bytes = 4 * record["settings"]["parameters"]
    assert results["lessonlib"]["bytes_all_reduced_per_step"] == grad_bytes
    assert record["lessonlib_vs_torch_step_time"] > 0 and record["naive_vs_lessonlib_step_time"] > 0


@pytest.mark.timeout(160)
def test_ddp_sweep_reports_scaling_efficiency(tmp_path):
    record = run_lab("ddp", "--sweep", "--world-sizes", "1,2", "--model", "tiny", "--steps", "2",
                     "--warmup", "1", "--rounds", "1", "--rungs", "bucketed,torch",
                     tmp_path=tmp_path)
    check_shape(record, "ddp", 2)
    for name in ("lessonlib", "torch"):
        eff = record["results"][name]["scaling_efficiency"]
        assert set(eff) == {"1", "2"} and eff["1"] == pytest.approx(1.0) and eff["2"] > 0
        assert set(record["results"][name]["by_world_size"]) == {"1", "2"}


def test_ddp_parity_names_the_rung_and_rank_that_differ_from_one_process():
    ddp = load_lab("ddp")
    want = ddp.train_single(global_batch=4, **ddp.PARITY).weights
    ranks = [{"parity_weights": {"bucketed": want.clone()}} for _ in range(2)]
    assert ddp.compare_parity(ranks) == {"bucketed": 0.0}
    ranks[1]["parity_weights"]["bucketed"][5] += 3e-3          # one AdamW step, missed
    with pytest.raises(AssertionError, match="rung bucketed, rank 1: weights differ"):
        ddp.compare_parity(ranks)


@pytest.mark.parametrize("lab, flags, message", [
    ("allreduce", ["--size-mb", "0"], "--size-mb (0.0) and --budget-s (3.0) must be positive"),
    ("allreduce", ["--algorithms", "ring,fast"], "unknown ['fast']"),
    ("allreduce", ["--world-size", "0"], "--world-size must be a positive integer"),
    ("allreduce", ["--sweep", "--world-sizes", "2,x"], "comma-separated numbers"),
    ("ddp", ["--bucket-cap-mb", "0"], "--bucket-cap-mb must be a positive number"),
    ("ddp", ["--rungs", "bucketed,fast"], "choose from naive,flat,async,bucketed,torch"),
    ("ddp", ["--batch", "0"], "--batch must be a positive integer"),
    ("ddp", ["--world-sizes", "0,2", "--sweep"], "--world-sizes must all be >= 1"),
])
def test_bad_settings_exit_before_any_process_starts(lab, flags, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        load_lab(lab).main(flags)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
