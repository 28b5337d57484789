"""The cost model against published results: Megatron-LM 2021 Table 1, its takeaways on
choosing t and p, and the planner's answer for a trillion parameters."""
from pathlib import Path

import pytest

from lessonlib.costmodel import (BYTES_PER_PARAM, CLUSTERS, GPT, MODELS, load_table1, plan,
                                 table1_report, table1_rows, tp_sweep)

TABLE1 = Path(__file__).resolve().parents[1] / "data" / "megatron2021_table1.csv"
ROWS = load_table1(TABLE1)


def test_table1_file_has_the_ten_rows():
    assert len(ROWS) == 10
    assert [r["params_billion"] for r in ROWS][::9] == [1.7, 1008.0]


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r['params_billion']}B")
def test_eq2_gives_table1_parameter_counts(row):
    model = GPT(row["layers"], row["hidden"], row["heads"], 2048, 51200)
    # The table prints one decimal: Eq. 2 must round to it.
    assert model.params() / 1e9 == pytest.approx(row["params_billion"], abs=0.05)


# Since a GEMM runs at the A100's measured MAMF (not a share of peak chosen on this table),
# three of the rows with a pipeline of 4 or more stages run slower than modelled by over 15 %:
# a cost the model lacks, listed, strict (``test_costmodel_published.MISSES``).
TABLE1_MISSES = {76.1, 310.1, 529.6}


@pytest.mark.parametrize("row", [pytest.param(r, marks=pytest.mark.xfail(
    strict=True, reason="over 15 %: a cost the model lacks")) if r.params_billion
    in TABLE1_MISSES else r for r in table1_rows(TABLE1)],
    ids=lambda r: f"{r.params_billion}B")
def test_estimate_reproduces_table1_within_15_percent(row):
    assert row.estimate.fits, "the published layout must fit in 80 GB"
    assert abs(row.error) < 0.15, (row.predicted, row.tflops_per_gpu)


def test_table1_rows_are_within_20_percent_and_all_predicted_fast():
    errors = [r.error for r in table1_rows(TABLE1)]
    assert 0 < min(errors) and max(errors) < 0.20


def test_table1_report_lists_every_row():
    text = table1_report(TABLE1)
    assert len(text.splitlines()) == 12 and "1008.0B" in text and "published" in text


def test_sweet_spot_is_one_server_of_tensor_parallelism():
    """gpt-161B on 64 A100 (8 per server), B = 64, b = 1, d = 1: t*p = 64.

    The model needs all 64 GPUs for its 2.6 TB of model state, so d = 1 and the sweep is over
    t with p = 64/t. Throughput peaks at t = 4 to 8 and falls on both sides: below, the
    deeper pipeline's bubble grows ((p-1)/m); above, the all-reduces leave NVLink for the
    network. (With B >= 128 this model prefers t = 4 by a few percent: the bubble shrinks
    with m.)
    """
    sweep = tp_sweep(MODELS["gpt-161B"], CLUSTERS["dgx-a100"], n_gpus=64, global_batch=64)
    assert [t for t, _, _ in sweep] == [1, 2, 4, 8, 16, 32, 64]
    assert all(e is not None and e.fits for _, _, e in sweep)
    tflops = {t: e.tflops_per_gpu for t, _, e in sweep}
    # t = 4 and t = 8 within a few percent (the paper's Fig. 13 measured t = 8 best), then
    # falling on both sides
    assert tflops[8] > 0.97 * max(tflops.values())
    assert tflops[1] < tflops[2] < tflops[4] and tflops[8] > tflops[16] > tflops[32] > tflops[64]


@pytest.mark.parametrize("cluster", ["dgx-a100", "dgx-h100"])
def test_planner_for_one_trillion_parameters(cluster):
    model, servers = MODELS["megatron-1T"], CLUSTERS[cluster]
    result = plan(model, servers, n_gpus=1024, global_batch=2048)
    pure_dp = result.find(t=1, p=1)
    assert pure_dp in result.rejected and pure_dp.layout.d == 1024
    assert pure_dp.memory.model_state == pytest.approx(BYTES_PER_PARAM * model.params())
    assert pure_dp.memory.model_state > 180 * servers.gpu.memory_bytes  # 16.1 TB vs 80 GiB
    best = result.best
    lay = best.layout
    assert lay.t == servers.gpus_per_node == 8  # TP fills a server, no more
    assert lay.p > 1 and lay.d == 1024 // (lay.t * lay.p)  # PP across servers, DP the rest
    assert best.fits and 0 < best.memory.total < servers.gpu.memory_bytes
    text = result.explain()
    assert "16.13 TB" in text and "80 GiB" in text and f"t={lay.t}" in text
    assert f"{best.step_time_s:.1f} s per step" in text
