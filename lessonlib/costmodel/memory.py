"""Where a GPU's memory goes during training: everything resident on the busiest GPU, by part.

Model state. Mixed-precision Adam keeps 16 bytes per parameter: 2 for the 16-bit weights,
2 for the 16-bit gradients, 12 for the fp32 master weights, momentum and variance (ZeRO,
Rajbhandari et al. 2020, §3.1); gradients may accumulate in fp32 and the moments be kept in
bf16 (settings). Tensor and pipeline parallelism split the parameters over t*p GPUs; ZeRO
stage 1, 2, 3 additionally shards the optimizer state, then the gradients, then the weights
over the d data-parallel replicas (Llama 3's FSDP holds what stage 2 holds).

Activations. What one layer keeps for its backward is a formula per layer family, measured
to the byte on a real layer of that family (``layer_bytes``: GPT's is Korthikanti et al.
2022's Table 2, s*b*h*(34 + 5*a*s/h), plus the norms' statistics; Llama's, Nemotron's and
DeepSeek-V3's are their own), split by TP and SP, with the recompute modes none, selective,
full (the layer's input, 1/t under SP), torchtitan's op-level and DeepSeek-V3's. Under 1F1B
the first stage holds min(p, m) micro-batches of its L/p layers: about L layers' worth,
whatever p is (Korthikanti et al. 2022, Eq. 5); interleaving with v chunks multiplies that
by 1 + (p-1)/(p*v); GPipe holds all m, DualPipe PP + 1 (DeepSeek-V3 Table 2) of a stage's
layers, on ranks that each hold two stages (``dualpipe_blocks``: the rank with both ends of the
model also holds the embedding and the output head, §3.2.3). DeepSeek-V3's exponential moving
average of the weights is not counted: "The EMA parameters are stored in CPU memory" (§3.2.3).

Then the output layer on its stage (``logits``: the final norm's and the head's inputs and the
loss's float32 peak, ``layer_bytes.output_layer_bytes``), and the
working set that comes and goes (``working``): a recomputed layer, FSDP's gathered weights
and unsharded gradients, all-gather CP's K/V. What the job cannot use is named, not a share:
``memory_reserves``. The course's own tiny layer (``lessonlib.models.Block``) has its exact
count in ``course_layer_activation_bytes`` (float32/64 on CPU, lesson 14), and
``course_vs_table2`` sets its terms beside Korthikanti's.

One job: the bytes of every part resident on a GPU for one layout; its length is the parts'
number, each with its source.

Run ``python -m lessonlib.costmodel --model gpt3-175B --t 8 --p 12 --d 4 --microbatch 1
--global-batch 1536`` to see the split for one layout, ``--published`` for the memory rows.
"""
import math
from dataclasses import dataclass
from functools import lru_cache

from . import layer_bytes as lb
from .bubble import stashed_microbatches

# ZeRO (Rajbhandari et al. 2020), §3.1: bytes per parameter of mixed-precision Adam.
WEIGHT_BYTES = 2  # 16-bit weights
GRAD_BYTES = 2  # 16-bit gradients
OPTIMIZER_BYTES = 12  # fp32 master weights + momentum + variance, 4 bytes each
BYTES_PER_PARAM = WEIGHT_BYTES + GRAD_BYTES + OPTIMIZER_BYTES  # 16
# What a job cannot use of a GPU's memory, by name (every "fits" compares with the rest):
# the CUDA context with PyTorch's kernels loaded, an estimate here, not a measurement
# (``labs/gpu_check.py`` can measure it where a GPU is present); NCCL's buffers, per
# communicator NCCL_BUFFSIZE (4 MiB by default, NCCL's environment-variable documentation)
# for each of 32 channels (NCCL_MAX_NCHANNELS) in each direction; allocator fragmentation, 0:
# not modelled (torchtitan's published GiB are the caching allocator's reserved bytes, which
# include it, so there the model's allocated bytes are compared with reserved ones).
CUDA_CONTEXT_BYTES = 512 * 2**20
NCCL_BUFFSIZE = 4 * 2**20
NCCL_CHANNELS = 32
FRAGMENTATION_BYTES = 0


def memory_reserves(communicators=1):
    """Named bytes a job cannot use, for ``communicators`` NCCL groups (one per parallel
    axis in use)."""
    return {"cuda_context": CUDA_CONTEXT_BYTES,
            "nccl_buffers": communicators * NCCL_CHANNELS * 2 * NCCL_BUFFSIZE,
            "fragmentation": FRAGMENTATION_BYTES}


def usable_memory_bytes(gpu, communicators=1):
    """A GPU's memory as it reports it, less ``memory_reserves``."""
    return gpu.memory_bytes - sum(memory_reserves(communicators).values())

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
    logits: float = 0.0     # the output layer's inputs and the loss's float32 peak
    working: float = 0.0    # transient: a recomputed layer, gathered weights and gradients, K/V

    @property
    def model_state(self):
        return self.weights + self.gradients + self.optimizer

    @property
    def total(self):
        return self.model_state + self.activations + self.logits + self.working

    def as_dict(self):
        return {"weights": self.weights, "gradients": self.gradients,
                "optimizer": self.optimizer, "activations": self.activations,
                "logits": self.logits, "working": self.working, "total": self.total}


def model_state_bytes(n_params, zero_stage=0, d=1, grad_bytes=GRAD_BYTES,
                      optimizer_bytes=OPTIMIZER_BYTES):
    """(weights, gradients, optimizer) bytes per GPU for ``n_params`` parameters on it.

    ZeRO (Rajbhandari et al. 2020), Figure 1: stage 1 -> 4P + 12P/d, stage 2 -> 2P + 14P/d,
    stage 3 -> 16P/d. ``grad_bytes``: 2 for bf16 gradients, 4 where they accumulate in fp32
    (BLOOM's "BF16 optimizer ... accumulates gradients in fp32"; Megatron's
    ``--accumulate-allreduce-grads-in-fp32``). Llama 3's FSDP (§3.3.2: optimizer state and
    gradients sharded, the weights not resharded after the forward) holds what stage 2 holds.
    ``optimizer_bytes``: 12 (fp32 master, momentum, variance), 8 with the moments in bf16
    (DeepSeek-V3 §3.3.3, "Low-Precision Optimizer States": "We adopt the BF16 data format
    instead of FP32 to track the first and second moments in the AdamW optimizer", while "the
    master weights (stored by the optimizer) and gradients (used for batch size accumulation)
    are still retained in FP32").
    """
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage={zero_stage!r} must be 0, 1, 2 or 3")
    weights = WEIGHT_BYTES * n_params / (d if zero_stage >= 3 else 1)
    grads = grad_bytes * n_params / (d if zero_stage >= 2 else 1)
    optimizer = optimizer_bytes * n_params / (d if zero_stage >= 1 else 1)
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
    positions = model.s * model.h if model.keeps_position_table else 0
    return (layers + model.V * model.h) / t + positions


@lru_cache(maxsize=4096, typed=True)
def stage_expert_params(model, t, p, e=1, uneven=False, schedule="1f1b"):
    """The part of ``stage_params`` that is routed experts (0 for a dense model)."""
    if model.moe is None:
        return 0
    layers = layers_per_stage(model.L, p, uneven) * stage_copies(schedule)
    return layers * (model.layer_params(e) - model.layer_dense_params()) / t


def activation_bytes_per_layer(model, b, t=1, sequence_parallel=False, recompute="none",
                               fused=True, fp8=False, gathered=False):
    """Bytes one layer keeps for backward, per micro-batch, on one of t ranks: the formula
    measured on that family's layer (``layer_bytes``): Megatron-LM's GPT layer with its
    unfused softmax (Korthikanti et al. 2022's Table 2 plus the norms' statistics), a Llama
    or Nemotron layer (``model.mlp``), DeepSeek-V3's MLA + MoE (every layer counted as MoE).
    ``fused``: SwiGLU as one kernel (Megatron's; torch.compile's), else eager's four tensors;
    ``fp8``: DeepSeek-V3's FP8 caching of the MoE's inputs (``layer_bytes.moe_bytes``);
    ``gathered``: PyTorch's SP plan, the column layers' gathered inputs kept."""
    if recompute not in RECOMPUTE_MODES:
        raise ValueError(f"recompute={recompute!r} must be one of {', '.join(RECOMPUTE_MODES)}")
    s, h, a = model.s, model.h, model.a
    if model.legacy:
        return lb.gpt_layer_bytes(s, b, h, a, t, sequence_parallel, recompute)
    if recompute == "full":
        return lb.gpt_layer_bytes(s, b, h, a, t, sequence_parallel, "full")
    if model.mla_latents and model.moe is not None:
        qk, v = model.qk_v_head_dims()
        q_latent, kv_latent, rope = model.mla_latents
        moe = model.moe       # measured without TP (DeepSeek-V3 ran none): t > 1 divides all
        return (lb.mla_bytes(s, b, h, a, q_latent, kv_latent, qk, v, rope, recompute, fp8)
                + lb.moe_bytes(s, b, h, moe.E, moe.k, moe.expert_ffn, moe.shared, recompute,
                               fused, fp8)) / t
    # an MoE without MLA: its k routed experts counted as one SwiGLU k times as wide
    ffn = model.ffn if model.moe is None else model.moe.k * model.moe.expert_ffn
    return lb.llama_layer_bytes(s, b, h, a, model.kv_heads or a, ffn, t, sequence_parallel,
                                "none" if recompute in ("selective", "norm-up") else recompute,
                                model.mlp, fused, gathered and t > 1)


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


@dataclass(frozen=True)
class Table2Term:
    """One term of Korthikanti et al.'s Table 2 beside the course layer's: its name, Table
    2's bytes (x sbh unless said), the course's elements, and why they differ."""
    term: str
    table2: str
    course: str
    why: str


def course_vs_table2() -> list[Table2Term]:
    """Korthikanti et al. 2022's bytes per layer (16-bit, Table 2, in units of s*b*h
    unless said) beside the course layer's elements, term by term, with why they differ."""
    return [
        Table2Term(term="LayerNorm inputs", table2="4", course="2 sbh + 4 sb",
                   why="the course also counts each LayerNorm's mean and 1/std (2 per row)"),
        Table2Term(term="QKV and fc1 inputs (LayerNorm outputs)", table2="4", course="2 sbh",
                   why="same tensors; elements here, bytes at 2 per element there"),
        Table2Term(term="Q, K, V", table2="6", course="3 sbh", why="same"),
        Table2Term(term="softmax output, its dropout mask and output", table2="5as/h",
                   course="a·b·s", why="CPU's fused attention kernel keeps only a "
                   "log-sum-exp per row and recomputes the s x s matrix in backward: "
                   "selective recompute inside the kernel; the course has no dropout"),
        Table2Term(term="attention output (projection input)", table2="2", course="1 sbh",
                   why="the kernel's output and the projection's input are one storage"),
        Table2Term(term="fc1 output (GeLU input) and fc2 input", table2="16", course="8 sbh",
                   why="same tensors"),
        Table2Term(term="dropout masks after attention and MLP", table2="2", course="0",
                   why="the course layer has no dropout"),
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
                     schedule="1f1b", uneven=False, fused=True, stage=None, fp8=False,
                     gathered=False):
    """Activation bytes a GPU of ``stage`` keeps at its peak: by default the busiest, the first
    (ZBV: the last, the bottom of its V). What a recomputing layer rebuilds in its backward is
    working memory, counted by ``memory_per_gpu``."""
    per_layer = activation_bytes_per_layer(model, b, t, sequence_parallel, recompute, fused,
                                           fp8, gathered)
    if stage is None:
        stage = p - 1 if schedule == "zbv" else 0
    return per_layer * layers_per_stage(model.L, p, uneven) * in_flight_microbatches(
        schedule, p, m, v, stage)


def working_bytes(model, t=1, b=1, recompute="full", sequence_parallel=False, zero_stage=0,
                  c=1, e=1, cp_comm="ring", fused=True, gathered=False):
    """Transient bytes on top of what is held, at the peak of the backward:

    * a recomputed layer's activations (``full``, ``op``), rebuilt one layer at a time;
    * ZeRO-3 / FSDP: the embedding's or output layer's gathered weights (the root unit, kept
      from forward to backward, as torchtitan's ``fully_shard(model)``) and two layers' (the
      one computing and the one prefetched, FSDP's default forward prefetch), in bf16, plus one
      unit's unsharded bf16 gradient and its float32 copy for the reduce-scatter (torchtitan's
      ``mixed_precision_reduce = "float32"``); ZeRO-2 one layer's unsharded gradient;
    * all-gather context parallelism (Llama 3 §3.3.2): one layer's K and V of the whole
      sequence, gathered in the forward and again in the backward with their gradients;
      under torchtitan's (``cp_comm="torchtitan"``) K and V of every query head.
    """
    work = 0.0
    if recompute in ("full", "op"):
        work += activation_bytes_per_layer(model, b, t, sequence_parallel, "none", fused,
                                           gathered=gathered) / c
    layer = model.layer_params(e) / t
    head = model.V * model.h / t
    if zero_stage == 3:
        work += WEIGHT_BYTES * (head + 2 * layer) + (WEIGHT_BYTES + 4) * max(head, layer)
    elif zero_stage == 2:
        work += GRAD_BYTES * layer
    if c > 1 and cp_comm in ("allgather", "torchtitan"):   # torchtitan's K/V: every head
        heads = model.a if cp_comm == "torchtitan" else model.kv_heads or model.a
        kv_dim = max(heads // t, 1) * (model.h // model.a)
        work += 4 * model.s * b * kv_dim * WEIGHT_BYTES
    return work


def dualpipe_blocks(model, p):
    """Blocks (layers and multi-token-prediction modules) on two DualPipe ranks: (the rank with
    both ends of the model, a middle rank). Rank i holds stages i and p-1-i (DeepSeek-V3
    §3.2.1: "DualPipe requires keeping two copies of the model parameters"); the L + mtp
    blocks fill p stages of ceil((L + mtp)/p), and the slots left over go to the two end
    stages, which also hold the embedding and the output head (§3.2.3: "we deploy the
    shallowest layers (including the embedding layer) and deepest layers (including the
    output head) of the model on the same PP rank"). The report does not print its split;
    this is the course's reading (DeepSeek-V3: 62 blocks in 64 slots, 6 and 8)."""
    blocks = model.L + model.mtp
    per = -(-blocks // p)
    return 2 * per - min(per * p - blocks, 2), 2 * per


def _dualpipe_params(model, t, p, e, end):
    """(parameters, routed-expert parameters) on a DualPipe rank: its blocks, and on the end
    rank the embedding, the output head (a second matrix when untied) and each MTP module's
    projection (h x 2h, §2.2), which shares the embedding and the head with the main model
    (§3.2.3: "This arrangement enables the physical sharing of parameters and gradients, of
    the shared embedding and output head, between the MTP module and the main model").
    Both stages' parameters count in full, as §3.2.1 says they are kept: "this does not
    significantly increase the memory consumption since we use a large EP size during
    training" (the routed experts, most of a layer, are split e ways)."""
    blocks = dualpipe_blocks(model, p)[0 if end else 1]
    experts = 0 if model.moe is None else blocks * (model.layer_params(e)
                                                     - model.layer_dense_params())
    ends = 0
    if end:
        ends = (1 if model.tied_embeddings else 2) * model.V * model.h \
            + model.mtp * 2 * model.h * model.h
    return (blocks * model.layer_params(e) + ends) / t, experts / t


def memory_per_gpu(model, t=1, p=1, d=1, b=1, m=1, v=1, recompute="full",
                   sequence_parallel=False, zero_stage=0, schedule="1f1b", c=1, e=1,
                   shard=None, uneven=False, grad_bytes=GRAD_BYTES, fused=True,
                   cp_comm="ring", fp8=False, optimizer_bytes=OPTIMIZER_BYTES,
                   gathered=False, loss="eager"):
    """MemoryBreakdown of the busiest GPU for a (t, c, p, d, e) layout and micro-batching
    (b, m): the first pipeline stage (most micro-batches in flight) or the last (the
    output layer, ``layer_bytes.output_layer_bytes``), whichever holds more; one GPU holds
    both when p = 1. Under DualPipe the busier of the rank with both ends of the model and
    a middle one (``dualpipe_blocks``).

    Context parallelism divides the activations by c (each rank keeps s/c tokens); its c
    ranks hold the same weights, so ZeRO/FSDP shards the state over ``shard`` x c GPUs
    (``shard``: the shard group inside d, default d; HSDP replicates across the d/shard
    groups). An expert's weights have shard x c / e copies to shard over. ``uneven``: first
    and last stage one layer lighter. The output layer is vocabulary-parallel over t
    (Megatron-LM's; torchtitan's ``loss_parallel``, ``gathered``).
    """
    shard = (d if shard is None else shard) * c

    def state(params, experts):
        dense = model_state_bytes(params - experts, zero_stage, shard, grad_bytes,
                                  optimizer_bytes)
        if experts:
            moe = model_state_bytes(experts, zero_stage, max(1, shard // e), grad_bytes,
                                    optimizer_bytes)
            dense = tuple(x + y for x, y in zip(dense, moe))
        if zero_stage == 3 and p > 1 and m > 1:
            # FSDP under a pipeline (torchtitan): the stage's weights are not resharded after
            # the forward (no all-gather per micro-batch) and its gradients accumulate
            # unsharded, in the float32 of the reduce-scatter, until the last micro-batch's
            # backward.
            dense = (dense[0] + WEIGHT_BYTES * params, dense[1] + 4 * params, dense[2])
        return dense

    work = working_bytes(model, t, b, recompute, sequence_parallel, zero_stage, c, e,
                         cp_comm, fused, gathered)
    output = lb.output_layer_bytes(model.s / c, b, model.h, model.V, t, sequence_parallel,
                                   1 + model.mtp, gathered, model.legacy, loss)
    if schedule == "dualpipe":
        per_layer = activation_bytes_per_layer(model, b, t, sequence_parallel, recompute,
                                               fused, fp8, gathered) / c
        held = in_flight_microbatches(schedule, p, m)     # PP + 1 stage-micro-batches
        ranks = []              # at p = 2 both ranks hold both ends: no middle rank
        for end, blocks in list(zip((True, False), dualpipe_blocks(model, p)))[:1 + (p > 2)]:
            ranks.append(MemoryBreakdown(*state(*_dualpipe_params(model, t, p, e, end)),
                                         per_layer * blocks / 2 * held,
                                         output if end else 0.0, work))
        return max(ranks, key=lambda mem: mem.total)
    experts = stage_expert_params(model, t, p, e, uneven, schedule)
    dense = state(stage_params(model, t, p, e, uneven, schedule), experts)

    def stage_memory(stage, logits):
        acts = activation_bytes(model, t, p, b, m, v, recompute, sequence_parallel,
                                schedule, uneven, fused, stage, fp8, gathered) / c
        return MemoryBreakdown(*dense, acts, logits, work)

    first = stage_memory(p - 1 if schedule == "zbv" else 0, output if p == 1 else 0.0)
    if p == 1:
        return first
    return max(first, stage_memory(0 if schedule == "zbv" else p - 1, output),
               key=lambda mem: mem.total)
