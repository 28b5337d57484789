"""The cost model's low-precision and overlap terms, without processes: async TP hides at most
the GEMM time beside its collectives, pays for its GEMMs in t pieces, and does nothing at
t = 1; FP8 speeds only the linear GEMMs
and pays tensorwise casts by torchao's count; the gains function toggles one technique at a
time. (The torchtitan rows within 15 % are in test_costmodel_published.py.)"""
from dataclasses import replace

import pytest

from lessonlib.costmodel import CLUSTERS, MODELS, Layout, estimate
from lessonlib.costmodel import gemm
from lessonlib.costmodel.gains import overlap_and_precision_gains
from lessonlib.costmodel.comm import ring_all_gather_time_s
from lessonlib.costmodel.overlap import (CONTENTION, async_tp_exposed_s, async_tp_reduce_s,
                                         async_tp_split_s, contention_s, p2p_exposed_share,
                                         pytorch_sp_copy_s, sp_gemms_s, tp_comm_s)

TETON, M8 = CLUSTERS["grand-teton-h100-96gb"], MODELS["llama3-8B"]


def test_async_tp_exposes_the_transfer_less_all_but_one_piece_of_the_gemm():
    assert async_tp_exposed_s(2.0, 1.0, 8) == pytest.approx(2.0 - 7 / 8)   # comm-bound
    assert async_tp_exposed_s(1.0, 4.0, 8) == 0.0                          # GEMM-bound
    assert async_tp_exposed_s(1.0, 1.0, 2) == pytest.approx(0.5)           # half a GEMM hides


def test_async_tp_hides_at_most_the_gemm_time_and_nothing_at_t1():
    lay = Layout(t=8, d=8, b=12, m=1, zero_stage=3, recompute="op", sequence_parallel=True,
                 overlap_comm=True)
    off, on = (estimate(M8, replace(lay, async_tp=a), TETON) for a in (False, True))
    gemms = sum(sp_gemms_s(M8, 12, TETON.gpu, t=8)) * 7 / 8
    hidden = off.time["tp_comm"] - on.time["tp_comm"]
    assert 0 < hidden <= M8.L * 2 * gemms            # forward and backward, one layer each
    # what it hides slows the compute beside it (Lee et al. 2025), the rest of the step alike
    assert on.time["contention"] - off.time["contention"] == pytest.approx(
        contention_s(hidden))
    # the fused GEMMs run in t pieces of 1/t of their rows: the compute grows by that alone
    # (all four forward, the backward's two under Megatron's plan, which this layout runs)
    split = sp_gemms_s(M8, 12, TETON.gpu, t=8, pieces=8)
    whole = sp_gemms_s(M8, 12, TETON.gpu, t=8)
    more = async_tp_split_s(M8, replace(lay, async_tp=True), TETON.gpu)
    assert more == pytest.approx(2 * (sum(split) - sum(whole))) and more > 0
    assert on.time["compute"] - off.time["compute"] == pytest.approx(M8.L * more)
    assert async_tp_split_s(M8, replace(lay, async_tp=True, tp_plan="pytorch"), TETON.gpu) \
        == pytest.approx(sum(split) - sum(whole) + split[1] - whole[1] + split[3] - whole[3])
    assert {k: v for k, v in off.time.items() if k not in ("tp_comm", "contention", "compute")} \
        == {k: v for k, v in on.time.items() if k not in ("tp_comm", "contention", "compute")}
    one = Layout(d=8, b=2, m=1, zero_stage=3, sequence_parallel=True)
    assert estimate(M8, replace(one, async_tp=True), TETON).time == \
        estimate(M8, one, TETON).time
    with pytest.raises(ValueError, match="sequence_parallel=True"):
        Layout(t=8, d=1, m=1, async_tp=True)


def test_pytorchs_plan_copies_each_gathered_tensor_and_gathers_fp8_inputs_in_fp8():
    """torch/distributed/_functional_collectives.py: a gather or scatter along dim 1 (the
    sequence of batch-first activations) costs a chunk + cat of the whole tensor; torchao's
    PrepareFloat8ModuleInput gathers the forward's inputs in FP8."""
    lay = Layout(t=8, d=8, b=12, m=1, recompute="op", sequence_parallel=True, zero_stage=3)
    torch_plan = replace(lay, tp_plan="pytorch")
    copy = pytorch_sp_copy_s(M8, torch_plan, TETON)
    assert copy == pytest.approx(2 * 2 * 12 * M8.s * M8.h / (TETON.gpu.hbm_bytes_per_s * 0.8))
    # Megatron's [s, b, h] layout, a batch of one (a view) and async TP's fused ops pay none
    assert pytorch_sp_copy_s(M8, lay, TETON) == 0.0
    assert pytorch_sp_copy_s(M8, replace(torch_plan, b=1, m=12), TETON) == 0.0
    assert pytorch_sp_copy_s(M8, replace(torch_plan, async_tp=True), TETON) == 0.0
    megatron, torch = (tp_comm_s(M8, x, TETON, 1, 0.8)[0] for x in (lay, torch_plan))
    assert torch - megatron == pytest.approx(10 * copy)   # 4 + 4 collectives, 2 regathers
    # FP8: the forward's two all-gathers carry one byte an element
    bw, lat = TETON.group_link(64, 8, 1)
    full, half = (ring_all_gather_time_s(8, x * 12 * M8.s * M8.h, bw * 0.8, lat) for x in (2, 1))
    fp8 = replace(torch_plan, precision="fp8", fp8_scaling="tensorwise")
    assert tp_comm_s(M8, fp8, TETON, 1, 0.8)[0] == pytest.approx(
        torch - 2 * (full - half) - copy)     # two gathers' bytes and copies halved
    assert tp_comm_s(M8, replace(lay, precision="fp8", fp8_scaling="tensorwise"), TETON, 1,
                     0.8)[0] == pytest.approx(megatron)


def test_transformer_engines_fp8_casts_fewer_bytes_and_gathers_fp8_both_ways():
    """TE's delayed scaling: no amax pass, the norm writes the QKV's and first MLP GEMM's
    FP8 input, cast and transpose in one pass, the weights cast once a step; its SP
    gathers carry FP8 forward (the norm's output) and backward (the output gradients)."""
    m8 = MODELS["llama3-8B"]
    te, torchao = (gemm.fp8_quantization_bytes(m8, 1, 1, scaling=x) for x in ("te", "tensorwise"))
    assert 0 < te < torchao / 1.5
    linear = [g for g in gemm.layer_gemms(m8, 1) if g[4] == "linear"]
    qkv, proj, up, down = ((m * k, m * n, k * n) for m, n, k, _, _ in linear)
    assert te == pytest.approx(sum(x * i + 4 * (o + w) for x, (i, o, w) in zip(
        (2, 4, 2, 4), (qkv, proj, up, down))))
    # a recompute casts again only what no norm writes; the weights' cast is shared
    again = gemm.fp8_quantization_bytes(m8, 1, 1, scaling="te", recompute=True)
    assert again - te == pytest.approx(3 * (proj[0] + down[0]))
    shared = gemm.fp8_quantization_bytes(m8, 1, 1, scaling="te", microbatches=8)
    assert te - shared == pytest.approx(4 * 7 / 8 * sum(w for _, _, w in (qkv, proj, up, down)))
    lay = Layout(t=8, d=8, b=1, m=8, recompute="none", sequence_parallel=True,
                 precision="fp8", fp8_scaling="te")
    assert "FP8 te" in lay.describe()
    bw, lat = TETON.group_link(64, 8, 1)
    full, half = (ring_all_gather_time_s(8, x * M8.s * M8.h, bw * 0.8, lat) for x in (2, 1))
    assert tp_comm_s(M8, lay, TETON, 1, 0.8)[0] == pytest.approx(4 * half + 4 * full)
    plain = replace(lay, precision="bf16")
    assert tp_comm_s(M8, plain, TETON, 1, 0.8)[0] == pytest.approx(8 * full)


def test_transformer_engines_current_scaling_takes_each_amax_and_caches_the_weights():
    """TE's current scaling: an amax pass before every cast but where the norm takes the
    amax as it writes (its output then cast once with its transpose), the output gradients
    likewise, the weights cast once a step as under delayed scaling; so between TE's
    delayed scaling and torchao's, and gathering FP8 as TE does."""
    m8 = MODELS["llama3-8B"]
    current, te, torchao = (gemm.fp8_quantization_bytes(m8, 1, 1, scaling=x, microbatches=8)
                            for x in ("te-current", "te", "tensorwise"))
    assert te < current < torchao
    linear = [g for g in gemm.layer_gemms(m8, 1) if g[4] == "linear"]
    shapes = [(m * k, m * n, k * n) for m, n, k, _, _ in linear]
    assert current == pytest.approx(sum(x * i + 6 * (o + w / 8) for x, (i, o, w) in zip(
        (4, 6, 4, 6), shapes)))
    again = gemm.fp8_quantization_bytes(m8, 1, 1, scaling="te-current", microbatches=8,
                                        recompute=True)
    assert again - current == pytest.approx(sum(x * i for x, (i, _, _) in zip(
        (3, 5, 3, 5), shapes)))
    lay = Layout(t=8, d=8, b=1, m=8, recompute="none", sequence_parallel=True,
                 precision="fp8", fp8_scaling="te-current")
    assert "FP8 te-current" in lay.describe()
    assert tp_comm_s(M8, lay, TETON, 1, 0.8) == tp_comm_s(
        M8, replace(lay, fp8_scaling="te"), TETON, 1, 0.8)


def test_async_tp_leaves_the_backwards_input_gradient_reduce_scatters_exposed():
    """The micro-pipeline pass fuses a reduce-scatter into the one matmul producing it; the
    input gradients of QKV and the MLP's first GEMMs are sums of matmuls, so theirs run as
    without async TP: two of a layer's four backward collectives."""
    lay = Layout(t=8, d=8, b=12, m=1, recompute="none", sequence_parallel=True, zero_stage=3,
                 tp_plan="pytorch", async_tp=True)
    exposed, hidden = tp_comm_s(M8, lay, TETON, 1, 0.8)
    bw, lat = TETON.group_link(64, 8, 1)
    one = ring_all_gather_time_s(8, 2 * 12 * M8.s * M8.h, bw * 0.8, lat)
    copy = pytorch_sp_copy_s(M8, replace(lay, async_tp=False), TETON)
    reduce = async_tp_reduce_s(M8, lay, TETON)     # the fused reduce-scatters' late sums
    assert exposed >= 2 * (one + copy) + reduce
    assert exposed + hidden == pytest.approx(8 * one + 2 * copy + reduce)
    # Megatron's --tp-comm-overlap hides those behind the weight-gradient GEMMs
    # (tp_comm_bulk_dgrad): under its plan all eight collectives stand against GEMMs
    mexposed, mhidden = tp_comm_s(M8, replace(lay, tp_plan="megatron"), TETON, 1, 0.8)
    assert mexposed + mhidden == pytest.approx(8 * one) and mexposed < exposed - 2 * one


def test_pytorchs_fused_reduce_scatter_sums_its_partials_after_the_exchange():
    """_fused_matmul_reduce_scatter_impl sums the t stacked partials of the whole output in
    one kernel after the last piece arrives: the forward's two of them read b s h and write
    b s h / t each, exposed; Megatron's userbuffers pay none, nor does a layout without
    async TP."""
    lay = Layout(t=8, d=8, b=12, m=1, recompute="none", sequence_parallel=True, zero_stage=3,
                 tp_plan="pytorch", async_tp=True)
    partials = 2 * 12 * M8.s * M8.h
    hbm = TETON.gpu.hbm_bytes_per_s * gemm.HBM_EFFICIENCY
    assert async_tp_reduce_s(M8, lay, TETON) == pytest.approx(2 * partials * (1 + 1 / 8) / hbm)
    assert async_tp_reduce_s(M8, replace(lay, recompute="full"), TETON) == pytest.approx(
        2 * async_tp_reduce_s(M8, lay, TETON))
    for other in (replace(lay, tp_plan="megatron"), replace(lay, async_tp=False)):
        assert async_tp_reduce_s(M8, other, TETON) == 0.0


def test_fp8_speeds_only_the_linear_gemms_and_pays_tensorwise_casts():
    lay = Layout(d=8, b=1, m=1, recompute="none")
    bf16, fp8 = (estimate(M8, replace(lay, precision=p, fp8_scaling="tensorwise"), TETON)
                 for p in ("bf16", "fp8"))
    linear = {p: gemm.layer_gemm_time_s(M8, 1, TETON.gpu, precision=p, kinds=("linear",))
              for p in ("bf16", "fp8")}
    # attention and the output head stay BF16: the whole difference is the linear GEMMs'
    assert bf16.time["compute"] - fp8.time["compute"] == pytest.approx(
        M8.L * 3 * (linear["bf16"] - linear["fp8"]))
    # torchao's tensorwise casts: 6 bytes per element of input (m x k), weight (k x n) and
    # output gradient (m x n) of wq/wk/wv, wo, w1/w3, w2, by hand for b = 1, s = 8192
    mk, kn, mn = 8192 * (3 * 4096 + 14336), 4096 * (6144 + 4096 + 28672 + 14336), \
        8192 * (6144 + 4096 + 28672 + 4096)
    cast = gemm.fp8_quantization_bytes(M8, 1, scaling="tensorwise")
    assert cast == 6 * (mk + kn + mn)
    assert gemm.fp8_quantization_bytes(M8, 1, scaling="tensorwise", recompute=True) == \
        cast + 3 * (mk + kn)
    hbm = TETON.gpu.hbm_bytes_per_s * gemm.HBM_EFFICIENCY
    assert fp8.time["elementwise"] - bf16.time["elementwise"] == pytest.approx(
        M8.L * cast / hbm)
    with pytest.raises(ValueError, match="fp8_scaling"):
        Layout(fp8_scaling="rowwise")


def test_gains_toggle_one_technique_at_a_time():
    lay = Layout(t=8, d=32, b=16, m=1, zero_stage=3, recompute="full", sequence_parallel=True)
    g = overlap_and_precision_gains(MODELS["llama3-70B"], lay, CLUSTERS["dgx-h100"])
    rows = g.by_name()
    assert set(rows) == {"FP8 tensorwise", "async TP", "FSDP prefetch"}
    assert all(r.ratio > 1 for r in rows.values()) and "DualPipe" in g.skipped
    assert rows["async TP"].without == pytest.approx(rows["FP8 tensorwise"].without)
    assert "async TP" in g.table()


def test_hiding_a_transfer_slows_the_compute_beside_it():
    # 18.9 % slower compute while a transfer runs (Lee et al. 2025): H hidden seconds cost
    # H x 0.189 / 1.189, and nothing is charged where nothing is hidden
    assert CONTENTION == 0.189
    assert contention_s(1.189) == pytest.approx(0.189)
    plain = estimate(M8, Layout(d=8, b=2, m=1, zero_stage=3, recompute="op"), TETON)
    assert "contention" not in plain.time
    fsdp = estimate(M8, Layout(d=8, b=2, m=1, zero_stage=3, recompute="op",
                               overlap_comm=True), TETON)
    hidden = plain.time["dp_comm"] - fsdp.time["dp_comm"]
    assert hidden > 0 and fsdp.time["contention"] == pytest.approx(contention_s(hidden))
    # SMs set aside for communication (DeepSeek-V3's 20 of 132) already price it
    ds = MODELS["deepseek-v3"]
    kw = dict(p=16, d=128, e=64, b=1, global_batch=15360, schedule="dualpipe", zero_stage=1)
    h800 = CLUSTERS["hgx-h800"]
    assert "contention" in estimate(ds, Layout(**kw), h800).time
    assert "contention" not in estimate(ds, Layout(comm_sm_share=20 / 132, **kw), h800).time


def test_fsdp_under_a_pipeline_gathers_the_weights_once_a_step():
    """torchtitan's apply_fsdp keeps a stage's weights gathered across its micro-batches
    under PP (as memory.memory_per_gpu holds them): one gather a step, not one per
    micro-batch, forward and backward."""
    from lessonlib.costmodel.axes import dp_time_s
    m70, h100 = MODELS["llama3-70B"], CLUSTERS["dgx-h100"]
    lay = Layout(t=8, p=4, d=4, b=1, m=8, global_batch=32, zero_stage=3, recompute="none")
    once = dp_time_s(m70, lay, h100, 1.0, 0.8, 0.0)[0]
    flat = dp_time_s(m70, replace(lay, m=1, global_batch=4), h100, 1.0, 0.8, 0.0)[0]
    assert once < flat     # m = 1 gathers before the forward and again before the backward


def test_ddp_buckets_hide_under_the_last_micro_batchs_backward_but_the_last_unit():
    h100, m8 = CLUSTERS["dgx-h100"], MODELS["llama3-8B"]
    lay = Layout(d=64, b=1, m=4, global_batch=256, zero_stage=1, recompute="none")
    plain, overlapped = (estimate(m8, replace(lay, overlap_comm=o), h100) for o in (False, True))
    exposed = overlapped.time["dp_comm"]
    # the last layer's share stays exposed; the rest runs under the backward, and slows it
    contention = overlapped.time["contention"]
    hidden = contention * (1 + CONTENTION) / CONTENTION
    assert (exposed + hidden) / m8.L == pytest.approx(exposed)
    # in buckets, each paying its latency, the exchange takes longer than in one piece
    assert exposed + hidden > plain.time["dp_comm"]
    assert overlapped.step_time_s < plain.step_time_s


def test_interleaved_chunks_exchange_under_the_chunks_after_them():
    """Megatron-Core starts a chunk's gradient buckets at its last micro-batch's backward,
    and the interleaved backward runs the chunks last to first, p micro-batches each: on
    the first stage chunk j's exchange has j*p chunk backwards after its own to run under,
    where v = 1 keeps the last micro-batch's backward alone."""
    from lessonlib.costmodel.axes import dp_time_s
    m70, h100 = MODELS["llama3-70B"], CLUSTERS["dgx-h100"]
    lay = Layout(t=8, p=4, d=32, b=1, m=8, global_batch=256, zero_stage=1, recompute="none",
                 sequence_parallel=True, overlap_comm=True)
    plain = dp_time_s(m70, lay, h100, 0.4, 0.8, 0.0)         # a step's compute: 0.4 s
    chunked = dp_time_s(m70, replace(lay, v=2), h100, 0.4, 0.8, 0.0)
    assert sum(plain) == pytest.approx(sum(chunked))          # the same bytes in all
    assert chunked[0] < plain[0]                               # more of them hidden
    # v = 1: the gradients under one micro-batch's backward, the gathers under its forward:
    # 0.05 s in all here, what the exchange has to hide it behind
    assert plain[1] == pytest.approx(0.4 / 8)


def test_overlapped_sends_leave_only_the_warm_up_and_flush_exposed():
    """Megatron-Core's overlap_p2p_comm: the interleaved schedule's sends run under other
    chunks' compute but in the first stage's warm-up and flush, (p-1)*2 + (v-1)*p chunks of
    the m*v (get_pp_rank_microbatches); what it hides slows the compute beside it."""
    assert p2p_exposed_share(4, 64, 5) == pytest.approx((3 * 2 + 4 * 4) / 320)
    assert p2p_exposed_share(8, 4, 2) == 1.0                  # all warm-up: nothing to hide
    h100 = CLUSTERS["dgx-h100"]
    m70 = MODELS["llama3-70B"]
    lay = Layout(t=4, p=4, d=4, v=5, b=1, global_batch=256, sequence_parallel=True,
                 recompute="none")
    off, on = (estimate(m70, replace(lay, overlap_p2p=x), h100) for x in (False, True))
    share = p2p_exposed_share(4, lay.m, 5)
    assert on.time["pp_comm"] == pytest.approx(off.time["pp_comm"] * share)
    hidden = off.time["pp_comm"] - on.time["pp_comm"]
    assert on.time.get("contention", 0.0) == pytest.approx(contention_s(hidden))
    assert "overlapped sends" in on.layout.describe()
    for bad in (dict(v=1), dict(schedule="zbv")):
        with pytest.raises(ValueError, match="overlap_p2p=True .* needs v > 1"):
            replace(lay, overlap_p2p=True, **bad)


def test_the_exchange_runs_beside_the_whole_backward_not_only_its_gemms():
    """The gradients' buckets run on their own stream (Megatron-Core's async_op, FSDP's
    streams), beside every kernel of the last micro-batch's backward: a step whose exposed
    TP collectives make its backward longer hides more of its DP exchange."""
    from lessonlib.costmodel.axes import dp_time_s
    m70, h100 = MODELS["llama3-70B"], CLUSTERS["dgx-h100"]
    lay = Layout(t=8, d=32, b=1, m=4, global_batch=128, zero_stage=1, recompute="none",
                 sequence_parallel=True, overlap_comm=True)
    gemms = dp_time_s(m70, lay, h100, 0.4, 0.8, 0.0)
    busier = dp_time_s(m70, lay, h100, 0.6, 0.8, 0.0)      # 0.2 s of exposed TP beside
    assert sum(gemms) == pytest.approx(sum(busier))          # the same bytes in all
    assert busier[1] > gemms[1] and busier[0] < gemms[0]
    est = estimate(m70, lay, h100)
    per_step = sum(est.time[k] for k in ("compute", "elementwise", "tp_comm", "pp_comm"))
    assert est.time["dp_comm"] == pytest.approx(
        dp_time_s(m70, lay, h100, per_step, 0.8, 0.0)[0])
