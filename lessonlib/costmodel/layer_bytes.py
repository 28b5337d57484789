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
log-sum-exp); ``norm-up`` (DeepSeek-V3 §3.2.3, §3.3.3: "recompute all RMSNorm operations and
MLA up-projections", and SwiGLU's output from its cached inputs): the measured list less the
norms' outputs, Q, K, V and the SwiGLU products, plus the shared rotary key (2 rope dims) the
recomputation reads. These two are derived from the measured list, not measured themselves.

Counted at bf16 (2 bytes) for every 16-bit tensor. DeepSeek-V3's own storage (``fp8`` with
``norm-up``; DeepSeek-V3 §3.3.3, "Low-Precision Activation": "it is a natural choice to cache
activations in FP8 format for the backward pass of the Linear operator"): the routed copies and
SwiGLU's inputs in FP8, the attention output in E5M6, each with a float32 scale per 1x128 tile
(§3.3.2); the gates applied to SwiGLU's recomputed output, so no expert's output is kept
(``moe_bytes``). These are derived from the measured list, not measured themselves.

The output layer (``output_layer_bytes``): the final norm's input, the head's input and the
loss's float32 peak, on the stage that holds the head.
"""
STATS = 4           # float32 statistics of a norm, per statistic per token
LSE = 4             # float32 log-sum-exp per head per token
INDEX = 8           # int64 indices
# DeepSeek-V3 §3.3.2, "Fine-Grained Quantization": "for activations, we group and scale elements
# on a 1x128 tile basis (i.e., per token per 128 channels)"; one float32 scale per tile.
FP8_SCALE = 4 / 128


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
    their product (and SiLU's output when not fused); squared ReLU's ReLU output and square,
    GeLU's input and output."""
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
    attention output (the output projection's input) kept in E5M6, 12 bits, with its 1x128
    tiles' scales (§3.3.3: "a customized E5M6 data format exclusively for these
    activations"). ``norm-up`` (§3.2.3: "We recompute all RMSNorm operations and MLA
    up-projections during back-propagation, thereby eliminating the need to persistently store
    their output activations"): the norms' outputs and Q, K, V are rebuilt from the norms'
    inputs and the latents, which stay (the latents in BF16: they enter a norm, and §3.3.1
    keeps "normalization operators" in their original precision)."""
    output = (1.5 + FP8_SCALE if fp8 else 2) * a * v_dim
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

    Measured (``recompute`` "none"): each routed copy's input and its expert's output (kept
    for the gate's gradient, the gate multiplying the output), w1 x, w3 x and their product.
    ``norm-up``, as DeepSeek-V3 ran it (derived, not measured; FP8 only with ``fp8``):

    * the norm recomputed (§3.2.3), its input kept;
    * the routed copies in FP8 (§3.3.3: "we quantize the activation before MoE up-projections
      into FP8 and then apply dispatch components"), the up-projections' cached input;
    * SwiGLU's inputs in FP8 and its output recomputed (§3.3.3, "Inputs of the SwiGLU operator
      in MoE. To further reduce the memory cost, we cache the inputs of the SwiGLU operator and
      recompute its output in the backward pass. These activations are also stored in FP8");
    * no expert output: the report lists no cached tensor of that size, and none is needed
      where the gate scales SwiGLU's output before the down-projection (Megatron-Core,
      ``megatron/core/transformer/moe/experts.py``, ``GroupedMLP.forward``:
      ``self.activation_func_with_probs(fc1_output, permuted_probs.unsqueeze(-1))``, then the
      fc2 grouped GEMM): the gate's gradient is then the product of the down-projection's input
      gradient with SwiGLU's recomputed output, and the down-projection's input is rebuilt
      with it. Each FP8 tensor carries its 1x128 tiles' float32 scales (``FP8_SCALE``)."""
    cached = 1 + FP8_SCALE if fp8 and recompute == "norm-up" else 2   # a cached MoE input
    product, silu = recompute != "norm-up", not fused
    expert = ffn * (2 * cached + 2 * product + 2 * silu)    # w1 x, w3 x, their product, SiLU
    norm = 2 * h + STATS + (0 if recompute == "norm-up" else 2 * h)
    router = STATS * experts + INDEX * k + STATS * (k + 1)      # scores, chosen, gates
    sort = 3 * INDEX * k + 2 * k                                # token_of, order, inverse; gate
    output = 0 if recompute == "norm-up" else 2 * h             # kept for the gate's gradient
    routed = k * (cached * h + output + expert)                 # in, out, the expert's own
    return s * b * (norm + router + sort + routed + shared * expert)


def loss_runs(loss, loss_parallel, t):
    """How a loss set to ``loss`` (``Layout.loss``) is priced (``loss_bytes``, and its
    traffic in ``kernels.loss_bytes``): as set, but a compiled one under PyTorch's loss
    parallel (t > 1), whose compiled form is not read, keeps the eager rule."""
    return "eager" if loss == "compiled" and loss_parallel and t > 1 else loss


def loss_bytes(s, b, V, t=1, heads=1, loss_parallel=False, loss="eager"):
    """Bytes the output layer's loss peaks at, per micro-batch, one of t vocabulary-parallel
    ranks: the backward of a float32 cross-entropy holds the saved float32 log-probabilities
    (4V per token and head), the gradient arriving at them (4V) and the one it returns (4V) at
    once. ``heads``: losses on this stage (DeepSeek-V3's multi-token prediction adds one per
    depth, §2.2), each keeping its log-probabilities until the backward reaches it.

    ``loss_parallel`` (PyTorch's, which torchtitan enables whenever TP > 1 unless
    ``--training.disable_loss_parallel``): its fused backward,
    ``torch/distributed/tensor/parallel/loss.py`` ``_nll_loss_and_log_softmax_backward``,
    builds ``grad_input = torch.zeros_like(x)`` and returns ``(grad_input + torch.exp(x)) *
    grad_output``: beside the saved log-probabilities x, the zeros, ``exp(x)`` and their sum
    are alive at once, then the zeros, the sum and the product: 4V more than CUDA's fused
    ``log_softmax_backward``.

    ``loss="compiled"`` (``Layout.loss``): under torch.compile the forward keeps the BF16
    logits (2V) and two float32 numbers a token, and computes the log-sum-exp in two reading
    passes without writing float32 logits; the backward writes the BF16 gradient (2V) in one
    fused kernel. 4V a token and head at the peak, read from the code inductor generates for
    ``F.cross_entropy(pred.float(), labels)`` (torch 2.13: one [tokens, V] buffer, the BF16
    gradient, besides per-token ones). Under PyTorch's loss parallel (t > 1) the eager rule
    stays (``loss_runs``).

    ``loss="megatron"`` or ``"megatron-fused"`` (Megatron's vocab-parallel cross entropy,
    ``kernels.MEGATRON_LOSS_BYTES``): each head keeps its float32 softmax (4V), which the
    backward turns into the gradient in place, then casts to BF16 (2V)."""
    loss = loss_runs(loss, loss_parallel, t)
    if loss == "compiled":
        return s * b * (2 * heads + 2) * V / t
    if loss.startswith("megatron"):
        return s * b * (4 * heads + 2) * V / t
    transient = 12 if loss_parallel and t > 1 else 8
    return s * b * (4 * heads + transient) * V / t


def output_layer_bytes(s, b, h, V, t=1, sequence_parallel=False, heads=1, gathered=False,
                       layer_norm=False, loss="eager"):
    """Bytes on the stage with the output layer at the loss's peak, per micro-batch: the final
    RMSNorm's input and 1/rms (``layer_norm``: a LayerNorm's mean and 1/std; s/t rows under
    SP), the head's input, which the matmul keeps
    for its weight gradient (all s rows where the plan all-gathers the sequence into the
    head: PyTorch's, torchtitan's ``"output": ColwiseParallel(input_layouts=Shard(1), ...)``;
    Megatron keeps its shard and gathers again in backward), and ``loss_bytes`` (``gathered``
    also means PyTorch's loss parallel; ``loss``: how it runs, ``Layout.loss``). Outside every
    layer, so no recompute mode drops it."""
    rows = s * b / t if sequence_parallel else s * b
    head_rows = s * b if gathered or not sequence_parallel else rows
    stats = 2 * STATS if layer_norm else STATS
    return (rows * (2 * h + stats) + head_rows * 2 * h) * heads + loss_bytes(
        s, b, V, t, heads, gathered, loss)
