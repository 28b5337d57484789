"""The axes beyond Megatron-LM 2021 in the estimate: what context parallelism, expert
parallelism and sharded data parallelism add to a step, and where the rank order puts it.

* Context parallelism (c): each rank keeps s/c tokens of every sequence; the K/V ring
  (``context.py``) brings the other c-1 blocks in while the rank computes attention on the
  block it has, so only the part of a transfer longer than that compute is exposed. The c
  ranks of a group are t apart (tp, cp, ...), so the ring stays inside a server while
  t*c <= GPUs per server. ``cp_comm="allgather"`` (Llama 3 §3.3.2) gathers K and V whole,
  exposed; ``"ulysses"`` (DeepSpeed-Ulysses, Jacobs et al. 2023; Megatron-Core's ``a2a``)
  runs four all-to-alls per layer forward (q, k, v to head shards, the output back) and four
  backward, exposed, each carrying (c-1)/c of its tensor. ``"torchtitan"``: PyTorch's
  ``context_parallel`` under torchtitan's model (``cp_torchtitan_s``).
* Expert parallelism (e, carved from d): four all-to-alls per MoE layer and micro-batch
  (``moe.moe_layer_comm_s``), six under full recompute (the forward runs again); the e
  ranks are t*c apart, inside a server while t*c*e fits. Exposed unless ``overlap_comm``.
* Data parallelism over d*c replicas (the c ranks of a sequence hold the same weights):
  the gradient all-reduce of plain DP and ZeRO-1/2, or FSDP's (ZeRO-3) weight gathers before
  every forward, recompute and backward, and one reduce-scatter, inside the shard group;
  HSDP adds an all-reduce of the shard across the d/shard_group groups. An expert's
  gradients are exchanged among its d*c/e copies. The exchange runs as the frameworks cut
  it, in buckets or one unit at a time, each piece a collective paying its ring's latency
  (``exchange_collectives``). Everything is taken as exposed unless
  ``overlap_comm``: then the gradients' exchange (DDP's buckets, FSDP's reduce-scatter per
  unit) runs under the last micro-batch's backward, all but the last unit's, FSDP's
  gathers under the rest of the step's compute, and ZeRO-1/2's one gather of the updated
  weights under the next step's first forward, all but the first unit's (Megatron-Core's
  ``overlap_param_gather``). FSDP2 also copies each gathered unit into its parameters and
  each unit's gradients into the reduce-scatter's input on the compute stream
  (``fsdp_copies_s``).

One job: what the axes beyond t and p add to a step; it runs past 300 lines because each
of the three has its own collectives and its own rule for what hides them.

Pure arithmetic, called by ``throughput.estimate``; with c = e = 1 and no shard group each
function gives exactly what the estimate gave before these axes existed.
"""
import math
from dataclasses import replace

from .comm import (group_spans_nodes, ring_all_gather_time_s, ring_allreduce_time_s,
                   ring_reduce_scatter_time_s)
from .compute import attention_core_forward_flops
from .layout import GRAD_DTYPES
from .memory import WEIGHT_BYTES, stage_expert_params, stage_params
from .moe import alltoall_time_s, moe_layer_comm_s


def cp_ring_s(model, lay, cluster, layers, flops_per_s, comm_efficiency):
    """(exposed, hidden) seconds of the K/V ring for one micro-batch on a stage of ``layers``
    layers: per layer, the forward's c-1 blocks against the forward attention, the
    backward's blocks and gradients against twice that; a recompute runs the forward's ring
    again. ``hidden`` is what runs under attention (``overlap.contention_s``); the
    all-gather and Ulysses variants hide nothing."""
    if lay.c == 1:
        return 0.0, 0.0
    # Imported here, not at the top: the package imports this module, and ``python -m
    # lessonlib.costmodel.context`` must find context.py not yet imported.
    from .context import kv_block_bytes, ring_bytes_received_per_rank
    spans = group_spans_nodes(lay.n_gpus, lay.c, lay.t, cluster.gpus_per_node)
    bandwidth, latency = cluster.link(spans)
    bandwidth *= comm_efficiency
    block = kv_block_bytes(model, lay.b, lay.c) / lay.t        # K/V heads split over t
    forwards = 2 if lay.recompute != "none" else 1
    if lay.cp_comm == "torchtitan":
        return cp_torchtitan_s(model, lay, layers, flops_per_s, bandwidth, latency)
    if lay.cp_comm == "allgather":
        # Llama 3 §3.3.2: all-gather K and V (GQA-sized) before attention, exposed;
        # reduce-scatter their gradients after it, exposed as well.
        gather = ring_all_gather_time_s(lay.c, lay.c * block, bandwidth, latency)
        return layers * (forwards + 1) * gather, 0.0
    if lay.cp_comm == "ulysses":
        # q and the output of a/t heads, k and v of kv_heads/t, s/c tokens each (bf16)
        q = 2 * lay.b * (model.s // lay.c) * model.h / lay.t
        one = sum(alltoall_time_s(lay.c, size, bandwidth, latency)
                  for size in (q, block / 2, block / 2, q))
        return layers * (forwards + 1) * one, 0.0
    forward, backward = ring_bytes_received_per_rank(lay.c, block)
    attention = attention_core_forward_flops(model, lay.b) / (lay.t * lay.c) / flops_per_s
    hops = (lay.c - 1) * latency
    fwd, bwd = hops + forward / bandwidth, 2 * hops + backward / bandwidth
    return _under(layers, forwards, (fwd, attention), ((bwd, 2 * attention),))


def _under(layers, forwards, forward, backward):
    """(exposed, hidden) seconds of transfers each run under its own compute: ``forward`` a
    (transfer, compute) pair run ``forwards`` times, ``backward`` a list of pairs run once,
    for each of ``layers`` layers."""
    pairs = [forward] * forwards + list(backward)
    exposed = sum(max(0.0, wire - under) for wire, under in pairs)
    hidden = sum(min(wire, under) for wire, under in pairs)
    return layers * exposed, layers * hidden


def repeated_kv(model):
    """``model`` with K and V repeated to every query head, as torchtitan's attention hands
    them to SDPA (``repeat_kv`` before ``self.sdpa``), so that context parallelism gathers,
    merges and sends a heads' K and V, not the kv_heads of grouped-query attention."""
    return replace(model, kv_heads=model.a) if model.kv_heads else model


def cp_torchtitan_s(model, lay, layers, flops_per_s, bandwidth, latency):
    """(exposed, hidden) seconds of PyTorch's ``context_parallel`` as torchtitan runs it, per
    micro-batch (``_context_parallel/_attention.py``): the all-gather rotate method gathers
    K and V (every query head's: ``repeated_kv``) asynchronously and waits for them after the
    first of the c calls, on the rank's own block, 1/c of its attention; the backward gathers
    them again and passes the float32 dK, dV round the ring, one hop behind each call (its
    all-to-all rotater), the backward taken as twice the forward, as for the ring."""
    from .context import kv_block_bytes     # imported here: see ``cp_ring_s``
    block = kv_block_bytes(repeated_kv(model), lay.b, lay.c) / lay.t
    gather = ring_all_gather_time_s(lay.c, lay.c * block, bandwidth, latency)
    first = attention_core_forward_flops(model, lay.b) / (lay.t * lay.c) / flops_per_s / lay.c
    hop = latency + 2 * block / bandwidth                # float32: twice the bf16 block
    forwards = 2 if lay.recompute != "none" else 1
    return _under(layers, forwards, (gather, first),
                  [(gather, 2 * first)] + [(hop, 2 * first)] * lay.c)


def cp_merge_s(model, lay, layers, hbm_bytes_per_s):
    """Seconds one GPU spends per micro-batch on a stage of ``layers`` layers merging and
    accumulating the ring's c attention calls in float32 (``context.merge_bytes_per_layer``);
    a recompute merges the forward's again. Charged to the ring and to torchtitan's CP
    (PyTorch's all-gather rotate method runs the ring's loop, on K and V repeated to every
    query head); Llama 3's all-gather (§3.3.2) computes the local queries' attention against
    the gathered K/V at once and Ulysses runs one call on all tokens: neither merges."""
    if lay.c == 1 or lay.cp_comm not in ("ring", "torchtitan"):
        return 0.0
    from .context import merge_bytes_per_layer     # imported here: see ``cp_ring_s``
    if lay.cp_comm == "torchtitan":
        model = repeated_kv(model)
    forward, backward = merge_bytes_per_layer(model, lay.b, lay.c, lay.t)
    forwards = 2 if lay.recompute != "none" else 1
    return layers * (forwards * forward + backward) / hbm_bytes_per_s


def ep_alltoall_s(model, lay, cluster, layers, comm_efficiency):
    """Seconds of the MoE all-to-alls for one micro-batch on a stage of ``layers`` layers
    (its MoE share of them); each rank dispatches its b s/c tokens (s/(c t) under SP)."""
    if lay.e == 1:
        return 0.0
    moe = model.moe
    moe_layers = layers * moe.moe_layers / moe.L
    tokens = model.s // lay.c // (lay.t if lay.sequence_parallel else 1)
    spans = group_spans_nodes(lay.n_gpus, lay.e, lay.t * lay.c, cluster.gpus_per_node)
    # FP8 training sends the dispatch (forward) and its gradient's return (backward) in FP8
    # and the two combines in BF16 (DeepSeek-V3 §3.3.4): 1.5 bytes per element on average
    per_element = 1.5 if lay.precision == "fp8" else 2
    one = moe_layer_comm_s(moe, lay.e, lay.b, tokens, cluster, spans, per_element,
                           lay.max_nodes) / comm_efficiency
    return moe_layers * one * (6 / 4 if lay.recompute == "full" else 1)


# How many collectives an exchange runs as, each paying its ring's latency (the alpha of
# every step; ``comm.ring_reduce_scatter_time_s``): PyTorch DDP's buckets of 25 MiB
# (``bucket_cap_mb``); Megatron-Core's distributed optimizer's of max(40M, 1M x d)
# parameters ("larger DP sizes need larger buckets to ensure collectives do not become
# latency-bound", core_v0.8.0 distributed_data_parallel_config.py); DeepSpeed's gradient
# all-reduce in buffers of 5e8 elements (engine.py, ``buffered_allreduce_fallback``); FSDP,
# one unit (a layer) at a time. Without ``overlap_comm`` Megatron reduces its whole buffer at
# once (Megatron-Core sets ``bucket_size`` to None without ``overlap_grad_reduce``; the local
# DDP of 2021 all-reduced its contiguous buffer in one call).
DDP_BUCKET_BYTES = 25 * 2 ** 20
MCORE_BUCKET_PARAMS, MCORE_BUCKET_PARAMS_PER_REPLICA = 40_000_000, 1_000_000
DEEPSPEED_BUCKET_ELEMENTS = 500_000_000


def exchange_collectives(lay, params, group, units):
    """How many collectives the data-parallel exchange of ``params`` parameters over
    ``group`` replicas runs as (above): FSDP's per unit of ``units``, else buckets."""
    if lay.zero_stage == 3:
        return units
    if lay.zero_reduce == "all-reduce" and lay.zero_stage > 0:
        return max(1, math.ceil(params / DEEPSPEED_BUCKET_ELEMENTS))
    if not lay.overlap_comm:
        return 1
    if lay.zero_stage == 0:
        return max(1, math.ceil(params * GRAD_DTYPES[lay.reduce_dtype] / DDP_BUCKET_BYTES))
    return max(1, math.ceil(params / max(MCORE_BUCKET_PARAMS,
                                         MCORE_BUCKET_PARAMS_PER_REPLICA * group)))


def _exchange_s(lay, params, group, shard, bandwidth, latency, units=1):
    """One parameter group's data-parallel exchange over ``group`` replicas, ZeRO/FSDP
    sharded over ``shard`` of them: (exposed-able gathers, the rest) in seconds, run as
    ``exchange_collectives`` collectives of equal size, each paying its latency. Gradients
    travel in ``lay.reduce_dtype``, weights in 16 bits."""
    k = exchange_collectives(lay, params, group, units)
    gathers, rest = _exchange_once_s(lay, params / k, group, shard, bandwidth, latency)
    return k * gathers, k * rest


def _exchange_once_s(lay, params, group, shard, bandwidth, latency):
    """``_exchange_s`` as one collective of each kind."""
    grads = GRAD_DTYPES[lay.reduce_dtype] * params
    weights = WEIGHT_BYTES * params
    if lay.zero_stage == 0:
        return 0.0, ring_allreduce_time_s(group, grads, bandwidth, latency)
    if lay.zero_stage < 3:
        # ZeRO-1/2 reduce-scatter gradients and all-gather the updated weights once a step:
        # an all-reduce's steps, the gathers apart (``dp_time_s`` hides them differently);
        # ``zero_reduce="all-reduce"`` exchanges the gradients whole first
        reduce = ring_allreduce_time_s if lay.zero_reduce == "all-reduce" else \
            ring_reduce_scatter_time_s
        return (ring_all_gather_time_s(group, weights, bandwidth, latency),
                reduce(group, grads, bandwidth, latency))
    rest = ring_reduce_scatter_time_s(shard, grads, bandwidth, latency)
    if shard < group:   # HSDP: the shard's gradients all-reduced across the groups
        rest += ring_allreduce_time_s(group // shard, grads / shard, bandwidth, latency)
    return zero3_gathers(lay) * ring_all_gather_time_s(shard, weights, bandwidth, latency), rest


def zero3_gathers(lay):
    """How often a step all-gathers each ZeRO-3 unit's weights: before every forward,
    recompute and backward of every micro-batch (the gradients are reduce-scattered once, ZeRO
    §7.2: 1.5x at m=1); under a pipeline of several micro-batches once a step, kept
    (torchtitan's ``apply_fsdp``: no reshard after the forward "to avoid per-microbatch
    all-gathers"), as ``memory.memory_per_gpu`` holds them."""
    return 1 if lay.p > 1 and lay.m > 1 else lay.m * (3 if lay.recompute == "full" else 2)


def fsdp_copies_s(model, lay, hbm_bytes_per_s):
    """Seconds a step spends on FSDP2's copies on the compute stream, memory-bound: after
    each all-gather, ``split_with_sizes_copy`` from the gathered buffer into the unit's
    parameters, 16 bits read and written (``foreach_all_gather_copy_out``, run on the current
    stream once the gather's event is waited for); before each reduce-scatter, ``chunk_cat``
    of the 16-bit gradients into its input in the reduce dtype
    (``foreach_reduce_scatter_copy_in``, run before the reduce-scatter stream waits on the
    current one; torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py, torch 2.13).
    FSDP2 since torchtitan's first release (its ``fully_shard``). 0 but under FSDP2's ZeRO-3
    over more than one GPU: Megatron-Core's FSDP copies neither way (``layout.FSDP_IMPLS``)."""
    if lay.zero_stage != 3 or (lay.shard_group or lay.d) * lay.c == 1 or \
            lay.fsdp_impl == "megatron":
        return 0.0
    params = stage_params(model, lay.t, lay.p, lay.e, lay.uneven_stages, lay.schedule)
    per_param = (zero3_gathers(lay) * 2 * WEIGHT_BYTES
                 + WEIGHT_BYTES + GRAD_DTYPES[lay.reduce_dtype])
    return per_param * params / hbm_bytes_per_s


def dp_time_s(model, lay, cluster, busy_s, comm_efficiency, dp_overlap):
    """(exposed, hidden) seconds of the data-parallel exchange of a step whose micro-batches
    keep the stage busy ``busy_s`` (GEMMs, memory-bound kernels and the TP, PP, CP and EP
    transfers left exposed): dense weights over the d*c replicas, experts over d*c/e;
    ``hidden`` is what ``overlap_comm`` runs beside that (FSDP's gathers, the gradients'
    buckets; ``overlap.contention_s``). The exchange runs on a stream of its own
    (Megatron-Core core_v0.8.0 launches its buckets with ``async_op=overlap_grad_reduce``,
    param_and_grad_buffer.py, on the communicator's NCCL stream; FSDP2 gathers and
    reduce-scatters on streams of its own), so it runs beside every kernel of the backward
    on the compute stream, the TP collectives among them, not only beside the GEMMs."""
    group = lay.d * lay.c
    if group == 1:
        return 0.0, 0.0
    n = lay.n_gpus
    bandwidth, latency = cluster.group_link(n, lay.d, lay.t * lay.c) if lay.d > 1 \
        else (float("inf"), 0.0)
    if lay.c > 1:
        cp_bw, cp_lat = cluster.group_link(n, lay.c, lay.t)
        bandwidth, latency = min(bandwidth, cp_bw), max(latency, cp_lat)
    bandwidth *= comm_efficiency
    # DDP's all-reduce of the dense weights' gradients runs NVLS inside one server
    dense = bandwidth * (cluster.allreduce_speedup(n, lay.d, lay.t * lay.c)
                         if lay.zero_stage == 0 and lay.c == 1 else 1.0)
    shard = (lay.shard_group or lay.d) * lay.c
    where = (lay.t, lay.p, lay.e, lay.uneven_stages, lay.schedule)
    params = stage_params(model, *where)
    experts = stage_expert_params(model, *where)
    units = max(1, model.L // lay.p)
    gathers, rest = _exchange_s(lay, params - experts, group, shard, dense, latency, units)
    if experts and group // lay.e > 1:
        more = _exchange_s(lay, experts, group // lay.e, max(1, shard // lay.e), bandwidth,
                           latency, units)
        gathers, rest = gathers + more[0], rest + more[1]
    if not lay.overlap_comm:
        return (1 - dp_overlap) * (gathers + rest), 0.0
    # DDP's buckets and FSDP's per-unit reduce-scatters start as the last micro-batch's
    # backward frees each unit's gradients, so they run under the rest of that backward (two
    # thirds of the micro-batch's busy time); the last unit's has nothing left to hide
    # behind. FSDP's gathers, repeated every micro-batch, hide under whatever busy time that
    # leaves. ZeRO-1/2's gather of the updated weights runs once, ahead of the next step's
    # first forward (Megatron-Core's overlap_param_gather: each layer's gather started as
    # the forward reaches the one before it), so it hides under one micro-batch's forward,
    # all but the first unit's. Under the interleaved schedule each model chunk's exchange
    # has more compute beside it (``_chunk_hidden``).
    if lay.zero_stage == 3:
        hidden_rest = min(rest - rest / units, busy_s / lay.m * 2 / 3)
        hidden = hidden_rest + min(gathers, busy_s - hidden_rest)
        return (1 - dp_overlap) * (gathers + rest - hidden), hidden
    one = busy_s / lay.m                # a micro-batch: a third forward, two backward
    hidden = (_chunk_hidden(rest, lay, units, one * 2 / 3)
              + _chunk_hidden(gathers, lay, units, one / 3))
    return (1 - dp_overlap) * (gathers + rest - hidden), hidden


def _chunk_hidden(seconds, lay, units, window):
    """Seconds of a DDP or ZeRO-1/2 exchange (``seconds`` for the stage's ``units`` units)
    hidden under compute, chunk by chunk. Megatron-Core starts a model chunk's gradient
    buckets at that chunk's last micro-batch's backward (``schedules.py``: grad sync enabled
    by ``is_last_microbatch_for_model_chunk``), and the interleaved schedule's backward runs
    the chunks from last to first, p micro-batches each (``get_model_chunk_id``), so on the
    first stage chunk j's exchange has its own last backward and j*p chunk backwards after
    it to run under; its weights' gather, chained bucket by bucket through the forward
    pre-hooks, has as many forwards before the chunk's first. Chunk 0's last unit has
    nothing after it. ``window``: one micro-batch's backward (two thirds of its GEMMs) for
    the gradients, its forward (a third) for the gathers; a chunk's is 1/v of it."""
    if seconds == 0:
        return 0.0
    chunk, units = seconds / lay.v, max(1, units // lay.v)
    return sum(min(chunk - (chunk / units if j == 0 else 0.0),
                   (1 + j * lay.p) * window / lay.v) for j in range(lay.v))
