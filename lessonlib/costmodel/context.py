"""Context parallelism in the cost model: attention work per rank, the key/value ring, memory.

What it teaches: with the sequence split over c ranks, each rank computes attention for its
s/c queries against all s keys, which ring attention brings it in c steps of one key/value
block each. Three numbers decide whether that is worth it:

* the work per rank: under a causal mask a query at position i scores i+1 keys; a contiguous
  split gives the rank holding the last tokens about 2c-1 times the first's work, the
  zig-zag split (rank i holds chunks i and 2c-1-i of 2c) gives every rank the same;
* the ring: each step moves one block of K and V, 2 b (s/c) kv_heads (h/a) values; it hides
  behind the step's compute, on average half a block's 4 b (s/c)^2 h FLOPs under a causal
  mask (QK^T and PV at 2 FLOPs per multiply-add), when s/c is long enough; grouped-query
  attention (kv_heads < a) makes the block smaller; tensor parallelism over t splits the
  heads, so a GPU computes and moves 1/t of both;
* activations: every tensor a layer saves is s/c tokens long, so memory per rank is 1/c.

Pure arithmetic, no torch; ``model`` is a ``costmodel.model.GPT``.

Laptop:  ``python -m lessonlib.costmodel.context`` (Llama 3 405B at 128K tokens, c = 16)
GPU box: the same; nothing here runs on a device.
"""
from __future__ import annotations

from dataclasses import dataclass

from lessonlib.argcheck import positive_int
from lessonlib.costmodel.comm import tp_elements_per_layer
from lessonlib.costmodel.memory import activation_bytes, activation_bytes_per_layer
from lessonlib.costmodel.model import GPT, MODELS

LAYOUTS = ("contiguous", "zigzag")

# Llama 3 405B's attention (the ``llama3-405B`` preset, Dubey et al. 2024: h, heads, KV
# heads, V) at the 128K tokens of its long-context stage, where it switched context
# parallelism on. Built as a Megatron-LM 2021 layer (no ``ffn``): this module and lesson 12
# count attention, K/V traffic and Korthikanti's activations, which need no more; the
# preset itself counts the SwiGLU parameters.
_PRESET = MODELS["llama3-405B"]
LLAMA3_405B = GPT(_PRESET.L, _PRESET.h, _PRESET.a, 131072, _PRESET.V, _PRESET.name,
                  kv_heads=_PRESET.kv_heads)


def _check(c, layout):
    positive_int("c", c, what="the context-parallel ranks")
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r} must be one of {LAYOUTS}")


def chunks_of(rank, c, layout="zigzag"):
    """The chunks rank ``rank`` holds: (rank,) of c, or (rank, 2c-1-rank) of 2c."""
    _check(c, layout)
    return (rank,) if layout == "contiguous" else (rank, 2 * c - 1 - rank)


def causal_pairs_per_rank(s, c, layout="zigzag", causal=True):
    """The (query, key) scores each of the c ranks computes for one sequence and one head:
    a chunk of n tokens scores n^2 against an earlier chunk, n(n+1)/2 against itself."""
    _check(c, layout)
    pieces = c * (2 if layout == "zigzag" else 1)
    if s % pieces:
        raise ValueError(f"s={s} must be a multiple of {pieces} ({layout}, c={c})")
    n = s // pieces
    if not causal:
        return [s * s // c] * c
    return [sum(qc * n * n + n * (n + 1) // 2 for qc in chunks_of(r, c, layout)) for r in range(c)]


def imbalance(s, c, layout="zigzag"):
    """The busiest rank's causal attention work over the least busy's."""
    work = causal_pairs_per_rank(s, c, layout)
    return max(work) / min(work)


def attention_flops_per_rank(model, b, c, layout="zigzag", causal=True):
    """Forward FLOPs of one layer's QK^T and PV per rank: 4 h (h/a per head, a heads) per
    (query, key) score computed, for b sequences."""
    return [4 * b * model.h * pairs for pairs in causal_pairs_per_rank(model.s, c, layout, causal)]


def kv_heads(model):
    return model.kv_heads or model.a


def kv_block_bytes(model, b, c, bytes_per_value=2):
    """One block that travels the ring: K and V of s/c tokens, kv_heads heads of h/a."""
    return 2 * b * (model.s // c) * kv_heads(model) * (model.h // model.a) * bytes_per_value


def ring_bytes_received_per_rank(c, block_bytes):
    """(forward, backward) bytes each rank receives per layer: c-1 blocks forward; backward
    the c-1 blocks again plus c hops of their gradients (the last hop home), as large."""
    if c == 1:
        return 0, 0
    return (c - 1) * block_bytes, (c - 1) * block_bytes + c * block_bytes


@dataclass(frozen=True)
class RingStep:
    """One ring step on one GPU (``ring_step``): compute and transfer in seconds, whether the
    compute hides the transfer, and the transfer left exposed."""
    compute_s: float
    transfer_s: float
    hidden: bool
    exposed_s: float


def ring_step(model, b, c, flops_per_s, link_bytes_per_s, bytes_per_value=2, layout="zigzag",
              t=1) -> RingStep:
    """One forward step of the ring on one GPU of the busiest rank: its compute (the rank's
    causal work over its c steps, on average) against one block's transfer, and whether the
    compute hides the transfer (the transfer is posted first). With tensor parallelism over
    t GPUs the rank's heads are split over them: each GPU computes 1/t of the step and moves
    1/t of the block (its kv_heads/t K/V heads) over its own link."""
    _check_t(model, t)
    flops = max(attention_flops_per_rank(model, b, c, layout)) / c / t
    compute = flops / flops_per_s
    transfer = kv_block_bytes(model, b, c, bytes_per_value) / t / link_bytes_per_s
    return RingStep(compute_s=compute, transfer_s=transfer, hidden=compute >= transfer,
                    exposed_s=max(0.0, transfer - compute))


def shortest_hidden_shard(model, flops_per_s, link_bytes_per_s, bytes_per_value=2):
    """The fewest tokens per rank, n = s/c, at which a zig-zag ring step's compute hides its
    block's transfer, as ``ring_step`` counts them. Under a causal mask a step keeps on
    average n^2/2 of a block's n^2 scores (every zig-zag step: two of its four chunk pairs),
    at 4 h FLOPs each; the block is 2 n kv_heads (h/a) values. Per GPU at any t, both / t:

        2 b n^2 h / F  >=  2 b n kv (h/a) bytes / B   =>   n >= kv bytes F / (a B)."""
    return kv_heads(model) * bytes_per_value * flops_per_s / (model.a * link_bytes_per_s)


def _check_t(model, t):
    positive_int("t", t, what="the tensor-parallel GPUs that split the heads")
    if kv_heads(model) % t:
        raise ValueError(f"t={t} must divide the K/V heads ({kv_heads(model)}): each GPU "
                         f"moves its own kv_heads/t of them")


def activation_bytes_per_rank(model, b, c, t=1, sequence_parallel=True, recompute="none"):
    """Activation bytes of one layer on one rank: Korthikanti et al.'s per-layer count for
    the whole sequence, divided by c (each saved tensor is s/c tokens long)."""
    return activation_bytes_per_layer(model, b, t, sequence_parallel, recompute) / c


def activation_bytes_per_gpu(model, t, p, c, b=1):
    """Activations on a first-stage GPU at its peak: 1F1B with p micro-batches in flight,
    selective recompute and sequence parallelism (Korthikanti et al. 2022), divided by c.
    A longer pipeline does not shrink it (each stage holds p micro-batches of L/p layers);
    t divides it, and so does c."""
    return activation_bytes(model, t, p, b, p, recompute="selective",
                            sequence_parallel=True) / c


def comm_bytes_per_layer(model, b, t, c, bytes_per_value=2):
    """Per GPU and layer, forward and backward: (bytes tensor parallelism sends over its t
    GPUs for this rank's s/c tokens, 8 b (s/c) h (t-1)/t values; bytes the K/V ring brings
    in, the K/V heads split over t)."""
    tp = tp_elements_per_layer(b, model.s // c, model.h, t) * bytes_per_value
    ring = sum(ring_bytes_received_per_rank(c, kv_block_bytes(model, b, c, bytes_per_value) / t))
    return tp, ring


# ---------------------------------------------------------------- the three methods
METHODS = ("ring", "allgather", "ulysses")


def cp_bytes_sent_per_rank(method, c, b, s, heads, kv_heads, head_dim, bytes_per_value=2):
    """(forward, backward) bytes one rank sends to the other c-1 ranks for one attention
    call, its shard s/c tokens long; q (and the output) of ``heads`` heads, K and V of
    ``kv_heads`` each, ``head_dim`` values per head:

    * ring: the K/V block (2 b (s/c) kv_heads head_dim) c-1 times forward; backward c-1
      times again plus c hops of its gradients;
    * allgather: (c-1)/c of the whole K and V forward (the all-gather), as much backward
      (the reduce-scatter of their gradients);
    * ulysses: (c-1)/c of each of four tensors, q, k, v in and the output back (the
      gradients retrace them backward); with GQA the k, v all-to-alls are smaller."""
    if method not in METHODS:
        raise ValueError(f"method={method!r} must be one of {', '.join(METHODS)}")
    positive_int("c", c, what="the context-parallel ranks")
    if c == 1:
        return 0, 0
    n = s // c
    q = b * heads * n * head_dim * bytes_per_value           # q's shard; the output's too
    kv = 2 * b * kv_heads * n * head_dim * bytes_per_value   # K and V's shards
    if method == "ring":
        return ring_bytes_received_per_rank(c, kv)
    if method == "allgather":
        return (c - 1) * kv, (c - 1) * kv
    sent = (c - 1) * (2 * q + kv) // c
    return sent, sent


# ---------------------------------------------------------------- merging the c calls
# PyTorch's ``context_parallel`` (``_context_parallel/_attention.py``, which torchtitan runs)
# merges the c partial outputs of a layer's attention in float32 with eager kernels, HBM
# bytes per element of the output (the query's shape) at each step after the first: the
# block's output cast to float32 (read 2, write 4), ``out - block_out`` (4 + 4, 4),
# its product with the sigmoid of the log-sum-exp difference (4, 4) and the subtraction
# from ``out`` (4 + 4, 4).
MERGE_BYTES = 6 + 12 + 8 + 12
# Backward, every one of the c steps accumulates the gradients in float32: dQ's
# ``grad_query += grad_query_`` (read 4 + 2, write 4) per query element; per element of K
# and of V the same add (10), the float32 ``torch.cat`` that sends them on (4, 4) and, on
# about half the steps, ``_partial_update``'s chunk-and-cat copy of the whole tensor
# (4, 4: 4 on average). Each step also copies K and V into one buffer (``torch.cat``,
# read 2, write 2), forward and backward.
GRAD_ACCUMULATE_BYTES = 10
KV_GRAD_BYTES = 10 + 8 + 4
KV_CAT_BYTES = 2 + 2


def merge_bytes_per_layer(model, b, c, t=1):
    """(forward, backward) HBM bytes one GPU moves per layer outside the attention kernel
    to run its c calls as PyTorch's context parallelism does: the float32 merge of the
    c-1 later outputs, the float32 gradient accumulation of all c, the K/V copies."""
    if c == 1:
        return 0.0, 0.0
    qk_dim, v_dim = model.qk_v_head_dims()
    tokens = b * (model.s // c)
    out = tokens * model.a / t * v_dim                      # the output, as the query
    kv = tokens * kv_heads(model) / t * (qk_dim + v_dim)   # K and V together
    forward = (c - 1) * (MERGE_BYTES * out + KV_CAT_BYTES * kv)
    backward = c * (GRAD_ACCUMULATE_BYTES * out + (KV_GRAD_BYTES + KV_CAT_BYTES) * kv)
    return forward, backward


def document_of(doc_lengths):
    """Each token's document: [0]*len0 + [1]*len1 + ...; and each document's first token."""
    starts, ids = [], []
    for doc, length in enumerate(doc_lengths):
        positive_int("document length", length, what="tokens")
        starts.append(len(ids))
        ids += [doc] * length
    return ids, starts


def document_pairs_per_step(doc_lengths, c, layout="zigzag"):
    """[rank][step]: the (query, key) scores a causal document mask keeps between rank r's
    queries and the key/value block it holds at ring step i (that of rank (r - i) mod c),
    per sequence and head. Summed over the steps it is the rank's work under all-gather."""
    ids, starts = document_of(doc_lengths)
    s = len(ids)
    pieces = c * (2 if layout == "zigzag" else 1)
    _check(c, layout)
    if s % pieces:
        raise ValueError(f"the documents' {s} tokens must split into {pieces} equal chunks "
                         f"({layout}, c={c}); make them add up to a multiple of {pieces}")
    n = s // pieces
    spans = [[(i * n, (i + 1) * n) for i in chunks_of(r, c, layout)] for r in range(c)]

    def kept(queries, keys):   # keys in [first token of the query's document, the query]
        return sum(max(0, min(hi, p + 1) - max(lo, starts[ids[p]]))
                   for q_lo, q_hi in queries for p in range(q_lo, q_hi) for lo, hi in keys)
    return [[kept(spans[r], spans[(r - i) % c]) for i in range(c)] for r in range(c)]


@dataclass(frozen=True)
class DocumentWork:
    """``document_work``'s kept scores: [rank][step], per rank, and the ring's, all-gather's
    and an even split's time in scores."""
    per_step: list
    per_rank: list
    ring: int
    allgather: int
    even: float


def document_work(doc_lengths, c, layout="zigzag") -> DocumentWork:
    """Ring vs all-gather under a causal document mask, in kept scores: the ring's ranks
    wait for each other every step, so a step lasts its busiest rank's work (``ring``: the
    sum over steps of the per-step maximum); all-gather does each rank's work in one go
    (``allgather``: the busiest rank's total); ``even``: the total over c."""
    steps = document_pairs_per_step(doc_lengths, c, layout)
    per_rank = [sum(row) for row in steps]
    return DocumentWork(per_step=steps, per_rank=per_rank,
                        ring=sum(max(col) for col in zip(*steps)), allgather=max(per_rank),
                        even=sum(per_rank) / c)


def summary(model=LLAMA3_405B, b=1, c=16, t=8, flops_per_s=989e12, link_bytes_per_s=50e9):
    """Llama 3 405B at 128K tokens, c = 16 and t = 8 (Dubey et al. 2024, Table 4), one GPU's
    own 400 Gb/s port (the ring's ranks are t GPUs apart, so in different servers)."""
    step = ring_step(model, b, c, flops_per_s, link_bytes_per_s, t=t)
    return "\n".join([
        f"{model.name}: s={model.s}, c={c}, t={t}, kv_heads={kv_heads(model)} of a={model.a}",
        f"  contiguous imbalance {imbalance(model.s, c, 'contiguous'):.2f}, "
        f"zig-zag {imbalance(model.s, c, 'zigzag'):.2f}",
        f"  K/V block per GPU {kv_block_bytes(model, b, c) / t / 2**20:.1f} MiB: step compute "
        f"{step.compute_s * 1e3:.3f} ms, transfer {step.transfer_s * 1e3:.3f} ms, "
        f"hidden: {step.hidden}",
        f"  shortest shard that hides its block: "
        f"{shortest_hidden_shard(model, flops_per_s, link_bytes_per_s):.0f} tokens"])


if __name__ == "__main__":
    print(summary())
