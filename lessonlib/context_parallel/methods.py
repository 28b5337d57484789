"""Three ways to attend over a sequence split on c ranks, behind one call, and their bytes.

What it teaches: ring attention (``ring``: K/V blocks passed around, hidden behind compute;
Liu et al. 2023, torchtitan, Megatron-Core's ``p2p``), all-gather (``allgather``: K and V
gathered whole, exposed; Llama 3 §3.3.2, Megatron-Core's ``allgather``) and Ulysses
(``ulysses``: sequence shards swapped for head shards by all-to-alls; Jacobs et al. 2023,
Megatron-Core's ``a2a``) take the same shards made by ``shard_sequence`` and return the same
output shard; they differ in what they send, and when.

``sent_bytes`` reads what one rank sent to the *other* ranks off its ledger, the quantity
``costmodel.context.cp_bytes_sent_per_rank`` predicts: point-to-point sends and all-to-all
slices to another rank as recorded; an all-gather of a p-byte shard as (c-1) p (on a ring
each rank forwards c-1 shards) and a reduce-scatter of a P-byte tensor as (c-1)/c P (each
rank sends c-1 of its c parts). A slice an all-to-all keeps for itself is not sent.

Laptop:  ``python -c "from lessonlib.context_parallel import method_runs as m; \\
          print(m.run_parity(2)[0])"``
GPU box: the same; ring, all-gather and all-to-all over NCCL.
"""
from __future__ import annotations

from lessonlib.context_parallel.allgather import allgather_attention
from lessonlib.context_parallel.ring import ring_attention
from lessonlib.context_parallel.ulysses import ulysses_attention

METHODS = ("ring", "allgather", "ulysses")


def check_method(method: str) -> str:
    if method not in METHODS:
        raise ValueError(f"method={method!r} is not a context-parallel attention; use one of "
                         f"{', '.join(METHODS)}")
    return method


def context_attention(method: str, q, k, v, group=None, causal: bool = True,
                      layout: str = "zigzag", doc_ids=None):
    """``method``'s attention of this rank's shards; returns its output shard."""
    if check_method(method) == "ring":
        return ring_attention(q, k, v, group, causal, layout, doc_ids=doc_ids)
    if method == "allgather":
        return allgather_attention(q, k, v, group, causal, layout, doc_ids)
    return ulysses_attention(q, k, v, group, causal, doc_ids, layout)


def sent_bytes(events, rank: int) -> int:
    """Bytes this rank (a global rank) sent to other ranks, by the ledger's ``events``."""
    total = 0
    for e in events:
        if e.op == "send" and e.peer != rank:
            total += e.bytes
        elif e.op == "all_gather":
            total += (e.group_size - 1) * e.bytes
        elif e.op == "reduce_scatter":
            total += (e.group_size - 1) * e.bytes // e.group_size
    return total
