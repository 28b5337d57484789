"""Mixture-of-experts models as the cost model sees them: total vs active parameters, the
FLOPs that count, expert-parallel memory and the all-to-all's time.

What it teaches: an MoE model is priced twice. Memory pays for every parameter (all E
experts of every MoE layer must live somewhere); compute pays only for the active ones
(the k routed experts a token visits, plus the shared experts and everything dense), so
training costs 6 x active parameters FLOPs per token (forward 2, backward 4), not 6 x
total. Expert parallelism splits the experts over e GPUs, and pays for it with four
all-to-alls per MoE layer and micro-batch (dispatch and return, forward and backward), each
rank sending the (e-1)/e of its b s k routed token vectors that live elsewhere.

The presets are built from the published shapes and checked (tests) against the published
totals: Mixtral 8x7B (Jiang et al. 2024, abstract: 47B total, 13B active) and DeepSeek-V3
(DeepSeek-AI 2024: 671 B total, 37 B active; 3 dense layers then 58 MoE layers of 256 routed
experts and 1 shared, top-8, multi-head latent attention). ``moe-1T`` is DeepSeek-V3's shape
with 384 routed experts: 1.0 T parameters, still 37 B active.

Pure: no torch. Try ``python -c "from lessonlib.costmodel.moe import MOE_MODELS as M,
total_params, active_params; m = M['mixtral-8x7B']; print(total_params(m), active_params(m))"``
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from lessonlib.argcheck import positive_int

from .alpha_beta import allreduce_terms
from .comm import ring_allreduce_time_s
from .hardware import GPUS
from .memory import BYTES_PER_PARAM, OPTIMIZER_BYTES, usable_memory_bytes


def gqa_attention_params(h: int, heads: int, kv_heads: int) -> int:
    """Q and output projections h x h each, K and V h x (kv_heads * h / heads) each."""
    return 2 * h * h + 2 * h * kv_heads * (h // heads)


def mla_attention_params(h: int, heads: int, q_rank: int, kv_rank: int, nope: int, rope: int,
                         v: int) -> int:
    """DeepSeek's multi-head latent attention: queries and keys/values through low-rank
    projections (with their norms), a shared rotary key, the output projection."""
    q = h * q_rank + q_rank + q_rank * heads * (nope + rope)
    kv = h * (kv_rank + rope) + kv_rank + kv_rank * heads * (nope + v)
    return q + kv + heads * v * h


@dataclass(frozen=True)
class MoEModel:
    """A decoder whose last ``moe_layers`` of L layers are MoE layers (the others dense).

    ``ffn_matrices``: 2 for a GeLU MLP, 3 for SwiGLU. An MoE layer has ``E`` routed experts of
    inner width ``expert_ffn`` (a token visits ``k`` of them), ``shared`` experts every token
    visits, and a router of h x E; a dense layer one MLP of width ``ffn``."""
    name: str
    L: int
    h: int
    V: int
    attention: int          # parameters of one layer's attention
    ffn: int
    E: int
    k: int
    expert_ffn: int
    moe_layers: int
    shared: int = 0
    ffn_matrices: int = 3
    tied_embeddings: bool = False

    def __post_init__(self):
        for field in ("L", "h", "V", "attention", "ffn", "E", "k", "expert_ffn"):
            positive_int(field, getattr(self, field))
        if not 0 <= self.moe_layers <= self.L or self.k > self.E or self.shared < 0:
            raise ValueError(f"need 0 <= moe_layers={self.moe_layers} <= L={self.L}, "
                             f"k={self.k} <= E={self.E} and shared={self.shared} >= 0")


def expert_params(m: MoEModel) -> int:
    """One expert: ``ffn_matrices`` matrices of h x expert_ffn."""
    return m.ffn_matrices * m.h * m.expert_ffn


def _dense_params(m: MoEModel) -> float:
    """Every parameter outside the routed experts: attention, norms, dense MLPs, shared
    experts, routers, embeddings (and the output layer unless tied)."""
    per_layer = m.attention + 2 * m.h
    dense_mlps = (m.L - m.moe_layers) * m.ffn_matrices * m.h * m.ffn
    moe_extra = m.moe_layers * (m.shared * expert_params(m) + m.h * m.E)
    embeddings = m.V * m.h * (1 if m.tied_embeddings else 2) + m.h
    return m.L * per_layer + dense_mlps + moe_extra + embeddings


def total_params(m: MoEModel) -> float:
    """Every parameter: what memory pays for."""
    return _dense_params(m) + m.moe_layers * m.E * expert_params(m)


def active_params(m: MoEModel) -> float:
    """The parameters one token uses: the dense ones and k routed experts per MoE layer."""
    return _dense_params(m) + m.moe_layers * m.k * expert_params(m)


def training_flops_per_token(m: MoEModel) -> float:
    """6 x active parameters (forward 2, backward 4; attention scores left out)."""
    return 6 * active_params(m)


@dataclass(frozen=True)
class EPMemory:
    """Model state bytes per GPU under expert parallelism: the routed experts', the rest's,
    and their sum."""
    experts: float
    dense: float
    total: float


def ep_memory_per_gpu(m: MoEModel, e: int, p: int = 1, d: int | None = None,
                      zero1: bool = False) -> EPMemory:
    """Model state per GPU (mixed-precision Adam: 4 bytes of 16-bit weights and gradients
    and 12 of fp32 state per parameter) with the routed experts split over e GPUs, the
    layers over p pipeline stages, and, with ``zero1``, the fp32 state sharded over the d
    data-parallel GPUs of a stage (an expert's over its d/e copies), in bytes. Activations
    are left out."""
    d = e if d is None else d
    if e < 1 or m.E % e or d % e:
        raise ValueError(f"e={e!r} must divide E={m.E} and d={d} (each GPU holds E/e experts; "
                         f"the expert-parallel group sits inside the d data-parallel GPUs)")
    state = BYTES_PER_PARAM - OPTIMIZER_BYTES
    experts = m.moe_layers * m.E * expert_params(m) / (e * p)
    dense = _dense_params(m) / p
    experts = experts * (state + OPTIMIZER_BYTES / ((d // e) if zero1 else 1))
    dense = dense * (state + OPTIMIZER_BYTES / (d if zero1 else 1))
    return EPMemory(experts=experts, dense=dense, total=experts + dense)


# ---------------------------------------------------------------- the all-to-all
def alltoall_terms(e: int, bytes_per_rank: float, links: str = "dedicated") -> tuple[float, float]:
    """(latencies paid, bytes that set the pace) of an all-to-all in which each of e ranks
    sends ``bytes_per_rank`` spread evenly over the e ranks (itself included): e - 1
    exchanges of a 1/e slice, like the naive ring's e - 1 steps of a whole buffer. On
    dedicated links the busiest link carries (e-1)/e of a rank's bytes; on a shared medium
    (CPU ranks on one machine) all ranks' (e-1) slices go through it."""
    return allreduce_terms("naive_ring", e, bytes_per_rank / e, links)


def alltoall_time_s(e: int, bytes_per_rank: float, bandwidth: float, latency: float = 0.0,
                    links: str = "dedicated") -> float:
    """alpha-beta time of one all-to-all; ``bandwidth`` in bytes per second per rank."""
    latencies, nbytes = alltoall_terms(e, bytes_per_rank, links)
    return latencies * latency + nbytes / bandwidth


def dispatch_bytes(b: int, s: int, h: int, k: int, bytes_per_element: int = 2) -> float:
    """What one rank's dispatch all-to-all carries for one micro-batch: its b s tokens' k
    routed copies of h elements (the return trip carries as much back)."""
    return b * s * k * h * bytes_per_element


def moe_layer_comm_s(m: MoEModel, e: int, b: int, s: int, cluster, spans_nodes: bool,
                     bytes_per_element: int = 2, max_nodes: int | None = None) -> float:
    """Four all-to-alls (dispatch and return, forward and backward) of one MoE layer for one
    micro-batch. Inside one server all (e-1)/e of a rank's bytes go over NVLink; across
    servers of g GPUs, the (e-g)/e bound for other servers take the GPU's network share and
    the (g-1)/e for its own server NVLink, side by side, and the e - 1 exchanges pay the
    network's latency.

    ``max_nodes`` M: node-limited routing (DeepSeek-V3 §2.1.2, M = 4): a token's k experts
    sit on at most M servers, and it crosses the network once per server, forwarded to its
    experts there over NVLink (§3.2.2): min(M, k) copies, (servers-1)/servers of them bound
    for other servers, instead of k (e-g)/e."""
    size = dispatch_bytes(b, s, m.h, m.k, bytes_per_element)
    if not spans_nodes:
        bandwidth, latency = cluster.link(False)
        return 4 * alltoall_time_s(e, size, bandwidth, latency)
    g = min(cluster.gpus_per_node, e)
    network, latency = cluster.link(True)
    nvlink = cluster.link(False)[0]
    crossing = size * (e - g) / e
    if max_nodes is not None:
        servers = -(-e // g)
        crossing = size / m.k * min(max_nodes, m.k, servers) * (servers - 1) / servers
    one = (e - 1) * latency + max(crossing / network, size * (g - 1) / e / nvlink)
    return 4 * one


def tp_layer_comm_s(h: int, t: int, b: int, s: int, cluster, spans_nodes: bool,
                    bytes_per_element: int = 2) -> float:
    """The MLP's share of tensor parallelism for one micro-batch: one all-reduce of b s h
    elements forward (g) and one backward (f), ring times (Megatron-LM 2021 §3.2)."""
    bandwidth, latency = cluster.link(spans_nodes)
    return 2 * ring_allreduce_time_s(t, b * s * h * bytes_per_element, bandwidth, latency)


@dataclass(frozen=True)
class EPvsTP:
    """One MoE layer's communication on n GPUs, expert against tensor parallelism, whether
    the n GPUs span servers, and the width of each way's expert GEMMs."""
    n: int
    ep_comm_s: float
    tp_comm_s: float
    across_servers: bool
    ep_gemm_width: float
    tp_gemm_width: float


def ep_vs_tp(m: MoEModel, n: int, b: int, s: int, cluster) -> EPvsTP:
    """The same experts on n GPUs two ways, for one MoE layer and n micro-batches of b s
    tokens (the same tokens, the same FLOPs per GPU either way):

    * expert parallelism, e = n: each GPU its own micro-batch and E/n whole experts; four
      all-to-alls of its k b s routed tokens;
    * tensor parallelism, t = n: the n GPUs take the micro-batches one after another, each
      expert sliced n ways; two all-reduces of b s h per micro-batch (f and g).

    Inside one server if n fits in it. EP's bytes per GPU: 4 k (n-1)/n b s h; TP's:
    n x 4 (n-1)/n b s h, so EP moves n/k times less, and keeps each GEMM whole."""
    across = n > cluster.gpus_per_node
    ep = moe_layer_comm_s(m, n, b, s, cluster, across)
    tp = n * tp_layer_comm_s(m.h, n, b, s, cluster, across)
    return EPvsTP(n=n, ep_comm_s=ep, tp_comm_s=tp, across_servers=across,
                  ep_gemm_width=m.expert_ffn, tp_gemm_width=m.expert_ffn / n)


@dataclass(frozen=True)
class EPChoice:
    """An expert-parallel size e, the model state per GPU it leaves, whether that fits, and
    whether the e GPUs sit in one server."""
    e: int
    memory_per_gpu: float
    fits: bool
    inside_server: bool


def choose_e(m: MoEModel, n_gpus: int, cluster, p: int = 1, zero1: bool = True) -> EPChoice:
    """The smallest e (dividing E and the n_gpus/p data-parallel GPUs) whose model state
    fits a GPU's usable memory (``usable_memory_bytes``; activations left out), with p pipeline
    stages: the fewest GPUs an expert's tokens must travel to."""
    d = n_gpus // p
    usable = usable_memory_bytes(cluster.gpu)
    rows = []
    for e in range(1, min(m.E, d) + 1):
        if m.E % e == 0 and d % e == 0:
            memory = ep_memory_per_gpu(m, e, p, d, zero1).total
            rows.append(EPChoice(e=e, memory_per_gpu=memory, fits=memory <= usable,
                                 inside_server=e <= cluster.gpus_per_node))
    fitting = [r for r in rows if r.fits]
    return fitting[0] if fitting else rows[-1]


def _deepseek(name: str, E: int) -> MoEModel:
    attention = mla_attention_params(7168, 128, 1536, 512, 128, 64, 128)
    return MoEModel(name, L=61, h=7168, V=129280, attention=attention, ffn=18432, E=E, k=8,
                    expert_ffn=2048, moe_layers=58, shared=1)


MOE_MODELS = {
    # Jiang et al. 2024: 32 layers, h 4096, 32 heads with 8 KV heads, SwiGLU 14336, V 32000
    "mixtral-8x7B": MoEModel("mixtral-8x7B", L=32, h=4096, V=32000,
                             attention=gqa_attention_params(4096, 32, 8), ffn=14336, E=8, k=2,
                             expert_ffn=14336, moe_layers=32),
    # DeepSeek-AI 2024 (arXiv 2412.19437): the main model, without the MTP module
    "deepseek-v3": _deepseek("deepseek-v3", 256),
    "moe-1T": _deepseek("moe-1T", 384),
}

# As the papers state them, to the billion (Mixtral's abstract; DeepSeek-V3's §1, Table 1).
PUBLISHED = {"mixtral-8x7B": (47e9, 13e9), "deepseek-v3": (671e9, 37e9)}


def describe(m: MoEModel) -> str:
    """One line: total and active parameters, and the shape that gives them."""
    return (f"{m.name}: {total_params(m) / 1e9:.1f} B total, {active_params(m) / 1e9:.1f} B "
            f"active (L={m.L}, h={m.h}, {m.moe_layers} MoE layers of E={m.E}, k={m.k}"
            f"{f', {m.shared} shared' if m.shared else ''}, expert width {m.expert_ffn})")


@dataclass(frozen=True)
class OneTrillion:
    """``one_trillion``'s answer: the MoE's total and active parameters, its model state and
    the dense model's in bytes, the dense model's FLOPs per token over the MoE's, and the
    fewest 80 GB GPUs that hold the MoE's state."""
    moe_total: float
    moe_active: float
    moe_state_bytes: float
    dense_state_bytes: float
    flops_ratio_dense_over_moe: float
    min_gpus_80GB: int


def one_trillion(dense_params: float, moe: MoEModel = MOE_MODELS["moe-1T"]) -> OneTrillion:
    """The lesson's question asked of a 1 T MoE: the same model state to hold as a dense
    model of ``dense_params``, but only its active parameters' FLOPs per token."""
    return OneTrillion(moe_total=total_params(moe), moe_active=active_params(moe),
                       moe_state_bytes=BYTES_PER_PARAM * total_params(moe),
                       dense_state_bytes=BYTES_PER_PARAM * dense_params,
                       flops_ratio_dense_over_moe=6 * dense_params
                       / training_flops_per_token(moe),
                       min_gpus_80GB=math.ceil(BYTES_PER_PARAM * total_params(moe)
                                               / usable_memory_bytes(GPUS["H100-SXM5"])))
