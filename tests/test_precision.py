"""FP8 training: each recipe's layer within its derived error bound of float32, fine scales
beating one scale when outliers exceed e4m3's range, the tiny GPT trained within a band of
BF16's loss, equal to torchao's Float8Linear where torchao runs on the CPU, and FSDP's FP8
all-gather moving half of BF16's bytes for those weights, its step equal to one process.

The error bound, per element of an operand cast with scale s to a format with m mantissa
bits: |x^ - x| <= 2^-(m+1) |x| (half an ulp of a normal number: 2^-4 for e4m3, 2^-3 for
e5m2) + half the subnormal spacing over s (2^-10 / s for e4m3, 2^-17 / s for e5m2); so for a
product, elementwise, |A^B^ - AB| <= |dA||B| + |A||dB| + |dA||dB| (+ float32's accumulation)."""
import copy

import pytest
import torch
from torch import nn

import lessonlib
from lessonlib.models import TinyGPT, moe_gpt, TINY
from lessonlib.precision import (E4M3, E5M2, RECIPES, Float8Linear, convert_to_float8,
                                 float8_layers, gemm_errors, loss_curves, quantize,
                                 quantize_operand, recipe, relative_step, scaled_mm)
from lessonlib.precision import fp8_runs, fsdp_float8, torchao_ref
from lessonlib.precision.fp8 import operand_block

HALF_SUBNORMAL = {E4M3: 2.0 ** -10, E5M2: 2.0 ** -17}
BLOCK = 16


def _bound(x, dtype, r, side, weight=False):
    """The derived bound on |x^ - x|, elementwise, for operand ``x`` cast as the recipe says."""
    q = quantize_operand(x, r, dtype, side, weight)
    br, bc = q.block
    scale = q.scale.repeat_interleave(br, 0).repeat_interleave(bc, 1)
    return relative_step(dtype) * x.abs() + HALF_SUBNORMAL[dtype] / scale


def _product_bound(a, b, da, db):
    return (da @ b.abs() + a.abs() @ db + da @ db) * (1 + 1e-5) + 1e-6 * (a.abs() @ b.abs())


@pytest.fixture(scope="module")
def tensors():
    gen = torch.Generator().manual_seed(0)
    rows = torch.logspace(-2, 1, 32).unsqueeze(1)              # rows of very different sizes
    x = torch.randn(32, 32, generator=gen) * rows                                # (T, K)
    w = torch.randn(48, 32, generator=gen) * 0.1                                 # (N, K)
    g = torch.randn(32, 48, generator=gen) * 1e-3                                # (T, N)
    return x, w, g


@pytest.mark.parametrize("name", list(RECIPES))
def test_each_recipe_is_within_its_derived_error_bound(tensors, name):
    x, w, g = tensors
    r = recipe(name, BLOCK)
    layer = Float8Linear.from_linear(nn.Linear(32, 48, bias=False), r)
    with torch.no_grad():
        layer.weight.copy_(w)
    xx = x.clone().requires_grad_()
    y = layer(xx)
    y.backward(g)
    wt = w.t()
    checks = {  # (got, exact, bound) for the three GEMMs
        "y": (y, x @ wt, _product_bound(x, wt, _bound(x, r.forward, r, "a"),
                                        _bound(wt, r.forward, r, "b", True))),
        "grad_x": (xx.grad, g @ w, _product_bound(g, w, _bound(g, r.gradient, r, "a"),
                                                  _bound(w, r.forward, r, "b", True))),
        "grad_w": (layer.weight.grad, g.t() @ x,
                   _product_bound(g.t(), x, _bound(g.t(), r.gradient, r, "a"),
                                  _bound(x, r.forward, r, "b")))}
    for what, (got, exact, bound) in checks.items():
        assert ((got - exact).abs() <= bound).all(), (name, what)
        assert (got - exact).abs().max() > 0, (name, what)        # it did round
    assert r.gradient == (E5M2 if name == "tensorwise" else E4M3)


def test_the_blockwise_gemm_promotes_each_k_block_exactly():
    """Per-K-block FP8 products summed in float32 == the dequantized blocks' product."""
    gen = torch.Generator().manual_seed(1)
    a, b = torch.randn(16, 64, generator=gen), torch.randn(64, 32, generator=gen)
    r = recipe("blockwise", BLOCK)
    a8, b8 = quantize_operand(a, r, E4M3, "a"), quantize_operand(b, r, E4M3, "b", weight=True)
    assert a8.scale.shape == (16, 4) and b8.scale.shape == (4, 2)
    exact = a8.dequantize(torch.float64) @ b8.dequantize(torch.float64)
    torch.testing.assert_close(scaled_mm(a8, b8).double(), exact, rtol=1e-5, atol=1e-5)
    assert operand_block(recipe("blockwise"), (256, 256), "a") == (1, 128)   # DeepSeek-V3's
    assert operand_block(recipe("blockwise"), (256, 256), "b", weight=True) == (128, 128)


def test_fine_scales_beat_one_scale_once_outliers_pass_e4m3s_range():
    errors = {(e.recipe, e.factor): e.relative_error for e in gemm_errors((1, 100, 100_000))}
    for factor in (1, 100):          # within e4m3's range: every recipe ~4 % (3 mantissa bits)
        assert all(0.02 < errors[r, factor] < 0.05 for r in RECIPES)
    assert errors["blockwise", 100_000] < errors["rowwise", 100_000] \
        < errors["tensorwise", 100_000]
    assert errors["tensorwise", 100_000] > 5 * errors["tensorwise", 1]


def test_convert_keeps_the_head_router_norms_and_embeddings():
    model = convert_to_float8(TinyGPT(TINY), "tensorwise")
    assert float8_layers(model) == [f"blocks.{i}.{n}" for i in range(2)
                                    for n in ("attn.q", "attn.k", "attn.v", "attn.proj",
                                              "mlp.fc1", "mlp.fc2")]
    assert type(model.head.out) is nn.Linear
    moe = convert_to_float8(moe_gpt(), "rowwise")
    assert type(moe.blocks[0].mlp.router) is nn.Linear
    assert isinstance(moe.blocks[0].mlp.experts[0][0], Float8Linear)


def test_fp8_trains_within_the_band_of_bf16():
    curves = loss_curves(steps=25)
    assert all(curves.losses[n][-1] < curves.losses[n][0] - 0.3 for n in curves.losses)
    assert curves.band < fp8_runs.LOSS_BAND, curves.gap


@pytest.mark.parametrize("name", ["tensorwise", "rowwise"])
def test_equal_to_torchao_where_it_runs_on_the_cpu(name):
    diff = torchao_ref.compare(name)
    assert diff.casts_equal and diff.output_within_bf16
    if name == "tensorwise":
        assert diff.grad_input_max_abs == diff.grad_weight_max_abs == 0
        assert diff.output_max_abs < 1e-6
    else:
        assert diff.bf16_rounding_equal and diff.grad_weight_max_abs > 0


def test_fsdp_gathers_float8_weights_in_half_the_bytes_and_steps_as_one_process():
    ranks = lessonlib.launch(fsdp_float8.gather_bytes, 2, timeout=120)
    for out in ranks:
        n = out.fp8_shard_elements
        assert out.fp8_gathers["torch.uint8"] == n                    # 1 byte each
        assert out.bf16_gathers["torch.bfloat16"] == \
            2 * n + out.fp8_gathers["torch.bfloat16"]                 # 2 bytes each
        assert out.fp8_amax_all_reduces == 2 and out.bf16_amax_all_reduces == 0
        assert out.max_weight_step > 1e-3
        assert out.max_weight_diff_vs_one_process < 1e-6


def test_bad_input_is_refused_with_one_clear_line():
    with pytest.raises(ValueError, match="unknown FP8 recipe 'delayed': use one of "
                                         "tensorwise, rowwise, blockwise"):
        recipe("delayed")
    with pytest.raises(ValueError, match=r"FP8 block 1x24 does not divide the tensor's shape "
                                         r"\(4, 32\)"):
        quantize(torch.ones(4, 32), E4M3, (1, 24))
    with pytest.raises(ValueError, match="tensorwise Float8Linear weights"):
        fsdp_float8.Float8AllGatherFSDP(convert_to_float8(TinyGPT(TINY), "rowwise"))
    with pytest.raises(ValueError, match="torchao runs 'blockwise' on the GPU only"):
        torchao_ref.compare("blockwise")
    model = copy.deepcopy(TinyGPT(TINY))
    layer = convert_to_float8(model, "blockwise", 24).blocks[0].mlp.fc1
    with pytest.raises(ValueError, match="does not divide"):
        layer(torch.ones(2, 16, 32))
