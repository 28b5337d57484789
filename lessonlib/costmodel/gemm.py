"""How fast one GEMM runs: a curve over the GEMM's own shape under the GPU's measured ceiling.

What it teaches: a matrix product C (M x N) = A (M x K) B (K x N) does 2MNK FLOPs and, at
best, reads A and B and writes C once: (MK + KN + MN) elements. Its arithmetic intensity,
FLOPs per byte, decides which of two ceilings holds (the roofline; NVIDIA, "Matrix
Multiplication Background User's Guide", "Math and memory bounds"):

    time = max(2MNK / (MAMF x shape share), bytes / (HBM bandwidth x HBM_EFFICIENCY))

The compute ceiling is measured, not chosen: the GPU's Maximum Achievable Matmul FLOPS
(``GPU.matmul_flops``, ``hardware.MAMF``), the best rate a sweep of shapes found one large
product to run at (A100 271 of 312 TFLOP/s, H100 795 of 989; FP8 1,403 of 1,979), at the
share of that burst a Hopper GPU sustains in training (``hardware.SUSTAINED``). A shape
reaches it only when its tiles fill the GPU, and the guide names the two ways they do not
("Dimension quantization effects"): tile quantization, C is computed in tiles of ``TILE`` x
``TILE``, so M or N of 129 costs as much as 256; and wave quantization, the tiles run on the
GPU's SMs in waves, so 109 tiles on an A100's 108 SMs take two waves' time. Thin GEMMs (a
tensor-parallel shard with few columns, an attention score product with K = the head dim of
64-192 and its s x s output written to memory) are memory-bound and run far below it, the
more so on an H100, whose peak grew 3.2x over the A100's while its HBM grew 1.6x (989 / 3.35
= 295 FLOPs per byte against 312 / 2.0 = 153; ``hardware.py``). ``calibration.py`` swaps in
a GPU's own measured MAMF (``labs/gpu_check.py`` measures it).

A fused attention kernel (today's shapes) is not a GEMM library call: it runs QK^T, the
softmax and PV in one kernel whose softmax and data movement stall the Tensor Cores, so it
runs at its own measured rate, ``attention_flops``: FlashAttention-2 (PyTorch SDPA's flash
backend) on an H100 SXM5 as Shah et al. 2024 (FlashAttention-3) measured it, Fig. 5
(forward) and Fig. 6 (backward), by sequence length, head dim and causal mask: 370 TFLOP/s
forward at 16K tokens, head dim 128, no mask, but 191 at 512 tokens under a causal mask,
and 214 to 322 backward (about a third of peak: the paper's "only 35 %"). Its backward
recomputes the scores from Q and K instead of reading them (Dao et al. 2022 §3.1;
FlashAttention-2 §3.1.2): five s x s products against the forward's two, 2.5x the
forward's FLOPs, at the backward's own, lower rate. Context parallelism splits one call into
c calls per layer on shorter blocks (``fused_attention_s``). The same figures measure cuDNN's
fused attention, which Transformer Engine (so Megatron-LM) runs on Hopper, and
FlashAttention-3: 529 and 602 TFLOP/s forward at 8K tokens under a causal mask against
FlashAttention-2's 333 (``layout.ATTENTION_KERNELS``).

FP8 (``precision="fp8"``) uses the GPU's FP8 MAMF and one byte per element for the linear
layers' GEMMs only: DeepSeek-V3 (§3.3)
and torchao's ``Float8Linear`` (which converts ``nn.Linear``; torchtitan's float8 converter
skips the one named "output") both keep attention's score products and the output head in
BF16. Its inputs are made by cast kernels, memory-bound, whose bytes depend on the scaling
(``fp8_quantization_bytes``): DeepSeek-V3's blockwise tiles, torchao's tensorwise scale, or
Transformer Engine's delayed scaling (Megatron-LM's), whose norms write FP8 themselves.

One job: the time of one GEMM or one fused attention call; it runs past 300 lines because
each kernel's measured rates are tabled here beside the rule that reads them.

Pure arithmetic: ``python -c "from lessonlib.costmodel.gemm import gemm_efficiency;
from lessonlib.costmodel import GPUS; print(gemm_efficiency(GPUS['H100-SXM5'], 8192, 2048,
16384))"``.
"""
import math
from functools import lru_cache

# Fraction of datasheet HBM bandwidth that streaming kernels reach (``throughput.py``).
HBM_EFFICIENCY = 0.8
# FlashAttention-2 on an H100 SXM5 (989 TFLOP/s BF16 dense), BF16, in TFLOP/s by sequence
# length (batch x length = 16K tokens, 2,048 hidden), the "FlashAttention-2" bars of Shah et
# al. 2024 (FlashAttention-3, arXiv 2407.08608), Fig. 5 (forward; with and without the causal
# mask) and Fig. 6 (backward, no mask; the paper prints no causal backward). FLOPs as the
# paper counts them: 4 s^2 d per head forward, half under the causal mask, 2.5x backward.
FA2_SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
FA2_H100_TFLOPS = {
    ("forward", False, 64): (282, 306, 318, 321, 322, 324),
    ("forward", True, 64): (180, 229, 262, 284, 295, 299),
    ("forward", False, 128): (309, 350, 362, 368, 370, 370),
    ("forward", True, 128): (191, 260, 298, 319, 333, 335),
    ("forward", True, 256): (208, 251, 278, 293, 297, 298),
    ("backward", False, 64): (198, 238, 264, 279, 287, 291),
    ("backward", False, 128): (214, 260, 291, 310, 318, 322),
}
FA2_MEASURED_ON_PEAK = 989e12   # the H100 SXM5's dense BF16 peak, the figures' GPU
# The same figures' bars for cuDNN's fused attention (what Transformer Engine runs on Hopper)
# and FlashAttention-3, BF16, same shapes and FLOP count; the figures print no causal
# forward for either at head dim 64 (the nearest measured dim stands in). At 512 tokens,
# head dim 128, no mask, the two bars read 497 (cuDNN) and 467 (FlashAttention-3).
ATTENTION_H100_TFLOPS = {
    "fa2": FA2_H100_TFLOPS,
    "cudnn": {
        ("forward", False, 64): (335, 373, 395, 408, 412, 413),
        ("forward", False, 128): (497, 574, 617, 609, 600, 595),
        ("forward", True, 128): (315, 410, 484, 518, 529, 539),
        ("forward", True, 256): (308, 391, 450, 483, 497, 509),
        ("backward", False, 64): (266, 348, 395, 417, 432, 433),
        ("backward", False, 128): (305, 408, 465, 499, 518, 516),
    },
    "fa3": {
        ("forward", False, 64): (333, 392, 460, 476, 496, 497),
        ("forward", False, 128): (467, 565, 625, 638, 646, 648),
        ("forward", True, 128): (292, 423, 521, 579, 602, 616),
        ("forward", True, 256): (286, 427, 537, 612, 628, 642),
        ("backward", False, 64): (272, 363, 422, 453, 472, 474),
        ("backward", False, 128): (316, 424, 501, 542, 559, 561),
    },
}
# The fused kernel's backward against its forward, in FLOPs: dV, dP, dQ, dK and the
# recomputed QK^T (Dao et al. 2022, Algorithm 4), 5 products of s x s against 2.
FUSED_BACKWARD_RATIO = 2.5
# Output tile of one thread block (NVIDIA's guide: 128 x 128 and 256 x 128 tiles); the
# tiles of one GEMM run on the SMs in waves.
TILE = 128
PRECISIONS = {"bf16": 2, "fp8": 1}   # bytes per element


def peak_flops(gpu, precision="bf16"):
    """The GPU's dense peak for ``precision``; ValueError if it has none (FP8 before H100)."""
    if precision == "bf16":
        return gpu.peak_flops
    if precision == "fp8" and gpu.fp8_peak_flops:
        return gpu.fp8_peak_flops
    raise ValueError(f"precision={precision!r} is not available on {gpu.name}; use "
                     f"{' or '.join(p for p in PRECISIONS if p == 'bf16' or gpu.fp8_peak_flops)}")


def matmul_flops(gpu, precision="bf16"):
    """The fastest ``gpu`` runs one large GEMM in ``precision`` in training: its measured MAMF
    at the share it sustains (``GPU.matmul_flops``); the dense peak where no measurement is
    recorded."""
    peak = peak_flops(gpu, precision)
    measured = gpu.matmul_flops if precision == "bf16" else gpu.fp8_matmul_flops
    return measured or peak


def _tile_share(n):
    """Useful share of the tiles covering n rows: n / (TILE x ceil(n / TILE))."""
    return n / (TILE * math.ceil(n / TILE))


def _wave_share(gpu, m, n, batch=1):
    """Busy share of the SMs over the waves that run the (m/TILE) x (n/TILE) tiles of each
    of ``batch`` GEMMs launched together (a batched GEMM: attention's heads, MoE experts)."""
    tiles = math.ceil(m / TILE) * math.ceil(n / TILE) * max(1, round(batch))
    return tiles / (gpu.sms * math.ceil(tiles / gpu.sms))


def gemm_time_s(gpu, m, n, k, precision="bf16", writes_output=True, batch=1):
    """Seconds of one (m x k) @ (k x n) GEMM on ``gpu``: the slower of its compute (the
    MAMF over the shape's tile and wave quantization, its tiles in waves with those of the
    ``batch`` GEMMs launched with it) and its memory traffic (``writes_output`` False: a
    fused kernel that never stores C, as FlashAttention's score product)."""
    share = _tile_share(m) * _tile_share(n) * _wave_share(gpu, m, n, batch)
    compute = 2 * m * n * k / (matmul_flops(gpu, precision) * share)
    elements = m * k + k * n + (m * n if writes_output else 0)
    memory = elements * PRECISIONS[precision] / (gpu.hbm_bytes_per_s * HBM_EFFICIENCY)
    return max(compute, memory)


def gemm_efficiency(gpu, m, n, k, precision="bf16", writes_output=True):
    """Achieved share of the ``precision`` peak: 2mnk FLOPs over ``gemm_time_s``."""
    seconds = gemm_time_s(gpu, m, n, k, precision, writes_output)
    return 2 * m * n * k / seconds / peak_flops(gpu, precision)


def _interpolate(x, xs, ys):
    """ys at x, linear between the points of xs (ascending), the end values outside."""
    if x <= xs[0]:
        return ys[0]
    for x0, x1, y0, y1 in zip(xs, xs[1:], ys, ys[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return ys[-1]


def _measured_tflops(direction, causal, seqlen, head_dim, kernel="fa2"):
    """The ``kernel``'s measured TFLOP/s (``ATTENTION_H100_TFLOPS``) at ``seqlen``, linear in
    log2 of the length between the measured lengths and in the head dim between the
    measured dims, the end values beyond them."""
    table = ATTENTION_H100_TFLOPS[kernel]
    dims = sorted(d for (way, masked, d) in table if (way, masked) == (direction, causal))
    log_lengths = [math.log2(n) for n in FA2_SEQLENS]
    rates = [_interpolate(math.log2(seqlen), log_lengths, table[direction, causal, d])
             for d in dims]
    return _interpolate(head_dim, dims, rates)


def attention_flops(gpu, seqlen, head_dim, causal=True, direction="forward", kernel="fa2"):
    """FLOP/s of a fused attention ``kernel`` (``layout.ATTENTION_KERNELS``; FlashAttention-2
    by default) over sequences of ``seqlen`` tokens on ``gpu``: the measured H100 figures as
    a share of that H100's peak, times ``gpu``'s peak (on an A100, where FlashAttention-2
    reaches 50-73 % of peak, Dao 2023, this is pessimistic). The causal backward, which the
    paper does not print, is its unmasked backward slowed as the mask slows the forward at
    that length."""
    if direction not in ("forward", "backward"):
        raise ValueError(f"direction={direction!r} must be 'forward' or 'backward'")
    if kernel not in ATTENTION_H100_TFLOPS:
        raise ValueError(f"kernel={kernel!r} must be one of {', '.join(ATTENTION_H100_TFLOPS)}")
    rate = _measured_tflops(direction, False, seqlen, head_dim, kernel)
    if causal and direction == "forward":
        rate = _measured_tflops("forward", True, seqlen, head_dim, kernel)
    elif causal:                         # the mask's cost, where both forwards were measured
        both = min(max(head_dim, 64), 128)
        rate *= (_measured_tflops("forward", True, seqlen, both, kernel)
                 / _measured_tflops("forward", False, seqlen, both, kernel))
    return rate * 1e12 / FA2_MEASURED_ON_PEAK * gpu.peak_flops * gpu.clock_share


@lru_cache(maxsize=4096)   # the planner prices the same layer shapes many times
def fused_attention_s(model, b, gpu, t=1, c=1, ulysses=False, kernel="fa2"):
    """(forward, backward) seconds of one layer's fused causal attention on one GPU: b
    sequences, a/t heads, s/c queries each. Without context parallelism one causal call
    over s tokens. With c > 1, as PyTorch's ``context_parallel`` (torchtitan's) and
    Megatron-Core's ring run it on load-balanced (zig-zag) shards: c calls a layer, one
    causal on the rank's own n = s/c tokens and c-1 unmasked on half a block (n queries
    against the n/2 earlier keys, or the n/2 later queries against all n), each n^2/2
    scores; the short side sets the call's length (``_templated_ring_attention``).
    ``ulysses``: each rank holds a/(t c) heads of the whole sequence, one causal call;
    ``kernel``: which fused kernel (``attention_flops``)."""
    qk, v = model.qk_v_head_dims()
    heads, n = b * model.a / t, model.s // c
    if ulysses:
        heads, n, c = heads / c, model.s, 1
    flops = heads * n * n / 2 * 2 * (qk + v)      # QK^T and PV of n^2/2 scores a call
    calls = [(n, True)] + [(n / 2, False)] * (c - 1)
    forward = sum(flops / attention_flops(gpu, length, max(qk, v), masked, kernel=kernel)
                  for length, masked in calls)
    backward = sum(FUSED_BACKWARD_RATIO * flops / attention_flops(
        gpu, length, max(qk, v), masked, "backward", kernel) for length, masked in calls)
    return forward, backward


def layer_gemms(model, b, t=1, c=1, e=1):
    """The forward GEMMs of one layer on one GPU, as (m, n, k, count, kind) with kind
    "linear" (weights) or "attention" (the score products QK^T and PV, per head).

    Tokens per GPU: b s/c; weights split t ways (columns of QKV and the first MLP matrix,
    rows of the output projection and the second). Megatron-LM 2021's layer writes the s x s
    scores to memory; today's layers (``model.legacy`` False) run a fused kernel that does not,
    and count half the causal scores. An MoE layer's experts each take the tokens routed to
    them: b s k / E per expert from each of the e ranks, E/e experts per GPU.
    """
    s, h, a = model.s // c, model.h, model.a
    tokens, (qk_dim, v_dim) = b * s, model.qk_v_head_dims()
    if model.legacy:
        qkv, ffn, gate = 3 * h, 4 * h, 1             # QKV; a GeLU MLP of 4h
    else:
        attention = model.moe.attention if model.moe else model.attention_params()
        # SwiGLU's first matrix is two (gate and up); a squared-ReLU MLP's is one
        qkv, ffn = attention / h - h, model.ffn or 4 * h
        gate = 2 if model.mlp == "swiglu" else 1
    out = [(tokens, qkv / t, h, 1, "linear"), (tokens, h, h / t, 1, "linear")]
    causal = 1.0 if model.legacy else 0.5            # share of the s x s scores computed
    heads = b * a / t
    out += [(s, model.s * causal, qk_dim, heads, "attention"),  # QK^T, s/c queries x s keys
            (s, v_dim, model.s * causal, heads, "attention")]   # PV
    moe = model.moe
    dense = 1.0 if moe is None else 1 - moe.moe_layers / moe.L   # an average layer
    if moe is not None:
        ffn = moe.ffn
    out += [(tokens, gate * ffn / t, h, dense, "linear"), (tokens, h, ffn / t, dense, "linear")]
    if moe is None:
        return out
    share, w = moe.moe_layers / moe.L, moe.expert_ffn / t
    routed = tokens * moe.k * e / moe.E               # tokens each expert on this GPU takes
    experts = share * moe.E / e
    out += [(routed, 2 * w, h, experts, "linear"), (routed, h, w, experts, "linear"),
            (tokens, 2 * w, h, share * moe.shared, "linear"),     # shared experts
            (tokens, h, w, share * moe.shared, "linear"),
            (tokens, moe.E, h, share, "linear")]                  # the router
    return out


# FP8 inputs are made by separate kernels: DeepSeek-V3 §3.5.2 ("we need to read 128 BF16
# activation values (the output of the previous computation) from HBM for quantization, and
# the quantized FP8 values are then written back to HBM, only to be read again for MMA"):
# 2 bytes read and 1 written per element of each FP8 GEMM's activation input, beyond the
# GEMM's own read. In the backward the output gradient is quantized for the input-gradient
# GEMM, and the activation again, as 128x1 tiles, for the weight gradient (§3.3.4).
QUANTIZE_BYTES = 2 + 1



# Tensorwise scaling (torchao's Float8Linear, as torchtitan's Float8 runs it): one scale per
# tensor from its amax, so the whole tensor is read once for the amax (2 bytes per BF16
# element) before a second pass can scale it, reading it again (2) and writing FP8 (1), and,
# fused into that pass by torch.compile, the transposed FP8 copy (1) that the backward's
# GEMMs take (Hopper's FP8 MMA reads both operands K-major; torchao's float8 mm makes the
# copy): 6 bytes per element of the input, the weight (gathered whole by FSDP, cast per
# micro-batch) and the output gradient of every FP8 GEMM. The weights are cast in full
# precision: the all-gather stays BF16 unless FSDP's float8 all-gather is on (torchtitan's
# default is off). A recompute repeats the forward's cast pass over input and weight (3),
# not the amax, taken as saved: a scalar per tensor (torchtitan PR #701 proposes adding
# max and abs to its op policy's saved ops for this; an assumption, worth 2 bytes a
# recomputed element).
TENSORWISE_CAST_BYTES = 2 + 2 + 1 + 1
TENSORWISE_RECAST_BYTES = 2 + 1
# Transformer Engine's delayed scaling (Megatron-LM's FP8; TE's modules, checked in its
# pytorch/module/{layernorm_linear,linear,base}.py of 2024): the scale comes from an amax
# history, so no pass reads a tensor for its amax. The norm before the QKV and the first
# MLP GEMMs writes FP8 itself (LayerNormLinear), leaving only the transpose the weight
# gradient takes (``fp8_transpose``: 1 read, 1 written); the inputs of the attention output
# and the MLP's second GEMM are cast with their transpose in one pass
# (``fp8_cast_transpose_fused``: 2 read, 1 + 1 written; under SP the row-parallel layers
# transpose apart, a byte more each way, not counted); so is each output gradient
# (``grad_output_preprocess``); the weights once a step, the first micro-batch's cast kept
# for the rest (``is_first_microbatch``); a recompute's casts are counted as a cast (3).
# By the order of ``layer_gemms``' linear GEMMs:
TE_INPUT_BYTES = (1 + 1, 2 + 1 + 1, 1 + 1, 2 + 1 + 1)
TE_CAST_TRANSPOSE_BYTES = 2 + 1 + 1
# Transformer Engine's current scaling ("te-current", Float8CurrentScaling: Megatron-Bridge's
# "fp8_cs", NVIDIA's H100 benchmark recipe): the scale comes from the tensor's own amax, as
# torchao's does, but inside TE's modules (checked in its pytorch/csrc of 2025). Its
# quantizer reads the whole tensor for the amax before the cast and its transpose
# (``Float8CurrentScalingQuantizer::quantize_impl``: nvte_compute_amax, then the cast): the
# inputs of the attention output and the MLP's second GEMM, and every output gradient,
# 2 + 2 + 1 + 1 bytes an element. A norm cannot write FP8 before it knows the amax: it writes
# its BF16 output and takes the amax on the way (``FUSED_NORM_AMAX_FP8`` in
# normalization.cpp), then ``quantize_with_amax`` reads it once (2) and writes FP8 and its
# transpose (1 + 1). The weights are cast once a step, as under delayed scaling: TE keeps
# the first micro-batch's cast for any quantizer (``get_weight_workspace`` with
# ``is_first_microbatch``), amax and cast and transpose, 6 bytes an element. A recompute
# repeats each input's forward cast, its amax pass included where the norm does not take it.
TE_CURRENT_INPUT_BYTES = (2 + 1 + 1, 2 + 2 + 1 + 1, 2 + 1 + 1, 2 + 2 + 1 + 1)
TE_CURRENT_RECAST_BYTES = (2 + 1, 2 + 2 + 1, 2 + 1, 2 + 2 + 1)
# Transformer Engine's two recipes by the order of ``layer_gemms``' linear GEMMs: bytes per
# input element, per input element a recompute casts again, and per element of a cast with
# its transpose (an output gradient, a weight once a step, any GEMM past the four).
TE_RECIPES = {"te": (TE_INPUT_BYTES, (0, TENSORWISE_RECAST_BYTES, 0, TENSORWISE_RECAST_BYTES),
                     TE_CAST_TRANSPOSE_BYTES),
              "te-current": (TE_CURRENT_INPUT_BYTES, TE_CURRENT_RECAST_BYTES,
                             TENSORWISE_CAST_BYTES)}
FP8_SCALINGS = ("blockwise", "tensorwise", "te", "te-current")


@lru_cache(maxsize=1024)
def fp8_quantization_bytes(model, b, t=1, c=1, e=1, scaling="blockwise", recompute=False,
                           microbatches=1):
    """HBM bytes one layer's FP8 cast kernels move on one GPU, forward and backward.

    "blockwise" (DeepSeek-V3's tiles): the linear GEMMs' activation inputs (m x k) twice,
    their output gradients (m x n) once, 3 bytes each. "tensorwise" (torchao): input, weight
    (k x n) and output gradient once, 6 bytes each, and input and weight again at 3 bytes
    when the layer is recomputed. "te" (Transformer Engine, above): ``TE_INPUT_BYTES`` per
    input element, 4 per output-gradient element, 4 per weight element once in
    ``microbatches``, and a recompute casting the two inputs no norm writes again.
    "te-current" (TE's current scaling): ``TE_CURRENT_INPUT_BYTES`` per input element, 6 per
    output-gradient element, 6 per weight element once in ``microbatches``, a recompute
    ``TE_CURRENT_RECAST_BYTES``."""
    linear = [(m, n, k, count) for m, n, k, count, kind in layer_gemms(model, b, t, c, e)
              if kind == "linear"]
    if scaling == "blockwise":
        return QUANTIZE_BYTES * sum(count * (2 * m * k + m * n) for m, n, k, count in linear)
    if scaling in TE_RECIPES:   # QKV, attention output, the MLP's first and second; the router
        inputs, recasts, cast = TE_RECIPES[scaling]
        extra = len(linear) - 4
        inputs += (cast,) * extra
        again = recasts + (recasts[1],) * extra if recompute else (0,) * len(linear)
        return sum(count * ((x + y) * m * k + cast * (m * n + k * n / microbatches))
                   for (m, n, k, count), x, y in zip(linear, inputs, again))
    again = TENSORWISE_RECAST_BYTES if recompute else 0
    return sum(count * (TENSORWISE_CAST_BYTES * (m * k + k * n + m * n)
                        + again * (m * k + k * n)) for m, n, k, count in linear)


@lru_cache(maxsize=4096)   # the planner prices the same layer shapes many times
def layer_gemm_time_s(model, b, gpu, t=1, c=1, e=1, precision="bf16", kinds=("linear",
                                                                            "attention")):
    """Seconds of one layer's forward GEMMs of ``kinds`` on one GPU; linear GEMMs at
    ``precision``, the attention score products always in BF16."""
    fused = not model.legacy          # today's attention: one fused kernel, its own rate
    total = fused_attention_s(model, b, gpu, t, c)[0] if fused and "attention" in kinds else 0.0
    for m, n, k, count, kind in layer_gemms(model, b, t, c, e):
        if kind not in kinds or (fused and kind == "attention"):
            continue
        total += count * gemm_time_s(gpu, m, n, k, precision if kind == "linear" else "bf16",
                                     batch=count)
    return total
