"""The layers whose activations the cost model counts: one of each family a lesson prices.

What it teaches: "activation memory" is not a constant of a paper but what autograd keeps
for one layer's backward, and that depends on the layer. Four families, one tensor rank's
share of each (``t``: the heads and the MLP's width split over t ranks, as Megatron's column
and row layers split them; norms and residuals whole), in bf16:

* ``GPTLayer`` (GPT-2/3 as Megatron-LM ran it): LayerNorm, fused QKV with biases, GeLU MLP of
  ``ffn``, dropout after attention and MLP; attention ``"unfused"`` (the s x s scores, their
  softmax and its dropout kept: Korthikanti et al. 2022's layer) or ``"flash"``;
* ``LlamaLayer`` (Llama 3): RMSNorm, grouped-query attention with rotary positions, a SwiGLU
  MLP, no biases, no dropout; ``mlp="relu2"`` gives Nemotron-4's two-matrix squared-ReLU MLP;
* ``MLAMoELayer`` (DeepSeek-V3): multi-head latent attention (§2.1.1: a query latent, a
  key/value latent with a shared rotary key, their RMSNorms and up-projections) and a dropless
  mixture of experts (sigmoid gates over the top k, normalised, plus shared experts).

The kernels assumed fused, each saving what its GPU kernel saves: ``fused_norm`` (the input
and float32 statistics, as Apex's and Transformer Engine's norms), ``dropout`` (a one-byte
mask, as CUDA's ``native_dropout``), attention (q, k, v, the output and a float32
log-sum-exp per head and query, as FlashAttention-2 and PyTorch's SDPA flash backend; the
scores are recomputed in backward), and with ``fused_mlp`` the activation function (its
inputs kept, its output recomputed: Megatron's fused SwiGLU, and what torch.compile's
partitioner does). ``costmodel/layer_bytes.py`` holds the formulas these layers are measured
against, to the byte, in ``tests/test_measured_layers.py``. Measured on CPU, where SDPA's
flash kernel takes grouped-query K and V as they are; a GPU backend that repeats them to every
query head keeps them a/kv times larger.

One job: the real layers of the families the cost model prices; its length is three families'
forwards, each written out as its GPU kernels run it.

Laptop:  ``python -m lessonlib.models.measured`` measures one layer of each family.
GPU box: the same; the layers have no device logic of their own.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def _acc(x):
    """``x`` in the precision a kernel accumulates in: float32 for 16-bit inputs."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


class _FusedNorm(torch.autograd.Function):
    """LayerNorm (``rms`` False) or RMSNorm over the last dim, computed in float32, keeping
    the input and float32 mean and 1/std (RMSNorm: 1/rms) for backward."""

    @staticmethod
    def forward(ctx, x, weight, bias, rms, eps):
        xf = _acc(x)
        mean = None if rms else xf.mean(-1, keepdim=True)                # (..., 1)
        centred = xf if rms else xf - mean
        rstd = torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + eps)  # (..., 1)
        y = centred * rstd * weight.to(xf.dtype)
        if bias is not None:
            y = y + bias.to(xf.dtype)
        ctx.rms, ctx.has_bias = rms, bias is not None
        ctx.save_for_backward(x, weight, rstd, *([] if rms else [mean]))
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        x, weight, rstd, *mean = ctx.saved_tensors
        xf, g = x.to(rstd.dtype), grad.to(rstd.dtype)
        x_hat = (xf if ctx.rms else xf - mean[0]) * rstd
        gw = g * weight.to(rstd.dtype)
        dx = gw - x_hat * (gw * x_hat).mean(-1, keepdim=True)
        if not ctx.rms:
            dx = dx - gw.mean(-1, keepdim=True)
        rows = tuple(range(g.dim() - 1))
        dweight = (g * x_hat).sum(rows).to(weight.dtype)
        dbias = g.sum(rows).to(weight.dtype) if ctx.has_bias else None
        return (dx * rstd).to(x.dtype), dweight, dbias, None, None


class FusedNorm(nn.Module):
    """LayerNorm or RMSNorm (``rms``) as one fused kernel: see ``_FusedNorm``."""

    def __init__(self, width: int, rms: bool, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.bias = None if rms else nn.Parameter(torch.zeros(width))
        self.rms, self.eps = rms, eps

    def forward(self, x):
        return _FusedNorm.apply(x, self.weight, self.bias, self.rms, self.eps)


def dropout(x, p: float, training: bool = True):
    """Inverted dropout keeping a one-byte mask (CUDA's ``native_dropout`` does; CPU's
    ``F.dropout`` keeps the mask in the input's dtype)."""
    if not training or p == 0:
        return x
    mask = torch.rand(x.shape, device=x.device) >= p
    return x * mask / (1 - p)


class _Flash(torch.autograd.Function):
    """Causal attention as FlashAttention-2 computes it: keeps q, k, v, the output and a
    float32 log-sum-exp per head and query; backward rebuilds the probabilities from them
    (Dao 2023, Alg. 2). Value heads may be narrower than query/key heads (MLA's 128 vs 192)
    and K, V may have fewer heads (grouped-query attention)."""

    @staticmethod
    def _scores(q, k, scale):
        s = q.shape[-2]
        causal = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
        return (_acc(q) @ _acc(k).transpose(-1, -2) * scale).masked_fill(causal, -math.inf)

    @staticmethod
    def forward(ctx, q, k, v):                      # (b, a, s, dq), (b, kv, s, dq), (b, kv, s, dv)
        group = q.shape[1] // k.shape[1]
        kk, vv = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        scale = q.shape[-1] ** -0.5
        scores = _Flash._scores(q, kk, scale)                          # (b, a, s, s)
        lse = scores.logsumexp(-1)                                      # (b, a, s) float32
        out = ((scores - lse[..., None]).exp() @ _acc(vv)).to(q.dtype)  # (b, a, s, dv)
        out = out.transpose(1, 2).contiguous().transpose(1, 2)   # laid out (b, s, a, dv), as FA2
        ctx.scale, ctx.group = scale, group
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, out, lse = ctx.saved_tensors
        kk, vv = k.repeat_interleave(ctx.group, 1), v.repeat_interleave(ctx.group, 1)
        prob = (_Flash._scores(q, kk, ctx.scale) - lse[..., None]).exp()
        g = _acc(grad)
        dv = prob.transpose(-1, -2) @ g
        dp = g @ _acc(vv).transpose(-1, -2)
        ds = prob * (dp - (g * _acc(out)).sum(-1, keepdim=True)) * ctx.scale
        dq, dk = ds @ _acc(kk), ds.transpose(-1, -2) @ _acc(q)

        def fold(x):            # the query heads that shared a K/V head add their gradients
            b, a, s, d = x.shape
            return x.view(b, a // ctx.group, ctx.group, s, d).sum(2)
        return dq.to(q.dtype), fold(dk).to(k.dtype), fold(dv).to(v.dtype)


def flash_attention(q, k, v):
    """Causal attention keeping what FlashAttention-2 keeps: see ``_Flash``."""
    return _Flash.apply(q, k, v)


def rope_tables(seq: int, dim: int, base: float = 10000.0):
    """cos and sin of rotary positions (Su et al. 2021), (s, dim) each."""
    inv = base ** -(torch.arange(0, dim, 2).float() / dim)
    angles = torch.outer(torch.arange(seq).float(), inv)                # (s, dim/2)
    angles = torch.cat([angles, angles], -1)                            # (s, dim)
    return angles.cos(), angles.sin()


def rope(x, cos, sin):
    """Rotate ``x`` (..., s, dim) by position: multiplies by constants, so keeps nothing."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


class _FusedAct(torch.autograd.Function):
    """``act(gate) * up`` (SwiGLU) or ``act(gate)`` (up None) as one kernel: keeps its inputs,
    recomputes the activation in backward (Megatron's fused bias-SwiGLU)."""

    @staticmethod
    def forward(ctx, gate, up, act):
        ctx.act = act
        ctx.save_for_backward(gate, *([] if up is None else [up]))
        y = act(gate)
        return y if up is None else y * up

    @staticmethod
    def backward(ctx, grad):
        gate, *up = ctx.saved_tensors
        with torch.enable_grad():
            g = gate.detach().requires_grad_()
            y = ctx.act(g)
            dgate, = torch.autograd.grad(y, g, grad * up[0] if up else grad)
        return dgate, (grad * y.detach() if up else None), None


def relu2(x):
    """Squared ReLU (Nemotron-4; So et al. 2021's Primer)."""
    return F.relu(x).square()


class MLP(nn.Module):
    """One rank's share of a feed-forward layer: ``"gelu"`` (h -> ffn -> h, biases),
    ``"swiglu"`` (w2(silu(w1 x) * w3 x)) or ``"relu2"`` (w2(relu(w1 x)^2)); ``fused``: the
    activation as one kernel (``_FusedAct``)."""

    def __init__(self, hidden: int, ffn: int, kind: str, fused: bool = False):
        super().__init__()
        bias = kind == "gelu"
        self.w1 = nn.Linear(hidden, ffn, bias=bias)
        self.w3 = nn.Linear(hidden, ffn, bias=False) if kind == "swiglu" else None
        self.w2 = nn.Linear(ffn, hidden, bias=bias)
        self.act = {"gelu": F.gelu, "swiglu": F.silu, "relu2": relu2}[kind]
        self.fused = fused

    def forward(self, x):
        gate = self.w1(x)                                               # (b, s, ffn)
        up = self.w3(x) if self.w3 is not None else None
        if self.fused:
            return self.w2(_FusedAct.apply(gate, up, self.act))
        y = self.act(gate)
        return self.w2(y if up is None else y * up)                     # (b, s, h)


class GPTLayer(nn.Module):
    """One rank's share of Megatron-LM's GPT layer (heads a/t, MLP 4h/t): see the module."""

    def __init__(self, hidden, heads, seq, t=1, attention="unfused", p_drop=0.1):
        super().__init__()
        self.head_dim, self.heads, self.p = hidden // heads, heads // t, p_drop
        self.ln1, self.ln2 = FusedNorm(hidden, rms=False), FusedNorm(hidden, rms=False)
        self.qkv = nn.Linear(hidden, 3 * hidden // t)
        self.proj = nn.Linear(hidden // t, hidden)
        self.mlp = MLP(hidden, 4 * hidden // t, "gelu")
        self.attention = attention
        self.register_buffer("causal", torch.ones(seq, seq, dtype=torch.bool).triu(1))

    def attend(self, q, k, v):                                         # (b, a/t, s, h/a) each
        if self.attention == "flash":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        scores = (q @ k.transpose(-1, -2)) * self.head_dim ** -0.5      # (b, a/t, s, s)
        prob = scores.masked_fill(self.causal, -math.inf).softmax(-1)
        return dropout(prob, self.p) @ v                                # (b, a/t, s, h/a)

    def forward(self, x):                                               # (b, s, h)
        b, s, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        y = self.attend(q, k, v).transpose(1, 2).reshape(b, s, -1)      # (b, s, h/t)
        x = x + dropout(self.proj(y), self.p)
        return x + dropout(self.mlp(self.ln2(x)), self.p)               # (b, s, h)


class LlamaLayer(nn.Module):
    """One rank's share of a Llama 3 layer (a/t query heads, kv/t key/value heads, ffn/t):
    RMSNorm, GQA with RoPE, SwiGLU (or Nemotron-4's squared ReLU, ``mlp="relu2"``)."""

    def __init__(self, hidden, heads, kv_heads, ffn, seq, t=1, mlp="swiglu", fused_mlp=True):
        super().__init__()
        self.head_dim = hidden // heads
        self.heads, self.kv_heads = heads // t, max(kv_heads // t, 1)  # t > kv: copies
        self.norm1, self.norm2 = FusedNorm(hidden, rms=True), FusedNorm(hidden, rms=True)
        self.wq = nn.Linear(hidden, self.heads * self.head_dim, bias=False)
        self.wk = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(self.heads * self.head_dim, hidden, bias=False)
        self.mlp = MLP(hidden, ffn // t, mlp, fused_mlp)
        cos, sin = rope_tables(seq, self.head_dim)
        self.register_buffer("cos", cos)
        self.register_buffer("sin", sin)

    def forward(self, x):                                               # (b, s, h)
        b, s, _ = x.shape
        y = self.norm1(x)
        q = self.wq(y).view(b, s, self.heads, -1).transpose(1, 2)       # (b, a/t, s, h/a)
        k = self.wk(y).view(b, s, self.kv_heads, -1).transpose(1, 2)    # (b, kv/t, s, h/a)
        v = self.wv(y).view(b, s, self.kv_heads, -1).transpose(1, 2)
        q, k = rope(q, self.cos, self.sin), rope(k, self.cos, self.sin)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.wo(o.transpose(1, 2).reshape(b, s, -1))
        return x + self.mlp(self.norm2(x))                              # (b, s, h)


class MLAMoELayer(nn.Module):
    """One DeepSeek-V3 layer (no tensor parallelism: DeepSeek-V3 ran none): MLA with query
    latent ``q_latent``, key/value latent ``kv_latent``, ``heads`` heads of ``nope`` + ``rope_dim``
    query/key dims and ``v_dim`` value dims; ``experts`` routed SwiGLU experts of ``ffn``,
    top ``k``, and ``shared`` shared ones. Dropless: every routed token is computed."""

    def __init__(self, hidden, heads, seq, q_latent, kv_latent, nope, rope_dim, v_dim,
                 experts, k, ffn, shared=1):
        super().__init__()
        self.heads, self.nope, self.rope_dim, self.v_dim, self.k = heads, nope, rope_dim, v_dim, k
        self.norm1, self.norm2 = FusedNorm(hidden, rms=True), FusedNorm(hidden, rms=True)
        self.wq_a = nn.Linear(hidden, q_latent, bias=False)
        self.q_norm = FusedNorm(q_latent, rms=True)
        self.wq_b = nn.Linear(q_latent, heads * (nope + rope_dim), bias=False)
        self.wkv_a = nn.Linear(hidden, kv_latent + rope_dim, bias=False)
        self.kv_norm = FusedNorm(kv_latent, rms=True)
        self.wkv_b = nn.Linear(kv_latent, heads * (nope + v_dim), bias=False)
        self.wo = nn.Linear(heads * v_dim, hidden, bias=False)
        self.router = nn.Linear(hidden, experts, bias=False)
        self.experts = nn.ModuleList(MLP(hidden, ffn, "swiglu", True) for _ in range(experts))
        self.shared = MLP(hidden, shared * ffn, "swiglu", True)
        cos, sin = rope_tables(seq, rope_dim)
        self.register_buffer("cos", cos)
        self.register_buffer("sin", sin)

    def attention(self, y):                                             # (b, s, h)
        b, s, _ = y.shape
        q = self.wq_b(self.q_norm(self.wq_a(y))).view(b, s, self.heads, -1).transpose(1, 2)
        kv, k_rope = self.wkv_a(y).split([self.kv_norm.weight.numel(), self.rope_dim], -1)
        kv = self.wkv_b(self.kv_norm(kv)).view(b, s, self.heads, -1).transpose(1, 2)
        k_nope, v = kv.split([self.nope, self.v_dim], -1)              # (b, a, s, nope), (.., v)
        q_nope, q_rope = q.split([self.nope, self.rope_dim], -1)
        q = torch.cat([q_nope, rope(q_rope, self.cos, self.sin)], -1)   # (b, a, s, nope + rope)
        k_rope = rope(k_rope[:, None], self.cos, self.sin).expand(-1, self.heads, -1, -1)
        k = torch.cat([k_nope, k_rope], -1)                             # (b, a, s, nope + rope)
        o = flash_attention(q, k, v)                                    # (b, a, s, v)
        return self.wo(o.transpose(1, 2).reshape(b, s, -1))

    def moe(self, y):                                                   # (b, s, h)
        tokens = y.reshape(-1, y.shape[-1])                             # (n, h)
        scores = torch.sigmoid(self.router(tokens).float())             # (n, E)
        chosen = scores.detach().topk(self.k, -1).indices               # (n, k), no gradient
        gates = scores.gather(-1, chosen)
        gates = gates / gates.sum(-1, keepdim=True)                     # (n, k)
        order = chosen.flatten().argsort()                              # by expert
        token_of = order // self.k
        routed = tokens[token_of]                                       # (n k, h)
        counts = torch.bincount(chosen.flatten(), minlength=len(self.experts)).tolist()
        outs = torch.cat([expert(part) for expert, part in
                          zip(self.experts, routed.split(counts))])     # (n k, h)
        weighted = outs * gates.flatten()[order, None].to(outs.dtype)
        combined = weighted[order.argsort()].view(-1, self.k, y.shape[-1]).sum(1)  # (n, h)
        return (combined + self.shared(tokens)).view_as(y)

    def forward(self, x):                                               # (b, s, h)
        x = x + self.attention(self.norm1(x))
        return x + self.moe(self.norm2(x))


if __name__ == "__main__":
    from lessonlib.instruments.activations import ActivationMeter
    torch.manual_seed(0)
    b, s, h = 2, 32, 64
    for layer in (GPTLayer(h, 4, s), LlamaLayer(h, 4, 2, 128, s),
                  MLAMoELayer(h, 4, s, 32, 16, 16, 8, 16, 4, 2, 32)):
        layer = layer.to(torch.bfloat16)
        meter = ActivationMeter([*layer.parameters(), *layer.buffers()])
        with meter.forward():
            layer(torch.randn(b, s, h, dtype=torch.bfloat16, requires_grad=True))
        print(f"{type(layer).__name__}: {meter.bytes:,} bytes saved for backward")
