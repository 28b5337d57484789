"""The fused attention kernel's rate (FlashAttention-2 on H100, Shah et al. 2024, Fig. 5 and
6) and what context parallelism adds around it (PyTorch's ``context_parallel`` code)."""
from dataclasses import replace

import pytest

from lessonlib.costmodel import CLUSTERS, GPUS, MODELS, Layout, estimate
from lessonlib.costmodel.compute import attention_core_forward_flops
from lessonlib.costmodel.context import merge_bytes_per_layer
from lessonlib.costmodel.gemm import (ATTENTION_H100_TFLOPS, FA2_H100_TFLOPS, attention_flops,
                                      fused_attention_s)

H100 = GPUS["H100-SXM5"]


def test_the_rate_is_the_papers_figure_at_every_measured_point():
    lengths = (512, 1024, 2048, 4096, 8192, 16384)
    for (direction, causal, dim), figures in FA2_H100_TFLOPS.items():
        if direction == "backward" and causal:
            continue
        for n, tflops in zip(lengths, figures):
            got = attention_flops(H100, n, dim, causal, direction) / 1e12
            assert got == pytest.approx(tflops * H100.clock_share)   # the sustained clock
    # between and beyond: monotone in length, the mask and the backward slower
    rates = [attention_flops(H100, n, 128) for n in (256, 700, 3000, 16384, 131072)]
    assert rates == sorted(rates) and rates[-1] == rates[-2]
    assert attention_flops(H100, 4096, 128, True) < attention_flops(H100, 4096, 128, False)
    assert attention_flops(H100, 4096, 128, True, "backward") < \
        attention_flops(H100, 4096, 128, False, "backward")
    with pytest.raises(ValueError, match="direction"):
        attention_flops(H100, 4096, 128, direction="sideways")


def test_each_kernel_runs_at_its_own_bars_of_the_same_figures():
    lengths = (512, 1024, 2048, 4096, 8192, 16384)
    for kernel, table in ATTENTION_H100_TFLOPS.items():
        for (direction, causal, dim), figures in table.items():
            for n, tflops in zip(lengths, figures):
                got = attention_flops(H100, n, dim, causal, direction, kernel) / 1e12
                assert got == pytest.approx(tflops * H100.clock_share)
    # cuDNN (Transformer Engine's on Hopper) beats FlashAttention-2 at every measured point
    for key, figures in ATTENTION_H100_TFLOPS["cudnn"].items():
        if key in FA2_H100_TFLOPS:
            assert all(x > y for x, y in zip(figures, FA2_H100_TFLOPS[key]))
    with pytest.raises(ValueError, match="kernel='fa9' must be one of fa2, cudnn, fa3"):
        attention_flops(H100, 4096, 128, kernel="fa9")
    with pytest.raises(ValueError, match="attention_kernel='xformers' must be one of"):
        Layout(m=1, attention_kernel="xformers")
    # a layer's attention takes less time under cuDNN, and the step with it
    m8 = MODELS["llama3-8B"]
    fa2, cudnn = (fused_attention_s(m8, 1, H100, kernel=k) for k in ("fa2", "cudnn"))
    assert cudnn[0] < fa2[0] and cudnn[1] < fa2[1]
    lay = Layout(d=8, m=4, recompute="none")
    slow, fast = (estimate(m8, replace(lay, attention_kernel=k), CLUSTERS["dgx-h100"])
                  for k in ("fa2", "cudnn"))
    assert fast.step_time_s < slow.step_time_s
    assert "cudnn attention" in fast.layout.describe()


def test_context_parallel_calls_do_a_cth_of_the_work_on_their_own_shapes():
    m8 = replace(MODELS["llama3-8B"], s=32768)
    flops = attention_core_forward_flops(m8, 1)
    one, _ = fused_attention_s(m8, 1, H100)
    assert one == pytest.approx(flops / attention_flops(H100, 32768, 128))
    four, four_back = fused_attention_s(m8, 1, H100, c=4)
    # four calls of 8K tokens, three of them unmasked on half blocks: a quarter of the work,
    # at the rates of those shorter calls
    assert flops / 4 / attention_flops(H100, 4096, 128, False) < four < \
        flops / 4 / attention_flops(H100, 8192, 128, True)
    assert four_back > 2.5 * four


def test_only_the_ring_pays_its_float32_merges():
    m8 = replace(MODELS["llama3-8B"], s=65536)
    assert merge_bytes_per_layer(m8, 1, 1) == (0.0, 0.0)
    forward, backward = merge_bytes_per_layer(m8, 1, 4)
    assert forward > 38 * 3 * 16384 * 4096 and backward > forward / 2
    lay = Layout(c=4, d=2, b=1, m=1, zero_stage=3, recompute="full", overlap_comm=True)
    teton = CLUSTERS["grand-teton-h100-96gb"]
    ring, gather = (estimate(m8, replace(lay, cp_comm=k), teton) for k in ("ring", "allgather"))
    assert ring.time["elementwise"] > gather.time["elementwise"]
    assert ring.time["compute"] == gather.time["compute"]


def test_torchtitans_cp_gathers_every_heads_kv_and_merges_its_calls():
    """PyTorch's context_parallel under torchtitan's model: K and V repeated to every query
    head before SDPA, the all-gather waited for after the first call, c calls merged."""
    m405, teton = replace(MODELS["llama3-405B"], s=131072), CLUSTERS["grand-teton-h100-96gb"]
    lay = Layout(t=8, p=8, c=4, d=2, b=1, m=8, zero_stage=3, recompute="full",
                 sequence_parallel=True, overlap_comm=True)
    meta, titan = (estimate(m405, replace(lay, cp_comm=k), teton)
                   for k in ("allgather", "torchtitan"))
    assert titan.time["cp_comm"] > meta.time["cp_comm"] > 0
    assert titan.time["elementwise"] > meta.time["elementwise"]
    assert titan.memory.total > meta.memory.total            # 128 heads' K/V, not 8
    assert titan.time["compute"] == meta.time["compute"]


def test_ulysses_runs_one_call_over_the_whole_sequence_on_its_heads():
    m8 = replace(MODELS["llama3-8B"], s=65536)
    ring = fused_attention_s(m8, 1, H100, c=8)
    ulysses = fused_attention_s(m8, 1, H100, c=8, ulysses=True)
    flops = attention_core_forward_flops(m8, 1) / 8       # a/c = 4 heads, all s tokens
    assert ulysses[0] == pytest.approx(flops / attention_flops(H100, 65536, 128))
    # the same scores: the ring's seven unmasked calls of 4K run faster than one masked call
    assert ring[0] < ulysses[0] < 1.1 * ring[0]
