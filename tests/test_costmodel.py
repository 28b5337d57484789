"""The cost model's formulas against hand-computed numbers and the papers' own examples."""
import json
from pathlib import Path

import pytest

from lessonlib.costmodel import (
    BYTES_PER_PARAM, CLUSTERS, MODELS, SECONDS_PER_YEAR, Layout, activation_bytes_per_layer,
    bubble_fraction, bus_bandwidth, busbw_factor, estimate, get_gpu, group_spans_nodes,
    in_flight_microbatches, make_cluster, megatron_flops_per_iteration,
    megatron_training_days, memory_per_gpu, model_state_bytes, parameter_server_bytes,
    pp_elements_per_boundary, rate_for_time, ring_allreduce_bytes_per_rank, ring_allreduce_time_s,
    stashed_microbatches, tp_elements_per_layer, training_flops, training_time_s)
from lessonlib.costmodel.__main__ import main

GPT2 = MODELS["gpt2-small"]  # s=1024, h=768, a=12: s*h = 786,432


# --- compute and time (Megatron-LM 2021, Eq. 3 and 4) -------------------------------------

def test_eq4_gpt3_34_days():
    assert megatron_training_days(175e9, 300e9, 1024, 140e12) == pytest.approx(34, abs=1)


def test_eq4_1T_84_days():
    days = megatron_training_days(MODELS["megatron-1T"].params(), 450e9, 3072, 163e12)
    assert days == pytest.approx(84, abs=1)


def test_eq3_is_8PD_up_to_attention_and_logits():
    # Eq. 3 per token / Eq. 2 parameters -> about 8 FLOPs per parameter (6 + 2 recompute).
    model = MODELS["gpt3-175B"]
    per_token = megatron_flops_per_iteration(model, 1) / model.s
    assert per_token / model.params() == pytest.approx(8, rel=0.05)


def test_288_years_rate_on_one_v100():
    # Megatron-LM 2021 §1: GPT-3 on one V100 ~ 288 years; the rate is not stated.
    flops = training_flops(175e9, 300e9)  # 6PD = 3.15e23
    rate = rate_for_time(flops, 1, 288 * SECONDS_PER_YEAR)
    assert rate == pytest.approx(34.7e12, rel=0.01)  # 28 % of the V100's 125 TFLOP/s
    assert training_time_s(flops, 1, rate) == pytest.approx(288 * SECONDS_PER_YEAR)
    assert rate / get_gpu("V100").peak_flops == pytest.approx(0.28, abs=0.01)


# --- memory --------------------------------------------------------------------------------

def test_16_bytes_per_param_gpt3_is_2_8_TB():
    assert BYTES_PER_PARAM == 16
    assert sum(model_state_bytes(175e9)) == pytest.approx(2.8e12)
    assert sum(model_state_bytes(MODELS["gpt3-175B"].params())) == pytest.approx(2.8e12,
                                                                                 rel=0.01)


def test_zero_stages_match_zero_paper_figure_1():
    # ZeRO (Rajbhandari et al. 2020), Figure 1: 7.5 B parameters, N_d = 64.
    gb = [sum(model_state_bytes(7.5e9, stage, 64)) / 1e9 for stage in range(4)]
    assert [round(x, 1) for x in gb] == [120.0, 31.4, 16.6, 1.9]


def test_activation_bytes_korthikanti_table2_by_hand():
    # gpt2-small, b=1; 5*a*s/h = 5*12*1024/768 = 80; plus the measured layer's norm
    # statistics, 16 bytes per token (s/t rows under SP), which Table 2 leaves out
    sbh, stats = 1024 * 768, 16 * 1024
    assert activation_bytes_per_layer(GPT2, 1) == sbh * 114 + stats
    assert activation_bytes_per_layer(GPT2, 1, t=2) == sbh * (10 + 12 + 40) + stats
    assert activation_bytes_per_layer(GPT2, 1, t=2, sequence_parallel=True) == \
        sbh * 57 + stats / 2
    assert activation_bytes_per_layer(GPT2, 1, t=2, recompute="selective") == sbh * 22 + stats
    assert activation_bytes_per_layer(GPT2, 2, t=2, recompute="full") == 2 * 2 * sbh


def test_in_flight_microbatches():
    assert stashed_microbatches("1f1b", 4, 8) == 4
    assert stashed_microbatches("1f1b", 4, 8, stage=3) == 1
    assert stashed_microbatches("1f1b", 4, 2) == 2
    assert stashed_microbatches("gpipe", 4, 8, stage=3) == 8
    assert in_flight_microbatches("1f1b", 4, 8, v=2) == pytest.approx(4 * (1 + 3 / 8))


def test_memory_per_gpu_by_hand():
    # gpt2-small on one GPU, b=1, m=4, no recompute: with p=1, 1F1B holds min(p, m) = 1
    # micro-batch at a time, and each of the 12 layers keeps 114*s*h bytes of it (+ 16 per
    # token of norm statistics); the output layer keeps the final LayerNorm's input and
    # statistics and the head's input (2h + 8 + 2h per token), the loss's float32 peak 12 V.
    layer = 114 * 1024 * 768 + 16 * 1024
    mem = memory_per_gpu(GPT2, b=1, m=4, recompute="none")
    assert mem.weights == pytest.approx(2 * GPT2.params())
    assert mem.model_state == pytest.approx(16 * GPT2.params())
    assert mem.activations == 12 * layer
    assert mem.logits == (4 * 768 + 8 + 12 * 50257) * 1024
    # Full recompute: 12 layer inputs (2*s*h each) + one layer rebuilt, working memory.
    full = memory_per_gpu(GPT2, b=1, m=4, recompute="full")
    assert full.activations == 12 * 2 * 1024 * 768 and full.working == layer
    gpipe = memory_per_gpu(GPT2, p=2, b=1, m=4, recompute="none", schedule="gpipe")
    assert gpipe.activations == 6 * 4 * layer


# --- bubble ----------------------------------------------------------------------------------

def test_bubble_both_conventions():
    assert bubble_fraction(4, 8) == pytest.approx(3 / 11)
    assert bubble_fraction(4, 8, convention="ideal") == pytest.approx(3 / 8)
    assert bubble_fraction(4, 8, v=2, convention="ideal") == pytest.approx(0.1875)
    assert bubble_fraction(4, 8, v=2) == pytest.approx(3 / 19)
    assert bubble_fraction(1, 8) == 0


# --- communication ---------------------------------------------------------------------------

def test_ring_allreduce_by_hand():
    assert ring_allreduce_bytes_per_rank(4, 1e9) == pytest.approx(1.5e9)
    assert ring_allreduce_time_s(4, 1e9, 1e9) == pytest.approx(1.5)
    assert ring_allreduce_time_s(4, 1e9, 1e9, latency=1e-3) == pytest.approx(1.506)
    assert ring_allreduce_time_s(1, 1e9, 1e9) == 0
    # Bandwidth term approaches 2*S/B however many ranks: the ring is bandwidth-optimal.
    assert ring_allreduce_time_s(1024, 1e9, 1e9) < 2.0


def test_parameter_server_and_busbw():
    assert parameter_server_bytes(5, 1e6) == 8e6
    assert busbw_factor("all_reduce", 8) == pytest.approx(1.75)
    assert busbw_factor("all_gather", 8) == pytest.approx(0.875)
    assert busbw_factor("broadcast", 8) == 1
    assert bus_bandwidth("all_reduce", 8, 1e9, 0.01) == pytest.approx(1.75e11)


def test_tp_and_pp_message_sizes():
    sbh = 1024 * 768
    assert tp_elements_per_layer(1, 1024, 768, 2) == 8 * sbh / 2
    assert tp_elements_per_layer(1, 1024, 768, 2, recompute=True) == 12 * sbh / 2
    assert tp_elements_per_layer(4, 1024, 768, 1) == 0
    assert pp_elements_per_boundary(1, 1024, 768) == sbh
    assert pp_elements_per_boundary(1, 1024, 768, t=4) == sbh / 4
    assert pp_elements_per_boundary(1, 1024, 768, t=4, scatter_gather=False) == sbh


def test_groups_and_server_boundaries():
    assert not group_spans_nodes(16, 8, 1, 8)  # TP of 8 in an 8-GPU server
    assert group_spans_nodes(16, 16, 1, 8)  # TP of 16 crosses
    assert group_spans_nodes(16, 2, 8, 8)  # PP stages of t=8 are in different servers
    assert not group_spans_nodes(16, 4, 2, 8)  # t=2, p=4 fits one server
    assert group_spans_nodes(12, 3, 1, 8)  # t=3: the group 6,7,8 straddles


# --- estimate --------------------------------------------------------------------------------

def test_estimate_parts_add_up_and_vanish_when_unused():
    est = estimate(GPT2, Layout(b=4, m=2), CLUSTERS["dgx-a100"])
    assert est.step_time_s == pytest.approx(sum(est.time.values()))
    for part in ("tp_comm", "pp_comm", "bubble", "dp_comm"):
        assert est.time[part] == 0
    est = estimate(GPT2, Layout(t=2, p=4, d=1, b=1, m=8), CLUSTERS["dgx-a100"])
    busy = est.step_time_s - est.time["bubble"] - est.time["optimizer"]   # after the flush
    assert 0 < est.time["optimizer"] < 0.05 * busy
    assert est.time["bubble"] / busy == pytest.approx(bubble_fraction(4, 8, convention="ideal"))
    assert est.bubble_fraction == pytest.approx(bubble_fraction(4, 8), rel=0.05)


def test_tp_across_servers_pays_the_network():
    # A cluster with one 200 Gb/s port per server, crossed by one flat ring (on DGX servers,
    # with a port per GPU, see test_costmodel_network.py).
    one_port = make_cluster("A100", 8, network_ports=1, collectives="flat-ring")
    model = MODELS["gpt-161B"]
    inside = estimate(model, Layout(t=8, p=8, b=1, m=64), one_port)
    across = estimate(model, Layout(t=16, p=4, b=1, m=64), one_port)
    per_layer_in = inside.time["tp_comm"] / 16
    per_layer_across = across.time["tp_comm"] / 32
    # 300 GB/s NVLink vs 25 GB/s network per GPU: an order of magnitude
    assert per_layer_across > 10 * per_layer_in


# --- bad input --------------------------------------------------------------------------------

@pytest.mark.parametrize("make, setting", [
    (lambda: Layout(t=0, global_batch=8), "t=0"),
    (lambda: Layout(d=4, b=1, global_batch=10), "global_batch=10"),
    (lambda: Layout(p=4, v=2, m=6), "m=6"),
    (lambda: Layout(recompute="some"), "recompute="),
    (lambda: Layout(p=13, m=13).check(GPT2), "p=13"),
    (lambda: Layout(t=5, m=1).check(GPT2), "t=5"),
    (lambda: get_gpu("B300"), "gpu='B300'"),
    (lambda: bubble_fraction(4, 8, convention="total"), "convention="),
    (lambda: stashed_microbatches("1f1b", 4, 8, stage=4), "stage=4"),
])
def test_bad_input_names_the_setting(make, setting):
    with pytest.raises(ValueError, match=setting.replace("(", r"\(")):
        make()


CLI = ["--layers", "96", "--hidden", "12288", "--heads", "96", "--seq", "2048", "--vocab",
       "51200", "--t", "8", "--p", "12", "--d", "4", "--microbatch", "1", "--global-batch",
       "1536", "--gpu", "A100-80GB", "--gpus-per-node", "8"]


def test_cli_json(capsys):
    assert main(CLI + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("tflops_per_gpu", "bubble_fraction", "step_time_s", "memory_per_gpu_bytes"):
        assert out[key] > 0
    assert out["n_gpus"] == 384 and out["m"] == 384


@pytest.mark.parametrize("extra, setting", [
    (["--gpus", "512"], "gpus=512"),
    (["--p", "97"], "p=97"),
    (["--microbatch", "5"], "global_batch=1536"),
    (["--gpu", "TPUv4"], "gpu='TPUv4'"),
])
def test_cli_bad_input_exit_2_one_line(capsys, extra, setting):
    assert main(CLI + extra) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and setting in err


def test_cli_sets_how_the_layout_runs(capsys):
    """Every Layout setting a published run needs is a flag: NeMo's Llama 3 70B in FP8."""
    run = ["--model", "llama3-70B", "--cluster", "dgx-h100", "--gpus", "64", "--t", "4",
           "--p", "4", "--c", "2", "--v", "5", "--global-batch", "128", "--recompute", "none",
           "--sequence-parallel", "--zero", "1", "--overlap-comm", "--json"]
    assert main(run) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(run + ["--precision", "fp8", "--fp8-scaling", "te", "--attention-kernel",
                       "cudnn", "--loss", "megatron-fused", "--async-tp", "--overlap-p2p",
                       "--reduce-dtype", "fp32"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["step_time_s"] < plain["step_time_s"]
    for words in ("FP8 te", "async TP", "overlapped sends", "cudnn attention", "fp32 reduce",
                  "megatron-fused loss"):
        assert words in out["layout"], words
    assert main(run + ["--async-tp", "--comm-sm-share", "1.5"]) == 2
    assert "comm_sm_share=1.5" in capsys.readouterr().err
    # a plan gives every candidate the settings any layout can take
    plan = ["--model", "llama3-8B", "--cluster", "dgx-h100", "--gpus", "16",
            "--global-batch", "64", "--plan", "--precision", "fp8", "--attention-kernel", "cudnn"]
    assert main(plan) == 0 and "FP8 cudnn attention" in capsys.readouterr().out


def test_costmodel_never_imports_torch():
    package = Path(__file__).resolve().parents[1] / "lessonlib" / "costmodel"
    for source in package.glob("*.py"):
        text = source.read_text()
        assert "import torch" not in text and "from torch" not in text, source.name


def test_the_embeddings_dense_gradient_is_paid_each_micro_batch_on_its_stage():
    """PyTorch's embedding backward zeroes a gradient of the whole V/t x h table and the
    framework moves it into its buffer: 2 + 2 bytes, then the reduce dtype written (and read
    too where Megatron's ZeRO-1/2 adds it into its main grad), on the first stage only."""
    from dataclasses import replace
    from lessonlib.costmodel import gemm
    from lessonlib.costmodel.kernels import embedding_grad_bytes
    from lessonlib.costmodel.throughput import _stage_microbatch_s
    m, cluster = MODELS["llama3-8B"], CLUSTERS["dgx-h100"]
    assert embedding_grad_bytes(m, 2, 4, True) == (2 + 2 + 8) * m.V / 2 * m.h
    assert embedding_grad_bytes(m, 1, 2, False) == (2 + 2 + 2) * m.V * m.h
    lay = Layout(t=2, p=2, d=2, b=1, m=4, zero_stage=1, reduce_dtype="fp32")
    first, other = (_stage_microbatch_s(m, lay, cluster, 16, 0, embedding=e) for e in (1, 0))
    hbm = cluster.gpu.hbm_bytes_per_s * gemm.HBM_EFFICIENCY
    assert first[1] - other[1] == pytest.approx(embedding_grad_bytes(m, 2, 4, True) / hbm)
    fsdp = replace(lay, zero_stage=3, p=1, d=4, global_batch=None)
    assert _stage_microbatch_s(m, fsdp, cluster, 32, 1)[1] - _stage_microbatch_s(
        m, fsdp, cluster, 32, 1, embedding=0)[1] == pytest.approx(
            embedding_grad_bytes(m, 2, 4, False) / hbm)
