"""One training step of a (t, c, p, d, e) layout, predicted: memory, time by part, TFLOP/s per GPU.

``estimate(model, layout, cluster)`` walks the slowest pipeline stage through one
micro-batch and adds up:

* compute: the stage's GEMMs (forward, backward, recompute), each at the rate its shape
  allows (``gemm.py``: a roofline under the measured achievable peak, BF16 or FP8);
* elementwise: memory-bound kernels (layer norm, GeLU, softmax, dropout) streaming the layer's
  activations through HBM; the loss over the logits on the last stage, and on the first the
  input embedding's dense gradient of the whole table (``kernels.embedding_grad_bytes``);
* TP comm: the tensor-parallel all-reduces (NVLink inside a server; across servers, the
  ports of the group's members together, ``Cluster.group_link``), hidden behind their GEMMs
  under async TP (``overlap.py``);
* PP comm: activations and gradients to and from the neighbouring stages;

* CP comm and EP comm (``axes.py``): the K/V ring's exposed part, the MoE all-to-alls;
* contention: the compute slowed while a hidden transfer shares the GPU
  (``overlap.contention_s``);

then multiplies by m micro-batches, adds the pipeline bubble ((p-1)/v micro-batch slots,
Megatron-LM 2021 §2.2), the data-parallel gradient all-reduce at the end of the step and
the optimizer step (memory-bound: Adam's state read and written).
Achieved TFLOP/s per GPU counts hardware FLOPs, what the GPUs execute, recompute included:
under full recompute that is Megatron-LM 2021's Eq. 3, so it is comparable with that paper's
Table 1; under selective recompute the model's FLOPs plus the attention core's forward again
(Korthikanti et al. 2022, App. A); MFU counts the model's FLOPs alone. See
``table1_report()`` in ``megatron2021.py``: ``table1_report()`` in ``megatron2021.py``
does the comparison.

One job: one step's time, summed part by part over the slowest stage; it runs past 300
lines because every part of the step is priced here, each from the module that owns its
bytes or FLOPs.

Run ``python -m lessonlib.costmodel --model megatron-1T --t 8 --p 64 --d 6 --microbatch 1
--global-batch 3072 --gpu A100-80GB --json``.
"""
import math
from dataclasses import dataclass, field, replace
from functools import lru_cache

from .axes import cp_merge_s, cp_ring_s, dp_time_s, ep_alltoall_s, fsdp_copies_s
from .bubble import bubble_fraction as _bubble_fraction
from .comm import group_spans_nodes, pp_elements_per_boundary, ring_all_gather_time_s
from .compute import (attention_core_forward_flops, layer_forward_flops,
                      megatron_flops_per_iteration, model_flops_per_iteration)
from . import gemm
from .hardware import Cluster
from .kernels import (BACKWARD_TRAFFIC, eager_layer_forward_bytes, embedding_grad_bytes,
                      loss_bytes, norm_up_recompute_share, op_recompute_share)
from .layer_bytes import loss_runs
from .layout import GRAD_DTYPES, Layout
from .memory import (WEIGHT_BYTES, MemoryBreakdown, activation_bytes_per_layer, memory_per_gpu,
                     usable_memory_bytes)
from .model import GPT
from .overlap import async_tp_split_s, contention_s, p2p_exposed_share, tp_comm_s

# --- The constants: set once, for every model, layout and GPU. ---------------------------
# How fast a GEMM runs is no constant: ``gemm.py`` prices each GEMM of a layer by its shape
# under the GPU's measured Maximum Achievable Matmul FLOPS (``hardware.MAMF``) at the share a
# GPU sustains at its power limit (``hardware.SUSTAINED``), with NVIDIA's tile and wave
# quantization. The others are counted or sourced below; none was
# chosen on a published row, so every row of ``published.py`` is a check.

# Fraction of datasheet HBM bandwidth that streaming, elementwise kernels reach.
HBM_EFFICIENCY = gemm.HBM_EFFICIENCY
# Fraction of the per-direction link rate that NCCL collectives and p2p transfers reach, what
# nccl-tests calls busbw against the link's rate. On NVLink, NCCL's maintainer: "450GB/s is
# the line rate. With the protocol overhead (~20%) NCCL can get an effective NVLink bandwidth
# of 370GB/s" (H100, ring; NVIDIA/nccl-tests issue 212), 0.82; across servers, 84.8 GB/s on
# average and 96 at best of 100 GB/s of HDR ports (A100 servers, nccl-tests issue 119). The
# latency each ring step adds is the cluster's (``hardware.Cluster``).
COMM_EFFICIENCY = 0.8
# HBM passes over the activations a layer keeps, by its memory-bound kernels (norms, GeLU or
# SwiGLU, softmax, dropout, bias, residual adds): each reads its input and writes its output
# in the forward (FORWARD_PASSES), moves BACKWARD_TRAFFIC times that in the backward (reads
# the output's gradient and its saved input, writes the input's gradient: ``kernels.py``,
# the same count as eager PyTorch's), and runs again, reading and writing, under a recompute.
# Counted, not chosen: no row sets it.
FORWARD_PASSES = 2
ELEMENTWISE_PASSES = FORWARD_PASSES * (1 + BACKWARD_TRAFFIC)
# The optimizer step is memory-bound: Adam (Kingma & Ba 2015, Algorithm 1), fused into one
# pass by Megatron's and PyTorch's multi-tensor kernels, reads each parameter's float32
# master weight and its two moments and writes them back, reads its gradient twice (the
# global norm that both Megatron-LM and torchtitan clip by, then the update) and writes the
# 16-bit weight the next step computes with; only the shard of the state this GPU holds
# under ZeRO/FSDP. Bytes per parameter beyond the state read and written: 2 x 4 + 2.
OPTIMIZER_GRADIENT_READS = 2
# Share of the data-parallel all-reduce hidden behind the backward pass. The Megatron-LM code
# of 2021 all-reduced gradients after the pipeline flush, so nothing was hidden.
DP_OVERLAP = 0.0


@dataclass(frozen=True)
class Estimate:
    """What ``estimate`` predicts for one training step; times in seconds, memory in bytes."""

    model: object
    layout: Layout
    cluster: object
    memory: MemoryBreakdown
    memory_capacity_bytes: float
    time: dict = field(default_factory=dict)
    tflops_per_gpu: float = 0.0
    mfu: float = 0.0

    @property
    def fits(self):
        return self.memory.total <= self.memory_capacity_bytes

    @property
    def step_time_s(self):
        return sum(self.time.values())

    @property
    def bubble_fraction(self):
        """Bubble share of the step's wall time (the "wall" convention)."""
        return self.time["bubble"] / self.step_time_s

    @property
    def tokens_per_s(self):
        return self.layout.global_batch * self.model.s / self.step_time_s

    def as_dict(self):
        lay = self.layout
        return {
            "model": self.model.describe(), "layout": lay.describe(),
            "t": lay.t, "c": lay.c, "p": lay.p, "d": lay.d, "e": lay.e, "b": lay.b,
            "m": lay.m, "v": lay.v, "schedule": lay.schedule,
            "global_batch": lay.global_batch, "n_gpus": lay.n_gpus,
            "gpu": self.cluster.gpu.name, "gpus_per_node": self.cluster.gpus_per_node,
            "network_ports": self.cluster.network_ports,
            "collectives": self.cluster.collectives,
            "tflops_per_gpu": self.tflops_per_gpu, "mfu": self.mfu,
            "bubble_fraction": self.bubble_fraction, "step_time_s": self.step_time_s,
            "time_s": dict(self.time), "tokens_per_s": self.tokens_per_s,
            "memory_per_gpu_bytes": self.memory.total,
            "memory_bytes": self.memory.as_dict(),
            "memory_capacity_bytes": self.memory_capacity_bytes, "fits": self.fits,
        }

    def summary(self):
        """A few lines for people: throughput, memory, where the time goes."""
        gb = 1e9
        parts = ", ".join(f"{k} {v:.3g} s" for k, v in self.time.items())
        mem = self.memory
        return (f"{self.model.describe()}\n{self.layout.describe()} on {self.layout.n_gpus} x "
                f"{self.cluster.gpu.name} ({self.cluster.gpus_per_node} per server, "
                f"{self.cluster.network_ports} network ports each, "
                f"{self.cluster.collectives} collectives across servers)\n"
                f"  {self.tflops_per_gpu:.1f} TFLOP/s per GPU ({self.mfu:.0%} MFU), step "
                f"{self.step_time_s:.3g} s, bubble {self.bubble_fraction:.1%} of wall time\n"
                f"  time: {parts}\n"
                f"  memory per GPU: {mem.total / gb:.1f} GB = weights {mem.weights / gb:.1f} + "
                f"grads {mem.gradients / gb:.1f} + optimizer {mem.optimizer / gb:.1f} + "
                f"activations {mem.activations / gb:.1f} "
                f"(usable {self.memory_capacity_bytes / gb:.0f} GB: "
                f"{'fits' if self.fits else 'does NOT fit'})")


def layer_attention_s(model, lay, gpu):
    """(forward, backward) seconds of one layer's attention core (the score products and
    their softmax) for one micro-batch on one GPU: today's layers one fused kernel at its
    measured rate (``gemm.fused_attention_s``), Megatron-LM 2021's two GEMMs per head, its
    backward twice their time."""
    if not model.legacy:
        return gemm.fused_attention_s(model, lay.b, gpu, lay.t, lay.c,
                                      ulysses=lay.cp_comm == "ulysses",
                                      kernel=lay.attention_kernel)
    attention = gemm.layer_gemm_time_s(model, lay.b, gpu, kinds=("attention",), t=lay.t,
                                       c=lay.c, e=lay.e, precision=lay.precision)
    return attention, 2 * attention


def attention_time_s(est):
    """Seconds of a step's attention cores on the first stage's GPU (``layer_attention_s``
    for each of its layers and micro-batches, the forward run again under full or selective
    recompute): how much of ``est``'s step a slower or a repeated attention would move."""
    model, lay = est.model, est.layout
    forward, backward = layer_attention_s(model, lay, est.cluster.gpu)
    again = forward if lay.recompute in ("full", "selective") else 0.0
    layers = -(-model.L // lay.p)
    return lay.m * layers * (forward + backward + again) / (1 - lay.comm_sm_share)


def _stage_microbatch_s(model, lay, cluster, layers, logits, embedding=1):
    """(gemm, elementwise, tp, pp, cp, ep, contention) seconds of one micro-batch on a stage
    of ``layers`` layers; with context parallelism each of the c ranks does 1/c of the work
    on s/c tokens. Contention: the compute slowed under the transfers it hides
    (``overlap.contention_s``)."""
    gpu, b, t, s, h, c = cluster.gpu, lay.b, lay.t, model.s, model.h, lay.c
    n = lay.n_gpus
    shape = dict(t=t, c=c, e=lay.e, precision=lay.precision)
    linear = gemm.layer_gemm_time_s(model, b, gpu, kinds=("linear",), **shape)
    # forward, then the backward's two GEMMs of each shape (input and weight gradients); a
    # fused attention kernel's backward does 2.5x its forward's FLOPs at its own measured
    # rate (it recomputes the scores). Selective recompute runs the attention's forward
    # again, fused kernel or not: Megatron-Core wraps its core attention, Transformer
    # Engine's fused kernel included, in ``tensor_parallel.checkpoint`` whenever
    # recompute_granularity is 'selective' (core_v0.8.0, transformer/attention.py,
    # ``checkpoint_core_attention``), though the fused kernel saves no s x s tensor
    attention, attention_backward = layer_attention_s(model, lay, gpu)
    recompute = {"none": 0.0, "full": linear + attention,
                 "selective": attention,
                 "op": op_recompute_share(model) * linear,
                 "norm-up": norm_up_recompute_share(model) * linear}[lay.recompute]
    compute = layers * (3 * linear + attention + attention_backward + recompute
                        + async_tp_split_s(model, lay, gpu))   # async TP's GEMMs in pieces
    if logits:     # the output head stays BF16 (DeepSeek-V3 §3.3.1; torchtitan's float8)
        compute += 3 * logits * gemm.gemm_time_s(gpu, b * s / c, model.V / t, h)
    # SMs given to communication kernels compute nothing (DeepSeek-V3 §3.2.2: 20 of 132)
    compute /= 1 - lay.comm_sm_share

    acts = activation_bytes_per_layer(model, b, t, lay.sequence_parallel, "none")
    hbm = gpu.hbm_bytes_per_s * HBM_EFFICIENCY
    if lay.kernels == "eager":        # one kernel per op (``kernels.py``)
        again = 0 if lay.recompute == "none" else 1
        elementwise = layers * (1 + BACKWARD_TRAFFIC + again) * eager_layer_forward_bytes(
            model, b, t, c) / hbm
    else:
        rewritten = {"none": 0.0, "full": acts, "op": acts}.get(lay.recompute, 0.0)
        if lay.recompute in ("selective", "norm-up"):    # what is rebuilt is written again
            rewritten = acts - activation_bytes_per_layer(model, b, t, lay.sequence_parallel,
                                                          lay.recompute)
        passes = ELEMENTWISE_PASSES * acts + FORWARD_PASSES * rewritten
        elementwise = layers * passes / c / hbm
    loss = loss_runs(lay.loss, lay.tp_plan == "pytorch", t)
    elementwise += logits * loss_bytes(model, b, t, c, loss) / hbm   # the loss
    elementwise += embedding * embedding_grad_bytes(      # the embedding's dense gradient
        model, t, GRAD_DTYPES[lay.reduce_dtype], lay.zero_stage in (1, 2)) / hbm
    elementwise += cp_merge_s(model, lay, layers, hbm)   # CP's float32 merges
    if lay.precision == "fp8":        # the cast kernels around every FP8 GEMM
        elementwise += layers * gemm.fp8_quantization_bytes(
            model, b, t, c, lay.e, lay.fp8_scaling, lay.recompute != "none", lay.m) / hbm

    # forward g after attention and MLP, backward f twice; recompute repeats the forward;
    # with SP all-gathers and reduce-scatters, hidden behind their GEMMs under async TP
    tp, hidden = tp_comm_s(model, lay, cluster, layers, COMM_EFFICIENCY)
    tp_bw, tp_lat = cluster.group_link(n, t, 1)
    tp_bw *= COMM_EFFICIENCY
    pp = 0.0
    if lay.p > 1:
        pp_bw, pp_lat = cluster.link(group_spans_nodes(n, lay.p, n // lay.p,
                                                       cluster.gpus_per_node))
        # Megatron-LM 2021's scatter/gather (§4.1) sends 1/t of the boundary and all-gathers
        # it inside the server; under SP each TP rank holds s/t of its rows already and sends
        # them (Megatron-Core's get_tensor_shapes: seq_length // TP size), and the gather is
        # SP's own, in the next layer (``tp_comm_s``)
        split = lay.scatter_gather or lay.sequence_parallel
        message = WEIGHT_BYTES * pp_elements_per_boundary(b, s, h, t, split) / c
        one_way = pp_lat + message / (pp_bw * COMM_EFFICIENCY)
        if lay.scatter_gather and not lay.sequence_parallel and t > 1:
            one_way += ring_all_gather_time_s(t, WEIGHT_BYTES * b * s * h / c, tp_bw, tp_lat)
        pp = 2 * lay.v * one_way  # activations forward, gradients backward, per chunk
        if lay.overlap_p2p:       # hidden but in the warm-up and the flush
            exposed = pp * p2p_exposed_share(lay.p, lay.m, lay.v)
            hidden += pp - exposed
            pp = exposed
    attention_rate = attention_core_forward_flops(model, b) / t / c / attention if \
        attention else gpu.peak_flops
    cp, cp_hidden = cp_ring_s(model, lay, cluster, layers, attention_rate, COMM_EFFICIENCY)
    ep = ep_alltoall_s(model, lay, cluster, layers, COMM_EFFICIENCY)
    hidden += cp_hidden
    if lay.overlap_comm or lay.schedule == "dualpipe":   # DualPipe hides its all-to-alls
        hidden += min(ep, compute)
        ep = max(0.0, ep - compute)
    return compute, elementwise, tp, pp, cp, ep, _contention_s(lay, hidden)


def _contention_s(lay, hidden):
    """``overlap.contention_s`` of ``hidden`` seconds of transfers, but none where SMs are set
    aside for communication (DeepSeek-V3): they already price what it takes from compute."""
    return 0.0 if lay.comm_sm_share else contention_s(hidden)


# Once per model and batch (and recompute): the thousands of layouts of a plan share them.
_model_flops = lru_cache(maxsize=256, typed=True)(model_flops_per_iteration)


def hardware_flops_per_iteration(model, lay):
    """The FLOPs one step executes: the model's, plus what ``lay.recompute`` repeats."""
    return _hardware_flops(model, lay.recompute, lay.global_batch)


@lru_cache(maxsize=256, typed=True)
def _hardware_flops(model, recompute, global_batch):
    if recompute == "full" and model.legacy:
        return megatron_flops_per_iteration(model, global_batch)            # Eq. 3
    linear = layer_forward_flops(model, 1) - attention_core_forward_flops(model, 1)
    again = {"none": 0.0, "selective": attention_core_forward_flops(model, 1),
             "full": layer_forward_flops(model, 1),
             "op": op_recompute_share(model) * linear,
             "norm-up": norm_up_recompute_share(model) * linear}[recompute]
    return _model_flops(model, global_batch) + global_batch * model.L * again


def optimizer_step_s(est):
    """Seconds of the optimizer step on the busiest GPU: its share of the optimizer state
    (``est.memory.optimizer``: master weights and moments) read and written, and for each of
    those parameters the gradient read ``OPTIMIZER_GRADIENT_READS`` times and the 16-bit
    weight written."""
    lay = est.layout
    state_per_param = 4 + 2 * GRAD_DTYPES[lay.moment_dtype]
    params = est.memory.optimizer / state_per_param
    moved = 2 * est.memory.optimizer + params * (
        OPTIMIZER_GRADIENT_READS * 4 + WEIGHT_BYTES)
    return moved / (est.cluster.gpu.hbm_bytes_per_s * HBM_EFFICIENCY)


def check_finite_times(time: dict) -> None:
    """ValueError naming the parts of a step whose time is not finite (a bandwidth so small,
    or a size so large, that a division overflowed), so no estimate carries inf or nan."""
    bad = {part: seconds for part, seconds in time.items() if not math.isfinite(seconds)}
    if bad:
        said = ", ".join(f"{part} {seconds} s" for part, seconds in bad.items())
        raise ValueError(f"the step time is not finite ({said}): a setting is out of range, "
                         f"e.g. the cluster's network_gbit or a bandwidth near zero")


def estimate(model, layout, cluster):
    """Predict one training step of ``model`` split by ``layout`` on ``cluster``."""
    return timed(memory_estimate(model, layout, cluster))


def memory_estimate(model, layout, cluster):
    """The ``Estimate`` of memory alone (its ``time`` empty): all the planner needs of a
    layout that does not fit; ``timed`` adds the step."""
    for name, value, kind, example in (
            ("model", model, GPT, 'MODELS["gpt3-175B"]'),
            ("layout", layout, Layout, "Layout(t=8, p=12, d=4, global_batch=1536)"),
            ("cluster", cluster, Cluster, 'CLUSTERS["dgx-a100"]')):
        if not isinstance(value, kind):
            raise ValueError(f"{name}={value!r:.60} is not a {kind.__name__}; pass one, "
                             f"e.g. {example}")
    lay = layout
    lay.check(model)
    mem = memory_per_gpu(model, lay.t, lay.p, lay.d, lay.b, lay.m, lay.v, lay.recompute,
                         lay.sequence_parallel, lay.zero_stage, lay.schedule, lay.c, lay.e,
                         lay.shard_group, lay.uneven_stages, GRAD_DTYPES[lay.grad_dtype],
                         lay.kernels != "eager", lay.cp_comm, lay.precision == "fp8",
                         4 + 2 * GRAD_DTYPES[lay.moment_dtype], lay.tp_plan == "pytorch",
                         lay.loss)
    return Estimate(model=model, layout=lay, cluster=cluster, memory=mem,
                    memory_capacity_bytes=usable_memory_bytes(cluster.gpu, sum(
                        n > 1 for n in (lay.t, lay.c, lay.p, lay.d, lay.e))))


def timed(est):
    """``est`` (a ``memory_estimate``) with its step: time by part, TFLOP/s, MFU."""
    model, lay, cluster = est.model, est.layout, est.cluster
    # The slowest stage paces the pipeline: the first (ceil(L/p) layers) or the last
    # (floor(L/p) layers plus the output layer's logits); with uneven stages a middle one
    # ((L+2)/p layers) or the last (one layer fewer, plus the logits).
    # Multi-token prediction (DeepSeek-V3 §2.2): the last stage runs ``model.mtp`` more
    # layers and output heads.
    mtp = model.mtp
    if lay.uneven_stages and lay.p > 1:
        full = (model.L + 2) // lay.p
        first = _stage_microbatch_s(model, lay, cluster, full, logits=0)
        last = _stage_microbatch_s(model, lay, cluster, full - 1 + mtp, logits=1 + mtp,
                                   embedding=0)
    else:
        first = _stage_microbatch_s(model, lay, cluster, -(-model.L // lay.p) + (
            mtp if lay.p == 1 else 0), logits=(1 + mtp) if lay.p == 1 else 0)
        last = _stage_microbatch_s(model, lay, cluster, model.L // lay.p + mtp,
                                   logits=1 + mtp, embedding=int(lay.p == 1))
    if lay.schedule == "dualpipe":    # the first and the last stage on one rank (§3.2.3)
        last = tuple((x + y) / 2 for x, y in zip(first, last))
    per_mb = max(first, last, key=sum)
    slot = sum(per_mb)
    m = lay.m
    hbm = cluster.gpu.hbm_bytes_per_s * HBM_EFFICIENCY
    time = {"compute": m * per_mb[0],
            "elementwise": m * per_mb[1] + fsdp_copies_s(model, lay, hbm),   # FSDP2's copies
            "tp_comm": m * per_mb[2],
            "pp_comm": m * per_mb[3],
            # (p-1)/v micro-batch slots idle per step; as a share of the busy time this is
            # bubble_fraction(p, m, v, "ideal") (Megatron-LM 2021 §2.2).
            "bubble": slot * m * _bubble_fraction(lay.p, m, lay.v, "ideal", lay.schedule)}
    # the exchange runs beside the micro-batches' every kernel and exposed transfer
    time["dp_comm"], dp_hidden = dp_time_s(model, lay, cluster, m * sum(per_mb[:6]),
                                           COMM_EFFICIENCY, DP_OVERLAP)
    time["optimizer"] = optimizer_step_s(est)
    # The new axes' traffic, only where they are used (c = e = 1 keeps the old keys), and
    # the compute slowed under hidden transfers, only where a transfer is hidden.
    contention = m * per_mb[6] + _contention_s(lay, dp_hidden)
    time.update({k: v for k, v, on in (("cp_comm", m * per_mb[4], lay.c > 1),
                                       ("ep_comm", m * per_mb[5], lay.e > 1),
                                       ("contention", contention, contention > 0)) if on})
    check_finite_times(time)
    step = sum(time.values())
    n, peak = lay.n_gpus, cluster.gpu.peak_flops
    return replace(
        est, time=time,
        tflops_per_gpu=hardware_flops_per_iteration(model, lay) / (n * step) / 1e12,
        mfu=_model_flops(model, lay.global_batch) / (n * step * peak))
