"""The activation formulas of ``costmodel.layer_bytes`` against the meter on real layers, to the byte.

Each family of ``models.measured`` (GPT with LayerNorm, GeLU and dropout, unfused and flash;
Llama with RMSNorm, GQA, RoPE and SwiGLU, fused and not; Nemotron-4's squared ReLU;
DeepSeek-V3's MLA + MoE) at three (s, b, h, a, t), in bf16: what autograd keeps for backward
equals the formula exactly. Plus: the fused kernels' backward equals the unfused reference."""
import pytest
import torch
import torch.nn.functional as F

from lessonlib.costmodel import layer_bytes as lb
from lessonlib.instruments.activations import ActivationMeter
from lessonlib.models import measured as ms

SIZES = [(16, 1, 32, 4, 1), (32, 2, 64, 8, 2), (24, 3, 48, 4, 4)]    # s, b, h, a, t


def saved(layer, b, s, h):
    layer = layer.to(torch.bfloat16)
    meter = ActivationMeter([*layer.parameters(), *layer.buffers()])
    with meter.forward():
        layer(torch.randn(b, s, h, dtype=torch.bfloat16, requires_grad=True))
    return meter.bytes


@pytest.mark.parametrize("s,b,h,a,t", SIZES)
@pytest.mark.parametrize("attention", ["unfused", "flash"])
def test_gpt_layer(s, b, h, a, t, attention):
    torch.manual_seed(0)
    assert saved(ms.GPTLayer(h, a, s, t, attention), b, s, h) == \
        lb.gpt_layer_bytes(s, b, h, a, t, attention=attention)


@pytest.mark.parametrize("s,b,h,a,t", SIZES)
@pytest.mark.parametrize("mlp,fused", [("swiglu", True), ("swiglu", False), ("relu2", False)])
def test_llama_and_nemotron_layers(s, b, h, a, t, mlp, fused):
    kv, ffn = a // 2, 3 * h
    layer = ms.LlamaLayer(h, a, kv, ffn, s, t, mlp, fused)
    assert saved(layer, b, s, h) == lb.llama_layer_bytes(s, b, h, a, kv, ffn, t, mlp=mlp,
                                                         fused=fused)


@pytest.mark.parametrize("s,b,h,a", [(16, 1, 32, 4), (32, 2, 64, 8), (24, 3, 48, 4)])
def test_deepseek_mla_moe_layer(s, b, h, a):
    torch.manual_seed(0)
    ql, kvl, nope, rope, v, experts, k, ffn = h // 2, h // 4, 16, 8, 16, 8, 2, h // 2
    layer = ms.MLAMoELayer(h, a, s, ql, kvl, nope, rope, v, experts, k, ffn)
    assert saved(layer, b, s, h) == (lb.mla_bytes(s, b, h, a, ql, kvl, nope + rope, v, rope)
                                     + lb.moe_bytes(s, b, h, experts, k, ffn, 1))


def test_gpt_unfused_is_korthikanti_table2_plus_norm_statistics():
    s, b, h, a, t = 2048, 1, 12288, 96, 8
    sbh = s * b * h
    assert lb.gpt_layer_bytes(s, b, h, a) == sbh * (34 + 5 * a * s / h) + 16 * s * b
    assert lb.gpt_layer_bytes(s, b, h, a, t) == pytest.approx(
        sbh * (10 + 24 / t + 5 * a * s / (h * t)) + 16 * s * b)


def test_fused_kernels_backward_equals_the_reference():
    torch.manual_seed(0)
    x = torch.randn(2, 8, 16, dtype=torch.float64, requires_grad=True)
    for rms in (True, False):
        norm = ms.FusedNorm(16, rms).double()
        ref = (F.rms_norm(x, (16,), norm.weight, 1e-5) if rms
               else F.layer_norm(x, (16,), norm.weight, norm.bias, 1e-5))
        g = torch.randn_like(ref)
        expected = torch.autograd.grad(ref, (x, norm.weight), g)
        got = torch.autograd.grad(norm(x), (x, norm.weight), g)
        for e, o in zip(expected, got):
            torch.testing.assert_close(o, e)
    q = torch.randn(2, 4, 8, 6, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 2, 8, 6, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 2, 8, 6, dtype=torch.float64, requires_grad=True)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    g = torch.randn_like(ref)
    expected = torch.autograd.grad(ref, (q, k, v), g)
    out = ms.flash_attention(q, k, v)
    torch.testing.assert_close(out, ref)
    for e, o in zip(expected, torch.autograd.grad(out, (q, k, v), g)):
        torch.testing.assert_close(o, e)
    gate, up = (torch.randn(4, 8, dtype=torch.float64, requires_grad=True) for _ in range(2))
    for act in (F.silu, ms.relu2):
        ref = act(gate) * up
        got = ms._FusedAct.apply(gate, up, act)
        g = torch.randn_like(ref)
        for e, o in zip(torch.autograd.grad(ref, (gate, up), g),
                        torch.autograd.grad(got, (gate, up), g)):
            torch.testing.assert_close(o, e)
