"""What overlap hides: communication run while the GPU computes, up to the compute beside it.

What it teaches: a transfer that runs while a GEMM runs costs nothing, until it is longer
than that GEMM. Each overlap of the course hides one kind of traffic behind one kind of work,
and the estimate charges only the rest:

* DDP's buckets (``alpha_beta.bucketed_step``; in the estimate ``Layout.overlap_comm``,
  ``axes.dp_time_s``): each bucket's all-reduce behind the backward of the layers before it;
  only the last bucket is exposed. FSDP's per-unit reduce-scatters the same way; both run
  under the last micro-batch's backward, the one whose gradients they carry.
* FSDP prefetch (``Layout.overlap_comm``, ``axes.dp_time_s``): the next unit's weight
  all-gather posted before this unit computes, forward and backward, so the gathers hide
  behind the rest of the step's compute up to its length.
* DualPipe (``schedule="dualpipe"`` or ``overlap_comm``, ``throughput.py``): one
  micro-batch's expert all-to-alls behind the other direction's compute (DeepSeek-V3
  §3.2.1), up to the stage's compute.
* The interleaved pipeline's sends and receives (``Layout.overlap_p2p``, Megatron-Core's
  ``overlap_p2p_comm``, on by default in today's Megatron-LM, whose
  ``--no-overlap-p2p-communication`` turns it off): each is posted ahead and waited for only
  when its tensor is needed, so it runs under another chunk's compute, but in the warm-up
  and the flush, which run it in turn ("--overlap-p2p-communication-warmup-flush" is off by
  default). The first stage's warm-up is (p-1)*2 + (v-1)*p forward chunks (Megatron-Core's
  ``get_pp_rank_microbatches``) and its flush as many backward ones, of the m*v of each
  (``p2p_exposed_share``).
* Asynchronous TP (``Layout.async_tp``, here): sequence parallelism's all-gather before a
  column-parallel GEMM, and its reduce-scatter after a row-parallel one, each split into t
  pieces, one per rank's shard (torchtitan's ``enable_async_tensor_parallel``, torch.compile's
  micro-pipeline TP pass). The rank starts on the shard it holds while the first remote
  piece arrives; piece j's GEMM waits for piece j's transfer. With C the collective's time
  (t-1 pieces on the wire) and G the GEMM's (t pieces), the GEMM ends at
  max(G, C + G/t): the last piece's GEMM has nothing left to hide, so

      exposed = max(0, C - G (t-1)/t)

  and the reduce-scatter is the mirror image (the first piece's GEMM has nothing to send).
  Each of a layer's four collectives is set against its own GEMM: the QKV projection, the
  attention output, the MLP's first and its second GEMMs. In the backward only two are:
  the pass (torch/_inductor/fx_passes/micro_pipeline_tp.py) fuses an all-gather into the
  matmuls that take it as their left operand and a reduce-scatter into the one matmul
  that produces it (``_find_producer_matmul``). The output gradients' all-gathers feed the
  input-gradient GEMMs of the attention output and the MLP's second GEMM, and hide; the
  input gradients of the QKV and the MLP's first GEMMs are sums of three and two matmuls
  (one per weight that read the gathered input), so their reduce-scatters find no producer
  matmul and run exposed, as without async TP (under ``tp_plan="pytorch"``). Megatron's
  ``--tp-comm-overlap`` (Transformer Engine's userbuffers) hides those too: by default
  ``tp_comm_bulk_dgrad`` "allows Reduce-Scatter overlap with Bprop weight gradient GEMM"
  (megatron/core/model_parallel_config.py), a GEMM of the same FLOPs, so under its plan all
  four hide. What PyTorch's pass leaves agrees with what its authors measured
  (PyTorch dev-discuss, "Introducing Async Tensor Parallelism in PyTorch", TL;DR: "Up to
  ~29% forward pass speedup and ~8% E2E speedup in Llama3 7B"). What splitting costs: each
  fused GEMM runs as t GEMMs of 1/t of its rows, one per shard ("Computing block-wise
  matmul along the first dim of A", ``_fused_all_gather_matmul_impl`` in
  torch/distributed/_symmetric_memory), each priced at its own shape (``gemm.py``: its
  tiles in fewer waves; ``async_tp_split_s``). And PyTorch's fused matmul-reduce-scatter
  (``_fused_matmul_reduce_scatter_impl``) sums late: it computes every rank's partial
  output, the whole b s/c x h, exchanges the pieces (``_pipelined_produce_and_all2all``) and
  only then adds up the t pieces of its own rows, "in a single reduction kernel" that reads
  the stacked partials and writes its 1/t, after the last piece has arrived, so exposed
  (``async_tp_reduce_s``); NCCL's reduce-scatter sums inside its own kernel, in the
  transfer's time. Not modelled: the pieces' own launch costs; so the model's gain is still
  an upper bound.

What hiding costs: a transfer run under compute is not free. NCCL's kernels take SMs and HBM
bandwidth from the GEMMs beside them; Lee et al. (2025, "Characterizing Compute-Communication
Overlap in GPU-Accelerated Distributed Deep Learning", abstract) measured "an average
computational slowdown of 18.9%, with a maximum of 40.0%" against the same compute run alone,
over GPT and LLaMA models on A100s, H100s, MI250s and MI210s (``CONTENTION``, their average,
taken for every GPU). While a hidden transfer of H seconds runs, the compute beside it advances
at 1/(1 + 0.189) of its rate, so the step is longer by H x 0.189 / 1.189
(``contention_s``): charged to every overlap above, the CP ring's hidden blocks
(``axes.cp_ring_s``) and DualPipe's all-to-alls included.

What a recompute repeats: a full recompute runs the forward's collectives again. torchtitan's
per-op policy (``recompute="op"``) saves the outputs of matmuls, of the attention kernel
and of ``reduce_scatter_tensor`` but not of ``all_gather_into_tensor`` (its ``_save_list``),
so the backward gathers the sequence-parallel input of the QKV and first MLP GEMMs again,
for their weight gradients: two more all-gathers a layer, charged exposed (the weight
gradient contracts over the gathered rows, which async TP's fused all-gather-matmul does
not split). Megatron-LM also re-gathers that input (Korthikanti et al. 2022 §4.2.2) but
overlaps it with the input-gradient GEMM, so its selective recompute adds nothing here.

What PyTorch's plan adds (``tp_plan="pytorch"``, torchtitan's): its activations are batch
first, [b, s, h], so sequence parallelism shards dim 1, not dim 0 as Megatron's [s, b, h].
NCCL gathers and scatters along dim 0 only, so PyTorch's functional collectives rearrange
around it: ``all_gather_tensor`` with ``gather_dim != 0`` runs ``torch.cat(torch.chunk(res,
group_size, dim=0), dim=gather_dim)`` and ``reduce_scatter_tensor`` with ``scatter_dim != 0``
chunks and concatenates its input first (torch/distributed/_functional_collectives.py):
one memory-bound copy of the whole gathered tensor per collective, read and written, exposed
(the concatenation needs the gathered data; the reduce-scatter needs the copy). Newer code
gathers into a view where the shard's leading dims are 1 (b = 1); the model charges neither
collective at b = 1, an assumption for the reduce-scatter (``pytorch_sp_copy_s``). Async
TP's fused all-gather-matmul instead copies the shard once when it is not contiguous
("A_shard needs to be copied once", its docstring), 1/t of that, not charged.

Pure arithmetic, called by ``throughput.estimate``. Try ``python -c "from
lessonlib.costmodel.overlap import async_tp_exposed_s; print(async_tp_exposed_s(2.0, 1.0, 8))"``.
"""
from dataclasses import replace

from .comm import ring_all_gather_time_s, ring_allreduce_time_s
from .gemm import HBM_EFFICIENCY, PRECISIONS, gemm_time_s, layer_gemms
from .memory import WEIGHT_BYTES

# How much slower compute runs while a transfer shares the GPU: Lee et al. 2025's average
# over their models and GPUs (above), one figure for every GPU; no published row set it.
CONTENTION = 0.189


def contention_s(hidden_s):
    """Seconds a step is longer because ``hidden_s`` seconds of transfers ran under its
    compute, which meanwhile advanced at 1/(1 + ``CONTENTION``) of its rate."""
    return hidden_s * CONTENTION / (1 + CONTENTION)


def p2p_exposed_share(p, m, v):
    """The share of the interleaved schedule's sends and receives left exposed under
    Megatron-Core's overlap_p2p_comm: its warm-up's and flush's, (p-1)*2 + (v-1)*p chunks of
    the m*v a direction (above), at most all."""
    return min(1.0, ((p - 1) * 2 + (v - 1) * p) / (m * v))


def async_tp_exposed_s(collective_s, gemm_s, t):
    """Seconds of one all-gather (or reduce-scatter) of ``collective_s`` left exposed when it
    is split into t pieces that overlap a GEMM of ``gemm_s``: max(0, C - G (t-1)/t)."""
    return max(0.0, collective_s - gemm_s * (t - 1) / t)


def sp_gemms_s(model, b, gpu, t=1, c=1, e=1, precision="bf16", pieces=1):
    """Forward seconds of the GEMMs beside a layer's four SP collectives, in order: the QKV
    projection (after the all-gather), the attention output (before the reduce-scatter), the
    MLP's first GEMMs (the router and every expert's and the shared experts' first, after
    the all-gather) and its second ones (before the reduce-scatter); each run as ``pieces``
    GEMMs of 1/pieces of its rows (async TP's split, above)."""
    linear = [count * pieces * gemm_time_s(gpu, m / pieces, n, k, precision)
              for m, n, k, count, kind in layer_gemms(model, b, t, c, e) if kind == "linear"]
    # layer_gemms lists QKV, the attention output, then the MLP's (first, second) pairs and
    # last the router, which reads the gathered input like a first GEMM
    return linear[0], linear[1], sum(linear[2::2]), sum(linear[3::2])


def _fused_gemms(lay):
    """(forward, backward): which of ``sp_gemms_s``'s four GEMMs async TP fuses with a
    collective in each pass: all four forward; backward, the input-gradient GEMMs of the
    attention output and the MLP's second GEMMs under PyTorch's pass, all four under
    Megatron's (above)."""
    return (0, 1, 2, 3), ((1, 3) if lay.tp_plan == "pytorch" else (0, 1, 2, 3))


def async_tp_split_s(model, lay, gpu):
    """Seconds one layer's micro-batch spends more under async TP because each fused GEMM
    runs as t pieces (above): the split GEMMs against the whole ones, forward (again under a
    full recompute) and backward (the input-gradient GEMMs, of the forward's shapes); 0
    without async TP."""
    if not lay.async_tp:
        return 0.0
    shape = (model, lay.b, gpu, lay.t, lay.c, lay.e, lay.precision)
    more = [split - whole for split, whole in zip(sp_gemms_s(*shape, pieces=lay.t),
                                                  sp_gemms_s(*shape))]
    forward, backward = _fused_gemms(lay)
    forwards = 2 if lay.recompute == "full" else 1
    return forwards * sum(more[i] for i in forward) + sum(more[i] for i in backward)


def async_tp_reduce_s(model, lay, cluster):
    """Seconds per layer and micro-batch of the reduction kernels PyTorch's fused
    matmul-reduce-scatters run after their exchange (above): each reads the b s/c x h
    stacked partials and writes its 1/t, at the HBM's streaming rate; the forward's two (the
    attention output's and the MLP's second), again under a full recompute. 0 without async
    TP and under Megatron's plan, whose userbuffers reduce each piece as it arrives."""
    if not lay.async_tp or lay.tp_plan != "pytorch" or lay.t == 1:
        return 0.0
    partials = WEIGHT_BYTES * lay.b * model.s * model.h / lay.c
    forwards = 2 if lay.recompute == "full" else 1
    one = partials * (1 + 1 / lay.t) / (cluster.gpu.hbm_bytes_per_s * HBM_EFFICIENCY)
    return forwards * 2 * one


def pytorch_sp_copy_s(model, lay, cluster):
    """Seconds of the copy PyTorch's plan adds around one sequence-parallel collective (see
    above): the gathered [b, s, h] tensor read and written at the HBM's streaming rate; 0
    for Megatron's plan, without SP, under async TP or with b = 1."""
    if (lay.tp_plan != "pytorch" or not lay.sequence_parallel or lay.async_tp or lay.t == 1
            or lay.b == 1):
        return 0.0
    gathered = WEIGHT_BYTES * lay.b * model.s * model.h / lay.c
    return 2 * gathered / (cluster.gpu.hbm_bytes_per_s * HBM_EFFICIENCY)


def tp_comm_s(model, lay, cluster, layers, comm_efficiency):
    """(exposed, hidden) seconds of the tensor-parallel collectives for one micro-batch on a
    stage of ``layers`` layers: two all-reduces (or with SP all-gather + reduce-scatter
    pairs, same bytes) in each forward, two in the backward, a full recompute repeating the
    forward's, torchtitan's per-op recompute two all-gathers (above); with ``lay.async_tp``
    each SP collective hides behind its GEMM (above), and ``hidden`` is what it hides.
    Under FP8 the forward's gathers carry FP8, half the bytes: PyTorch's plan (torchtitan's
    float8 TP: torchao's ``PrepareFloat8ModuleInput`` casts before it redistributes) and
    Transformer Engine (``fp8_scaling="te"``: its LayerNormLinear's norm writes FP8, which
    it gathers; "te-current" alike, the amax reduced over the TP group before the cast), which
    gathers the output gradients in FP8 in the backward too (its ``grad_output_preprocess``);
    the reduce-scatters move BF16."""
    t = lay.t
    if t == 1:
        return 0.0, 0.0
    bandwidth, latency = cluster.group_link(lay.n_gpus, t, 1)
    bandwidth *= comm_efficiency
    message = WEIGHT_BYTES * lay.b * model.s * model.h / lay.c
    forwards = 2 if lay.recompute == "full" else 1
    one = ring_all_gather_time_s(t, message, bandwidth, latency)
    te = lay.precision == "fp8" and lay.fp8_scaling in ("te", "te-current")
    fp8_gathers = lay.sequence_parallel and (te or (
        lay.precision == "fp8" and lay.tp_plan == "pytorch"))
    share = PRECISIONS["fp8"] / WEIGHT_BYTES if fp8_gathers else 1.0
    gather = ring_all_gather_time_s(t, message * share, bandwidth, latency)
    back_gather = gather if te else one
    regathers = 2 * one if lay.recompute == "op" and lay.sequence_parallel else 0.0
    if not lay.async_tp:
        if not lay.sequence_parallel:     # two all-reduces a pass, NVLS where it runs
            fast = bandwidth * cluster.allreduce_speedup(lay.n_gpus, t, 1)
            return layers * 2 * (forwards + 1) * ring_allreduce_time_s(
                t, message, fast, latency), 0.0
        # a pass's two all-gathers and two reduce-scatters, the gathers perhaps in FP8, and
        # the regathers; each with PyTorch's copy where its plan pays one
        copies = (2 * forwards * share + 2 * forwards + 4 + (2 if regathers else 0))
        return layers * (forwards * (2 * gather + 2 * one) + 2 * back_gather + 2 * one
                         + regathers + copies * pytorch_sp_copy_s(model, lay, cluster)), 0.0
    gemms = sp_gemms_s(model, lay.b, cluster.gpu, t, lay.c, lay.e, lay.precision)
    # the forward's all-gathers precede the QKV and first MLP GEMMs (gemms 0 and 2); the
    # backward's input-gradient GEMMs have the forward's shapes: its reduce-scatters follow
    # those of QKV and the first MLP GEMMs, its all-gathers precede those of the attention
    # output and the MLP's second GEMM (1 and 3). Under PyTorch's pass only those
    # all-gathers hide: the reduce-scatters follow a sum of GEMMs (above)
    forward = [gather, one, gather, one]
    pytorch = lay.tp_plan == "pytorch"
    collectives = [one, back_gather, one, back_gather]    # the backward's, beside gemms
    backward = [(collectives[i], gemms[i]) for i in _fused_gemms(lay)[1]]
    exposed = (forwards * sum(async_tp_exposed_s(c, g, t) for c, g in zip(forward, gemms))
               + sum(async_tp_exposed_s(c, g, t) for c, g in backward))
    hidden = forwards * sum(forward) + sum(c for c, _ in backward) - exposed
    unfused = 2 * (one + pytorch_sp_copy_s(model, replace(lay, async_tp=False), cluster)) \
        if pytorch else 0.0
    return (layers * (exposed + unfused + regathers + async_tp_reduce_s(model, lay, cluster)),
            layers * hidden)
