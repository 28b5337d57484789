"""A layout: how one training step is split over t*c*p*d GPUs, and what it must satisfy.

``Layout(t, c, p, d, e, b, m or global_batch, v, ...)`` in Megatron-LM 2021's notation
(Narayanan et al.): t-way tensor, p-way pipeline with v chunks per stage, d-way data
parallelism, micro-batches of b sequences, m of them per step, so the global batch is
B = b*m*d. Two axes of today: c-way context parallelism (each sequence split over c GPUs,
which share one micro-batch) and e-way expert parallelism carved from the d data-parallel
GPUs, as Megatron-Core does (an MoE model's experts split over e of them; e takes no GPUs
of its own). Sharded data parallelism is a choice on d: ``zero_stage`` 1-3 (3 is FSDP),
sharded over ``shard_group`` GPUs of d (default all d; fewer is HSDP: shard inside a group,
replicate across groups). ``overlap_comm``: FSDP's weight all-gathers prefetched (the next
unit's gather posted before this unit computes) and hidden behind the step's compute up to
its length, and the MoE all-to-alls hidden behind the stage's compute (DualPipe's overlap,
which ``schedule="dualpipe"`` implies), and the gradients' all-reduce or reduce-scatter
run bucket by bucket (DDP's buckets, FSDP's units) under the last micro-batch's backward,
else exposed (``axes.dp_time_s``). ``async_tp``: sequence parallelism's all-gathers and
reduce-scatters split into t pieces overlapping their GEMMs (torchtitan's
``enable_async_tensor_parallel``; needs ``sequence_parallel``); ``overlap.py`` says how much
each hides.

What the teams of today ran, expressible: ``uneven_stages`` (first and last pipeline stage
one layer lighter, making room for the embedding and the output layer: Llama 3 §3.3.2,
torchtitan's ``pipeline_parallel_first/last_stage_less_layers``), ``schedule="dualpipe"``
(DeepSeek-V3), ``recompute="none"`` (Llama 3 at 8K), ``cp_comm`` "ring", "allgather"
(Llama 3's) or "ulysses" (all-to-alls, c limited by the KV heads), the names of
``lessonlib.context_parallel``'s methods, or "torchtitan" (PyTorch's ``context_parallel`` as
torchtitan runs it: all-gather, c attention calls merged in float32, K and V repeated to
every query head; ``axes.cp_ring_s``), ``precision`` "bf16" or "fp8" for the linear
layers' GEMMs (DeepSeek-V3 §3.3), with ``fp8_scaling`` "blockwise" (DeepSeek-V3's 1x128 and
128x128 tiles), "tensorwise" (torchao's ``Float8Linear``, torchtitan's Float8), "te"
(Transformer Engine's delayed scaling, Megatron-LM's) or "te-current" (its current scaling,
the FP8-CS of Megatron-Bridge's H100 benchmarks), which sets the cast kernels' bytes
(``gemm.fp8_quantization_bytes``); ``attention_kernel`` (``ATTENTION_KERNELS``); and
``max_nodes``, node-limited routing (each token's experts on at most that many servers, 4
for DeepSeek-V3, §2.1.2). ``kernels``: "fused"
(Megatron's fused kernels, torch.compile) or "eager" (one kernel per elementwise op,
``kernels.py``); ``overlap_p2p``: the interleaved schedule's sends and receives posted
ahead and waited for only when needed (Megatron-Core's ``overlap_p2p_comm``), hidden but
in its warm-up and flush (``overlap.p2p_exposed_share``); ``loss``: the cross entropy
"eager" (float32 log-probabilities kept), "compiled" (torch.compile's fused kernels: the BF16
logits kept) or Megatron's, unfused or fused (``LOSSES``);
``recompute="op"``: torchtitan's op-level selective checkpointing;
``recompute="norm-up"``: DeepSeek-V3's (norms, MLA up-projections and SwiGLU's output
rebuilt in the backward, §3.2.3, §3.3.4); ``comm_sm_share``: the share of SMs given to
communication kernels, which compute nothing (DeepSeek-V3 §3.5.1: "20 out of the 132 SMs").

Rank order, innermost first: tp, cp, (ep), dp, pp: Megatron-Core's default
(parallel_state's order "tp-cp-ep-dp-pp"), Megatron-LM's since 2020 (data-parallel groups t
apart inside each pipeline stage's block of n/p ranks), DeepSpeed's pipe-data-model topology
and torchtitan's mesh (pp, dp_replicate, dp_shard, cp, tp, outermost first). So the CP ring
stays inside a server when t*c <= GPUs per server, the EP all-to-all when t*c*e fits, a
data-parallel group's members are t*c apart and a pipeline's n/p apart. Every
setting is checked when the layout is built, and ``check(model)`` checks it against a
model's shape, so a bad value fails at once with one line naming it, before any estimate.

One job: what a layout is and which ones are valid; it runs past 300 lines because each
setting's choices are listed here with their sources, beside the checks that read them.

Try ``python -c "from lessonlib.costmodel import Layout; print(Layout(t=8, p=12, d=4,
global_batch=1536).describe())"``.
"""
import math
from dataclasses import dataclass

from lessonlib.argcheck import positive_int

from .bubble import SCHEDULES
from .gemm import FP8_SCALINGS, PRECISIONS
from .kernels import KERNELS
from .memory import RECOMPUTE_MODES
from .model import MAX, divisors


# How context parallelism brings each rank the keys and values of the other c-1: a ring of
# blocks hidden behind attention (Liu et al. 2023; Megatron-Core's default, p2p), one
# all-gather of the GQA-sized K and V, exposed (Llama 3 §3.3.2; PyTorch's context_parallel,
# and so torchtitan, by default: "The default value is 'allgather'", torchtitan's
# job_config.py), or Ulysses' all-to-alls from sequence shards to head shards and back,
# exposed, c dividing the (KV) heads of a tensor-parallel rank (Jacobs et al. 2023;
# Megatron-Core's a2a); or what torchtitan runs, PyTorch's all-gather method under its model
# ("torchtitan": ``axes.cp_torchtitan_s``).
CP_COMM = ("ring", "allgather", "ulysses", "torchtitan")
# Bytes per gradient element: bf16, or fp32 accumulation (BLOOM's BF16 optimizer; Megatron's
# --accumulate-allreduce-grads-in-fp32); the same for Adam's two moments (bf16: DeepSeek-V3).
GRAD_DTYPES = {"bf16": 2, "fp32": 4}
TP_PLANS = ("megatron", "pytorch")
# Whose ZeRO-3 (``zero_stage=3``): "pytorch", FSDP2's ``fully_shard`` (torchtitan's), which
# copies each gathered unit into its parameters and each gradient into the reduce-scatter's
# input (``axes.fsdp_copies_s``); or "megatron", Megatron-Core's own FSDP (Megatron-Bridge's
# ``use_megatron_fsdp``), which gathers into a bucket its parameters are views of
# (``fetch_bucket(set_param_data=True)``: ``p.data = get_item_from_bucket(...)``) and
# accumulates the gradients in the buffer it reduce-scatters (``main_grad``): no copies.
FSDP_IMPLS = ("pytorch", "megatron")
# Which fused attention kernel runs the score products (``gemm.ATTENTION_H100_TFLOPS``):
# "fa2", FlashAttention-2, PyTorch SDPA's flash backend (torchtitan); "cudnn", cuDNN's fused
# attention, which Transformer Engine (Megatron-Core's and NeMo's layers) selects on Hopper
# ("Select FusedAttention on sm90 and FlashAttention on others for performance", TE
# pytorch/attention.py, January 2024 at the latest); "fa3", FlashAttention-3.
ATTENTION_KERNELS = ("fa2", "cudnn", "fa3")
# How the cross entropy over the logits runs (``layer_bytes.loss_bytes``, ``kernels.py``):
# "eager", as PyTorch runs F.cross_entropy on float32 logits (torchtitan's until 2025: its
# ``loss_fn = torch.compile(loss_fn)`` commented out in December 2024), or
# "compiled", under torch.compile (torchtitan from April 2025, ``build_cross_entropy_loss``:
# "Compiling the loss function with torch.compile" when training.compile is on);
# "megatron", Megatron's vocab-parallel cross entropy, its in-place ops one kernel each, or
# "megatron-fused", the same under Megatron-Core's ``cross_entropy_loss_fusion``.
LOSSES = ("eager", "compiled", "megatron", "megatron-fused")
ZERO_REDUCES = ("reduce-scatter", "all-reduce")
# The settings of how a layout runs that any layout can take whatever its degrees (the
# framework's and recipe's: precision and its scaling, dtypes, kernels, the loss, the CP
# method, whose TP plan): the CLI's --plan and the planner against a team give them to every
# candidate. Async TP (needs SP), overlapped sends (an interleaved pipeline) and ZeRO's
# all-reduce (ZeRO-1/2) depend on the degrees.
DEGREE_FREE = ("precision", "fp8_scaling", "attention_kernel", "loss", "grad_dtype",
               "reduce_dtype", "moment_dtype", "kernels", "cp_comm", "tp_plan", "fsdp_impl")


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class Layout:
    """How a step is split: t-way tensor, p-way pipeline (v chunks each), d-way data
    parallelism; micro-batches of b sequences, m per step, global batch B = b*m*d.

    Give either ``m`` or ``global_batch``; the other follows.
    """

    t: int = 1
    c: int = 1
    p: int = 1
    d: int = 1
    e: int = 1
    b: int = 1
    m: int = None
    global_batch: int = None
    v: int = 1
    recompute: str = "full"
    sequence_parallel: bool = False
    scatter_gather: bool = True
    schedule: str = "1f1b"
    zero_stage: int = 0
    shard_group: int = None
    overlap_comm: bool = False
    overlap_p2p: bool = False
    uneven_stages: bool = False
    cp_comm: str = "ring"
    precision: str = "bf16"
    max_nodes: int = None
    kernels: str = "fused"
    comm_sm_share: float = 0.0
    async_tp: bool = False
    fp8_scaling: str = "blockwise"
    grad_dtype: str = "bf16"     # what gradients accumulate in: "bf16" or "fp32"
    # what the data-parallel exchange reduces gradients in: Megatron-LM reduces in fp32 under
    # bf16 (arguments.py: "bfloat16 requires gradient accumulation and all-reduce to be done
    # in fp32"; NeMo's grad_reduce_in_fp32=True), and so does torchtitan's FSDP
    # (--training.mixed_precision_reduce, default "float32"); weights still travel in bf16
    reduce_dtype: str = "bf16"
    moment_dtype: str = "fp32"   # Adam's momentum and variance: "fp32" or "bf16"
    # How ZeRO-1/2 exchange the gradients: "reduce-scatter" (each replica gets its shard:
    # Megatron's distributed optimizer, DeepSpeed's ZeRO) or "all-reduce", whole, before
    # each replica updates its shard (DeepSpeed's BF16 optimizer: its
    # get_grads_for_reduction hands the engine the fp32 gradients, which
    # buffered_allreduce_fallback all-reduces, "currently for BF16 optimizer")
    zero_reduce: str = "reduce-scatter"
    # Whose tensor-parallel plan: "megatron" (SP keeps the column layers' input shard and
    # gathers it again in backward) or "pytorch" (torchtitan's: keeps the gathered input).
    tp_plan: str = "megatron"
    fsdp_impl: str = "pytorch"   # whose ZeRO-3: FSDP2's or Megatron-Core's (FSDP_IMPLS)
    attention_kernel: str = "fa2"
    loss: str = "eager"

    def __post_init__(self):
        for name in ("t", "c", "p", "d", "e", "b", "v", "m", "global_batch"):
            value = getattr(self, name)
            if value is None and name in ("m", "global_batch"):
                continue
            positive_int(name, value, most=MAX)
        if not isinstance(self.recompute, str) or self.recompute not in RECOMPUTE_MODES:
            raise ValueError(f"recompute={self.recompute!r} must be one of "
                             f"{', '.join(RECOMPUTE_MODES)}")
        if not isinstance(self.schedule, str) or self.schedule not in SCHEDULES:
            raise ValueError(f"schedule={self.schedule!r} must be one of {', '.join(SCHEDULES)}")
        if not _is_int(self.zero_stage) or self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_stage={self.zero_stage!r} must be 0, 1, 2 or 3")
        for name in ("overlap_comm", "overlap_p2p", "uneven_stages", "async_tp"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r} must be True or False")
        if isinstance(self.comm_sm_share, bool) or not isinstance(
                self.comm_sm_share, (int, float)) or not 0 <= self.comm_sm_share < 1:
            raise ValueError(f"comm_sm_share={self.comm_sm_share!r} must be a share of the "
                             f"GPU's SMs from 0 to below 1, e.g. 20/132 (DeepSeek-V3)")
        for name, allowed in (("cp_comm", CP_COMM), ("precision", PRECISIONS),
                              ("grad_dtype", GRAD_DTYPES), ("moment_dtype", GRAD_DTYPES),
                              ("reduce_dtype", GRAD_DTYPES),
                              ("tp_plan", TP_PLANS), ("fsdp_impl", FSDP_IMPLS),
                              ("attention_kernel", ATTENTION_KERNELS),
                              ("kernels", KERNELS), ("fp8_scaling", FP8_SCALINGS),
                              ("loss", LOSSES), ("zero_reduce", ZERO_REDUCES)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name}={getattr(self, name)!r} must be one of "
                                 f"{', '.join(allowed)}")
        if self.max_nodes is not None:
            positive_int("max_nodes", self.max_nodes, most=MAX)
        if self.overlap_p2p and (self.v == 1 or self.schedule != "1f1b"):
            raise ValueError(f"overlap_p2p=True overlaps the interleaved 1F1B schedule's sends "
                             f"(Megatron-Core's overlap_p2p_comm); it needs v > 1 and "
                             f"schedule='1f1b', not v={self.v}, schedule={self.schedule!r}")
        if self.zero_reduce == "all-reduce" and self.zero_stage not in (1, 2):
            raise ValueError(f"zero_reduce='all-reduce' is how ZeRO-1/2 exchange gradients "
                             f"(DeepSpeed's BF16 optimizer); zero_stage={self.zero_stage} has "
                             f"no such choice: use zero_stage=1 or 2, or leave zero_reduce")
        if self.async_tp and not self.sequence_parallel:
            raise ValueError("async_tp=True splits sequence parallelism's all-gathers and "
                             "reduce-scatters; set sequence_parallel=True")
        if self.schedule == "dualpipe" and self.p % 2:
            raise ValueError(f"p={self.p}: DualPipe feeds the pipeline from both ends and "
                             f"needs an even p; use p={self.p + 1} or another schedule")
        if self.d % self.e:
            raise ValueError(f"e={self.e} must divide d={self.d}: expert parallelism is "
                             f"carved from the data-parallel GPUs")
        if self.shard_group is not None:
            positive_int("shard_group", self.shard_group, most=MAX)
            if self.d % self.shard_group or not self.zero_stage:
                raise ValueError(f"shard_group={self.shard_group} must divide d={self.d} and "
                                 f"needs zero_stage 1-3 (it is where ZeRO/FSDP shards)")
        if self.m is None and self.global_batch is None:
            raise ValueError("give m (micro-batches per step) or global_batch")
        per_step = self.b * self.d
        if self.m is None:
            if self.global_batch % per_step:
                raise ValueError(
                    f"global_batch={self.global_batch} is not divisible by d*b = {self.d}*"
                    f"{self.b} = {per_step}; use a multiple of {per_step}, e.g. "
                    f"{max(1, round(self.global_batch / per_step)) * per_step}")
            object.__setattr__(self, "m", self.global_batch // per_step)
        elif self.global_batch is None:
            object.__setattr__(self, "global_batch", self.m * per_step)
        if self.m < 1 or self.m * per_step != self.global_batch:
            raise ValueError(f"m={self.m} does not match global_batch={self.global_batch} "
                             f"= b*m*d with b={self.b}, d={self.d}")
        if self.v > 1 and self.schedule != "1f1b":
            raise ValueError(f"v={self.v} (interleaving) needs schedule='1f1b'")
        if self.v > 1 and self.m % self.p:
            raise ValueError(f"m={self.m} must be a multiple of p={self.p} for the "
                             f"interleaved schedule (v={self.v}); use v=1 or change the batch")

    @property
    def n_gpus(self):
        return self.t * self.c * self.p * self.d

    def check(self, model):
        """Raise ValueError, naming the setting, if this layout cannot run ``model``."""
        if model.s % (2 * self.c) and self.c > 1:
            raise ValueError(f"c={self.c} needs seq={model.s} to split into 2c = "
                             f"{2 * self.c} zig-zag chunks; use a c with s % 2c == 0")
        kv_heads = model.kv_heads or model.a
        if self.cp_comm == "ulysses" and self.c > 1 and (
                model.a % (self.t * self.c) or kv_heads % (self.t * self.c)):
            raise ValueError(f"c={self.c} with cp_comm='ulysses' must divide the heads of each "
                             f"of the t={self.t} ranks (heads={model.a}, kv_heads={kv_heads}): "
                             f"t*c must divide both; use a smaller c or cp_comm 'ring' or "
                             f"'allgather'")
        if self.e > 1 and model.moe is None:
            raise ValueError(f"e={self.e} needs an MoE model (model={model.name!r} is dense, "
                             f"no experts to split); use e=1")
        if self.e > 1 and model.moe.E % self.e:
            ok = [e for e in divisors(model.moe.E) if self.d % e == 0]
            raise ValueError(f"e={self.e} must divide the experts of model={model.name!r} "
                             f"(E={model.moe.E}); use one of {ok} (each divides E and d={self.d})")
        if self.p > model.L:
            raise ValueError(f"p={self.p} exceeds layers={model.L}: every stage needs a "
                             f"layer; use p <= {model.L}")
        if model.a % self.t or model.h % self.t:
            ok = divisors(math.gcd(model.a, model.h))
            shown = ", ".join(map(str, ok[:12])) + (", ..." if len(ok) > 12 else "")
            raise ValueError(f"t={self.t} must divide heads={model.a} and hidden={model.h}; "
                             f"use one of [{shown}]")
        if self.uneven_stages and self.p > 1 and (model.L + 2) % self.p:
            raise ValueError(f"uneven_stages needs layers + 2 = {model.L + 2} (the first and "
                             f"last stage one layer lighter) to divide by p={self.p}; use "
                             f"uneven_stages=False or such a p")
        layers = model.L + (2 if self.uneven_stages and self.p > 1 else 0)
        if self.v > 1 and (layers % self.p or (layers // self.p) % self.v):
            raise ValueError(f"v={self.v} needs layers={layers} to split into p*v = "
                             f"{self.p * self.v} equal chunks; use v=1 or a v dividing "
                             f"{layers // self.p if layers % self.p == 0 else 'L/p'}"
                             f"{'' if self.uneven_stages else ' (or uneven_stages=True)'}")

    def describe(self):
        extras = [f"v={self.v}"] if self.v > 1 else []
        extras += [f"recompute={self.recompute}"]
        extras += ["SP"] if self.sequence_parallel else []
        extras += [f"ZeRO-{self.zero_stage}"] if self.zero_stage else []
        extras += ["Megatron FSDP"] if self.zero_stage == 3 and self.fsdp_impl == "megatron" \
            else []
        extras += [f"shard {self.shard_group} (HSDP)"] if self.shard_group not in (
            None, self.d) else []
        extras += ["DualPipe"] if self.schedule == "dualpipe" else []
        extras += ["uneven stages"] if self.uneven_stages else []
        extras += [f"CP {self.cp_comm}"] if self.c > 1 and self.cp_comm != "ring" else []
        extras += ["async TP"] if self.async_tp else []
        extras += ["overlapped sends"] if self.overlap_p2p else []
        extras += ["fp32 grads"] if self.grad_dtype == "fp32" else []
        extras += ["fp32 reduce"] if self.reduce_dtype == "fp32" else []
        extras += ["bf16 moments"] if self.moment_dtype == "bf16" else []
        extras += ["grads all-reduced"] if self.zero_reduce == "all-reduce" else []
        if self.precision != "bf16":      # blockwise, DeepSeek-V3's, printed as plain "FP8"
            tensorwise = self.fp8_scaling != "blockwise"
            extras += [f"FP8 {self.fp8_scaling}" if tensorwise else "FP8"]
        extras += [f"routing <= {self.max_nodes} nodes"] if self.max_nodes else []
        extras += ["eager"] if self.kernels == "eager" else []
        extras += [f"{self.loss} loss"] if self.loss != "eager" else []
        extras += [f"{self.attention_kernel} attention"] if self.attention_kernel != "fa2" else []
        extras += [f"{self.comm_sm_share:.0%} SMs on comm"] if self.comm_sm_share else []
        axes = f"t={self.t} " + (f"c={self.c} " if self.c > 1 else "") + \
            f"p={self.p} d={self.d} " + (f"e={self.e} " if self.e > 1 else "")
        return f"{axes}b={self.b} m={self.m} B={self.global_batch} " + " ".join(extras)
