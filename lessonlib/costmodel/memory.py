"""Where a GPU's memory goes during training: weights, gradients, optimizer state, activations.

Model state. Mixed-precision Adam keeps 16 bytes per parameter: 2 for the 16-bit weights,
2 for the 16-bit gradients, 12 for the fp32 master weights, momentum and variance (ZeRO,
Rajbhandari et al. 2020, §3.1). Tensor and pipeline parallelism split the parameters over
t*p GPUs; ZeRO stage 1, 2, 3 additionally shards the optimizer state, then the gradients,
then the weights over the d data-parallel replicas.

Activations. Korthikanti et al. 2022 (Table 2) count the bytes one transformer layer keeps
for the backward pass, in 16-bit, for a micro-batch of b sequences:

    no parallelism               s*b*h*(34 + 5*a*s/h)
    tensor parallel (TP)         s*b*h*(10 + 24/t + 5*a*s/(h*t))
    TP + sequence parallel (SP)  s*b*h*(34 + 5*a*s/h) / t
    TP + selective recompute     s*b*h*(10 + 24/t)          (SP: s*b*h*34/t)
    full recompute               2*s*b*h                    (only each layer's input)

The course's own layer (``lessonlib.models.Block``) keeps less, and the exact count is
``course_layer_activation_bytes``, measured to the byte by ``lessonlib.instruments.activations``; per
rank, with s_r = s/t rows under SP (else s) and e bytes per element (CPU, float32/64):

    none       e * (4*b*s_r*h + 4*b*s_r + 12*b*s*h/t + b*a*s/t)
    selective  e * (4*b*s_r*h + 4*b*s_r + 12*b*s*h/t)
    full       e * b*s_r*h                  (the layer's input, kept by the checkpoint)

``course_vs_table2`` lists the terms beside Korthikanti's, with why each differs.

Under 1F1B the first stage holds min(p, m) micro-batches of its L/p layers: about L layers'
worth, whatever p is (Korthikanti et al. 2022, Eq. 5); interleaving with v chunks multiplies
that by 1 + (p-1)/(p*v). GPipe holds all m micro-batches.

Run ``python -m lessonlib.costmodel --model gpt3-175B --t 8 --p 12 --d 4 --microbatch 1
--global-batch 1536`` to see the split for one layout.
"""
import math
from dataclasses import dataclass
from functools import lru_cache

from .bubble import stashed_microbatches

# ZeRO (Rajbhandari et al. 2020), §3.1: bytes per parameter of mixed-precision Adam.
WEIGHT_BYTES = 2  # 16-bit weights
GRAD_BYTES = 2  # 16-bit gradients
OPTIMIZER_BYTES = 12  # fp32 master weights + momentum + variance, 4 bytes each
BYTES_PER_PARAM = WEIGHT_BYTES + GRAD_BYTES + OPTIMIZER_BYTES  # 16
# Share of a GPU's memory a training job can use; the CUDA context, NCCL buffers and
# allocator fragmentation take the rest. Every "fits" of the cost model compares with it.
USABLE_MEMORY_FRACTION = 0.9

# "op": torchtitan's op-level selective checkpointing (``kernels.op_recompute_share``);
# "norm-up": DeepSeek-V3's, the norms, MLA's up-projections and SwiGLU's output recomputed
# (``kernels.norm_up_recompute_share``).
RECOMPUTE_MODES = ("none", "selective", "full", "op", "norm-up")


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes on the busiest GPU (the first pipeline stage), by part."""

    weights: float
    gradients: float
    optimizer: float
    activations: float

    @property
    def model_state(self):
        return self.weights + self.gradients + self.optimizer

    @property
    def total(self):
        return self.model_state + self.activations

    def as_dict(self):
        return {"weights": self.weights, "gradients": self.gradients,
                "optimizer": self.optimizer, "activations": self.activations,
                "total": self.total}


def model_state_bytes(n_params, zero_stage=0, d=1):
    """(weights, gradients, optimizer) bytes per GPU for ``n_params`` parameters on it.

    ZeRO (Rajbhandari et al. 2020), Figure 1: stage 1 -> 4P + 12P/d, stage 2 -> 2P + 14P/d,
    stage 3 -> 16P/d.
    """
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage={zero_stage!r} must be 0, 1, 2 or 3")
    weights = WEIGHT_BYTES * n_params / (d if zero_stage >= 3 else 1)
    grads = GRAD_BYTES * n_params / (d if zero_stage >= 2 else 1)
    optimizer = OPTIMIZER_BYTES * n_params / (d if zero_stage >= 1 else 1)
    return weights, grads, optimizer


def layers_per_stage(L, p, uneven=False):
    """Layers on the first stage: ceil(L/p) (the first stages take one more when p does not
    divide L), or with ``uneven`` (first and last stage one layer lighter, Llama 3 §3.3.2;
    torchtitan's ``pipeline_parallel_first/last_stage_less_layers``) (L + 2)/p - 1."""
    if uneven and p > 1:
        return (L + 2) // p - 1
    return math.ceil(L / p)


def stage_copies(schedule):
    """Stages one GPU holds: two under DualPipe (DeepSeek-V3 Table 2, 2x parameters)."""
    return 2 if schedule == "dualpipe" else 1


@lru_cache(maxsize=4096, typed=True)   # the planner asks the same few stages per layout
def stage_params(model, t, p, e=1, uneven=False, schedule="1f1b"):
    """Parameters on one GPU of the first stage: its layers and the embeddings, split by t.

    The token embedding is split over t (vocabulary-parallel, Megatron-LM 2019 §3); the
    position embedding is replicated. The last stage holds a copy of the token embedding for
    the tied output layer (an untied one as large), and fewer layers when p does not divide
    L, so it is never larger. An MoE model's routed experts are split over e GPUs (and, like
    every weight here, over t); every stage is counted as MoE layers. ``uneven``: the first
    stage one layer lighter; DualPipe holds two stages' layers.
    """
    layers = layers_per_stage(model.L, p, uneven) * stage_copies(schedule) * \
        model.layer_params(e)
    positions = model.s * model.h if model.tied_embeddings and model.moe is None else 0
    return (layers + model.V * model.h) / t + positions


@lru_cache(maxsize=4096, typed=True)
def stage_expert_params(model, t, p, e=1, uneven=False, schedule="1f1b"):
    """The part of ``stage_params`` that is routed experts (0 for a dense model)."""
    if model.moe is None:
        return 0
    layers = layers_per_stage(model.L, p, uneven) * stage_copies(schedule)
    return layers * (model.layer_params(e) - model.layer_dense_params()) / t


def activation_bytes_per_layer(model, b, t=1, sequence_parallel=False, recompute="none"):
    """Bytes one layer keeps for backward, per micro-batch: Korthikanti et al. 2022, Table 2,
    for Megatron-LM 2021's GPT layer; for today's layers (``model.legacy`` False) the same
    count made tensor by tensor for their own layer (``swiglu_layer_activation_bytes``)."""
    if recompute not in RECOMPUTE_MODES:
        raise ValueError(f"recompute={recompute!r} must be one of {', '.join(RECOMPUTE_MODES)}")
    s, h, a = model.s, model.h, model.a
    sbh = s * b * h
    if recompute == "full":
        return 2 * sbh
    if not model.legacy:
        return swiglu_layer_activation_bytes(model, b, t, sequence_parallel, recompute)
    # softmax input/output and dropout mask: grows with s^2
    attention = 5 * a * s / h
    if sequence_parallel:
        return sbh * 34 / t if recompute == "selective" else sbh * (34 + attention) / t
    if recompute in ("selective", "op"):
        return sbh * (10 + 24 / t)
    return sbh * (10 + 24 / t + attention / t)


def swiglu_layer_activation_bytes(model, b, t=1, sequence_parallel=False, recompute="none"):
    """Korthikanti's method (Table 2: every tensor a layer's backward reads, 2 bytes per
    element) applied to a pre-norm layer with RMSNorm, grouped-query attention in one fused
    kernel, and a SwiGLU MLP (Llama 3; an MoE layer's average token is counted as a dense
    SwiGLU of the model's ``ffn`` width, an approximation), per token in elements:

        RMSNorm inputs and outputs (inputs of QKV and of w1, w3)      4 h   (split by SP)
        Q, K, V as the attention kernel saves them                    q + 2 kv
        the kernel's output (= the output projection's input)         h
        w1 x (SiLU's input), SiLU(w1 x), w3 x, their product (w2's)   4 ffn

    No dropout, and the fused kernel keeps no s x s scores (a log-sum-exp per head and
    query, left out). Selective recompute saves nothing more here: the kernel already
    recomputes its scores. ``recompute="op"`` (torchtitan): the layer's input and the saved
    matmul and attention outputs: wq x, wv x, the kernel's output, w1 x and w2's output.
    ``recompute="norm-up"`` (DeepSeek-V3): "We recompute all RMSNorm operations and MLA
    up-projections during back-propagation, thereby eliminating the need to persistently
    store their output activations" (§3.2.3), and "we cache the inputs of the SwiGLU operator
    and recompute its output in the backward pass" (§3.3.4): the norms' inputs, MLA's latents
    in place of Q, K and V (``mla_latents``; Q, K, V for a model without MLA), the kernel's
    output, and w1 x and w3 x. Counted at 2 bytes, though §3.3.4 caches the SwiGLU inputs
    and other linear inputs in FP8: an upper bound."""
    qk_dim, v_dim = model.qk_v_head_dims()
    h, q = model.h, model.a * qk_dim
    kv = (model.kv_heads or model.a) * (qk_dim + v_dim) / 2
    ffn = (model.ffn or 4 * h) if model.moe is None else model.moe.ffn
    rows = b * model.s
    norms = (rows * h / t) if sequence_parallel else rows * h
    if recompute == "op":
        return 2 * (norms + rows * (q + kv + h + ffn + h) / t)
    if recompute == "norm-up":
        latents = sum(model.mla_latents) if model.mla_latents else q + 2 * kv
        return 2 * (2 * norms + rows * (latents + h + 2 * ffn) / t)
    return 2 * (4 * norms + rows * (q + 2 * kv + h + 4 * ffn) / t)


def course_layer_activation_bytes(b, s, h, a, t=1, sequence_parallel=False,
                                  recompute="none", element_size=8):
    """Bytes one ``lessonlib.models.Block`` keeps for backward on one rank, exactly.

    Per rank, s_r = s/t sequence rows under SP (else s): each LayerNorm keeps its input
    (b*s_r*h) and its mean and 1/std (2*b*s_r); the column layers (QKV, fc1) keep their
    input (b*s_r*h each: under SP only this rank's rows, gathered again in backward); Q, K,
    V (3*b*s*h/t); the attention output, which is the projection's input (b*s*h/t); GeLU's
    input and output, the fc1 output and fc2 input (4*b*s*h/t each); CPU's fused attention
    kernel keeps one log-sum-exp per head and query (b*a*s/t), never the s x s matrix.
    Selective recompute drops that last term, full recompute keeps only the layer input.
    Exact for CPU ranks in float32/float64; a GPU's fused attention kernels keep other
    small tensors (a float32 log-sum-exp, random-number state), so there it is close, not
    exact."""
    if recompute not in RECOMPUTE_MODES:
        raise ValueError(f"recompute={recompute!r} must be one of {', '.join(RECOMPUTE_MODES)}")
    rows = s // t if sequence_parallel else s
    if recompute == "full":
        return element_size * b * rows * h
    replicated = 4 * b * rows * h + 4 * b * rows             # LN inputs, stats, LN outputs
    split = 12 * b * s * h // t                               # Q, K, V, attn out, 4h twice
    core = b * a * s // t if recompute == "none" else 0       # the kernel's log-sum-exp
    return element_size * (replicated + split + core)


def course_vs_table2():
    """Korthikanti et al. 2022's bytes per layer (16-bit, Table 2, in units of s*b*h
    unless said) beside the course layer's elements, term by term, with why they differ."""
    return [
        {"term": "LayerNorm inputs", "table2": "4", "course": "2 sbh + 4 sb",
         "why": "the course also counts each LayerNorm's mean and 1/std (2 per row)"},
        {"term": "QKV and fc1 inputs (LayerNorm outputs)", "table2": "4", "course": "2 sbh",
         "why": "same tensors; elements here, bytes at 2 per element there"},
        {"term": "Q, K, V", "table2": "6", "course": "3 sbh", "why": "same"},
        {"term": "softmax output, its dropout mask and output", "table2": "5as/h",
         "course": "a·b·s", "why": "CPU's fused attention kernel keeps only a log-sum-exp per "
         "row and recomputes the s x s matrix in backward: selective recompute inside the "
         "kernel; the course has no dropout"},
        {"term": "attention output (projection input)", "table2": "2", "course": "1 sbh",
         "why": "the kernel's output and the projection's input are one storage"},
        {"term": "fc1 output (GeLU input) and fc2 input", "table2": "16", "course": "8 sbh",
         "why": "same tensors"},
        {"term": "dropout masks after attention and MLP", "table2": "2", "course": "0",
         "why": "the course layer has no dropout"},
    ]


def in_flight_microbatches(schedule, p, m, v=1, stage=0):
    """Micro-batches' worth of activations ``stage`` holds at its peak.

    ``stashed_microbatches`` (1F1B: min(p - stage, m), GPipe: m), times
    1 + (p-1)/(p*v) for interleaved 1F1B (Korthikanti et al. 2022, Eq. 5).
    """
    held = stashed_microbatches(schedule, p, m, stage)
    if schedule == "1f1b" and v > 1:
        held *= 1 + (p - 1) / (p * v)
    return held


def activation_bytes(model, t, p, b, m, v=1, recompute="full", sequence_parallel=False,
                     schedule="1f1b", uneven=False):
    """Activation bytes on a GPU of the busiest stage (the first; ZBV: the last) at its peak.

    With full recompute the backward of one layer rebuilds that layer's activations, so one
    layer's worth (without recompute) is added as working memory.
    """
    per_layer = activation_bytes_per_layer(model, b, t, sequence_parallel, recompute)
    busiest = p - 1 if schedule == "zbv" else 0          # ZBV: the bottom of the V
    stored = per_layer * layers_per_stage(model.L, p, uneven) * in_flight_microbatches(
        schedule, p, m, v, busiest)
    if recompute == "full":
        stored += activation_bytes_per_layer(model, b, t, sequence_parallel, "none")
    return stored


def memory_per_gpu(model, t=1, p=1, d=1, b=1, m=1, v=1, recompute="full",
                   sequence_parallel=False, zero_stage=0, schedule="1f1b", c=1, e=1,
                   shard=None, uneven=False):
    """MemoryBreakdown of the busiest GPU for a (t, c, p, d, e) layout and micro-batching
    (b, m).

    Context parallelism divides the activations by c (each rank keeps s/c tokens); its c
    ranks hold the same weights, so ZeRO/FSDP shards the state over ``shard`` x c GPUs
    (``shard``: the shard group inside d, default d; HSDP replicates across the d/shard
    groups). An expert's weights have shard x c / e copies to shard over. ``uneven``: first
    and last stage one layer lighter; DualPipe (``schedule``) holds two stages.
    """
    shard = (d if shard is None else shard) * c
    experts = stage_expert_params(model, t, p, e, uneven, schedule)
    dense = model_state_bytes(stage_params(model, t, p, e, uneven, schedule) - experts,
                              zero_stage, shard)
    if experts:
        moe = model_state_bytes(experts, zero_stage, max(1, shard // e))
        dense = tuple(x + y for x, y in zip(dense, moe))
    acts = activation_bytes(model, t, p, b, m, v, recompute, sequence_parallel, schedule,
                            uneven) / c
    return MemoryBreakdown(*dense, acts)
