"""Bytes one transformer layer keeps for its backward, per family, as formulas measured to the byte.

Each formula below was read off ``lessonlib.models.measured``'s layer of that family, tensor by
tensor, with ``instruments.activations.ActivationMeter`` in bf16 (``tests/test_measured_layers.py``
checks formula against meter at three sizes per family, to the byte). Per micro-batch of b
sequences of s tokens, on one of t tensor-parallel ranks (heads, key/value heads and the MLP's
width split by t; with sequence parallelism, SP, the norms, residuals and dropouts keep s/t
rows, Korthikanti et al. 2022 §4.2.2), in bytes per token:

    GPT (LayerNorm, GeLU, dropout)   10h + 16  +  24h/t  +  5as/t (scores kept) or 4a/t (flash)
    Llama (RMSNorm, GQA, RoPE)        8h + 8   +  (4h + 4 kv_dim)/t + 4a/t  +  MLP
        MLP: SwiGLU 6 ffn/t fused (8 unfused), squared ReLU (Nemotron-4) 4 ffn/t
    DeepSeek-V3 (MLA + MoE, t = 1)   attention 4h + 4(q_lat + kv_lat) + 4a(qk + v) + 4a + 12
                                      MoE 4h + 8 + 4E + 38k + 4kh + 6k ffn + 6 shared ffn

with h the hidden size, a the heads, kv_dim the key/value heads times the head dim. The
replicated terms (``(SP: /t)``): each norm's input (2h) and its float32 statistics (LayerNorm's
mean and 1/std, 8 bytes; RMSNorm's 1/rms, 4), each norm's output (2h), GPT's two one-byte
dropout masks. The split terms: Q, K, V and the attention output (the output projection's
input, one storage with the kernel's output), the MLP's hidden tensors. GPT's 10h + 24h/t +
5as/t is Korthikanti et al. 2022's Table 2 (34sbh + 5as²b at t = 1) plus the 16 bytes of norm
statistics that table leaves out; the flash kernel keeps a float32 log-sum-exp (4a) instead of
the scores, their softmax and its dropout (5as). The MoE's router keeps its float32 sigmoid
scores (4E), the chosen experts and the sort that groups tokens by expert (int64, 38k bytes
with the gates), every routed copy of a token (2kh in, 2kh out) and each expert's SwiGLU.

Recompute: ``selective`` drops the attention scores (Korthikanti's; a flash kernel keeps none,
so nothing changes); ``full`` keeps the layer's input, 2h (s/t rows under SP: Megatron keeps the
sharded input); ``op`` (torchtitan's op-level selective checkpointing: the layer's input and
every second matmul's output, wq, wv, w1 and w2, with the attention kernel's output and
log-sum-exp); ``norm-up`` (DeepSeek-V3 §3.2.3, §3.3.4: "recompute all RMSNorm operations and
MLA up-projections", and SwiGLU's output from its cached inputs): the measured list less the
norms' outputs, Q, K, V and the SwiGLU products, plus the shared rotary key (2 rope dims) the
recomputation reads. These two are derived from the measured list, not measured themselves.

Counted at bf16 (2 bytes) for every 16-bit tensor: DeepSeek-V3 caches some inputs in FP8
(§3.3.4), which this upper bound leaves out.
"""
STATS = 4           # float32 statistics of a norm, per statistic per token
LSE = 4             # float32 log-sum-exp per head per token
INDEX = 8           # int64 indices


def gpt_layer_bytes(s, b, h, a, t=1, sequence_parallel=False, recompute="none",
                    attention="unfused"):
    """Bytes a GPT layer (``models.measured.GPTLayer``) keeps on one of t ranks."""
    rows = s * b / t if sequence_parallel else s * b
    if recompute == "full":
        return rows * 2 * h
    replicated = rows * (10 * h + 4 * STATS)
    split = s * b * 24 * h / t
    scores = s * b * (5 * a * s if attention == "unfused" else LSE * a) / t
    if recompute in ("selective", "op") and attention == "unfused":
        scores = 0
    return replicated + split + scores


def mlp_bytes(ffn, mlp="swiglu", fused=True):
    """Bytes per token the MLP's hidden tensors keep, ``ffn`` wide: SwiGLU's w1 x, w3 x and
    their product (and SiLU's output when not fused); squared ReLU's ReLU output and square."""
    if mlp == "swiglu":
        return 2 * (3 if fused else 4) * ffn
    return 2 * 2 * ffn


def llama_layer_bytes(s, b, h, a, kv_heads, ffn, t=1, sequence_parallel=False,
                      recompute="none", mlp="swiglu", fused=True, gathered=False):
    """Bytes a Llama layer (``models.measured.LlamaLayer``) keeps on one of t ranks; ``mlp``
    "relu2" for Nemotron-4's MLP; ``fused`` SwiGLU as one kernel. ``gathered``: under SP the
    column layers keep their all-gathered input, the norms' outputs at all s rows (PyTorch's
    plan, which torchtitan applies, as lesson 14 §7 measures on CPU ranks; Megatron keeps the
    shard and gathers again in backward): derived from the measured list, not measured on
    this layer."""
    rows = s * b / t if sequence_parallel else s * b
    if recompute == "full":
        return rows * 2 * h
    kv_dim = max(kv_heads // t, 1) * (h // a)           # K/V heads replicate past kv_heads
    if recompute == "op":
        split = 2 * (h / t + kv_dim + h / t + ffn / t + h) + LSE * a / t
        return rows * 2 * h + s * b * split
    norm_outputs = (s * b if gathered else rows) * 4 * h
    replicated = rows * (4 * h + 2 * STATS) + norm_outputs
    split = s * b * ((4 * h) / t + 4 * kv_dim + LSE * a / t + mlp_bytes(ffn / t, mlp, fused))
    return replicated + split


def mla_bytes(s, b, h, a, q_latent, kv_latent, qk_dim, v_dim, rope_dim, recompute="none",
              fp8=False):
    """Bytes DeepSeek-V3's attention half (norm, MLA, flash kernel) keeps, no TP. ``fp8``: the
    attention output (the output projection's input) kept in E5M6, 12 bits (§3.3.4: "a
    customized E5M6 data format exclusively for these activations")."""
    output = (1.5 if fp8 else 2) * a * v_dim
    kept = 2 * h + STATS + 2 * q_latent + STATS + 2 * kv_latent + STATS \
        + output + LSE * a                            # input, latents, output, log-sum-exp
    if recompute != "norm-up":
        kept += 2 * h + 2 * q_latent + 2 * kv_latent + 2 * a * (2 * qk_dim + v_dim)
    else:
        kept += 2 * rope_dim
    return s * b * kept


def moe_bytes(s, b, h, experts, k, ffn, shared, recompute="none", fused=True, fp8=False):
    """Bytes a dropless MoE half (``MLAMoELayer.moe`` and its norm) keeps per micro-batch:
    every token's k routed copies through SwiGLU experts of ``ffn``, ``shared`` shared ones.
    ``fp8`` (DeepSeek-V3 §3.3.4, with ``norm-up``): the routed inputs and the SwiGLU inputs
    cached in FP8, one byte each (derived, not measured)."""
    cached = 1 if fp8 and recompute == "norm-up" else 2      # bytes of a cached MoE input
    product, silu = recompute != "norm-up", not fused
    expert = ffn * (2 * cached + 2 * product + 2 * silu)    # w1 x, w3 x, their product, SiLU
    norm = 2 * h + STATS + (0 if recompute == "norm-up" else 2 * h)
    router = STATS * experts + INDEX * k + STATS * (k + 1)      # scores, chosen, gates
    sort = 3 * INDEX * k + 2 * k                                # token_of, order, inverse; gate
    routed = k * (cached * h + 2 * h + expert)                  # in, out (kept for the gate)
    return s * b * (norm + router + sort + routed + shared * expert)


def loss_bytes(s, b, V, t=1):
    """Bytes the output layer's loss peaks at, per micro-batch, one of t vocabulary-parallel
    ranks: the backward of a float32 cross-entropy holds the saved float32 log-probabilities
    (4V per token), the gradient arriving at them (4V) and the one it returns (4V) at once."""
    return s * b * 12 * V / t
