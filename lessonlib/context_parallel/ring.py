"""Ring attention: each rank keeps its queries and passes keys and values around a ring.

What it teaches: the c ranks of a context-parallel group each hold s/c tokens' q, k and v.
In c steps every rank meets every key/value block: at each step it posts the transfer of
the block it holds to the next rank (and the receive of the previous rank's) *before* it
computes with it, so the transfer hides behind the compute, and merges the block's partial
softmax into its output with the log-sum-exp rule (``blocks``). Under a causal mask, chunk
pairs entirely above the diagonal are skipped. Under a document mask (``doc_ids``) every
step still runs, its transfer too: the mask is applied inside each pair's scores.

    step 0: rank r holds its own block r      step t: rank r holds block (r - t) mod c

The backward is a ring too: each block travels again, and behind it the gradients of its
keys and values, to which every rank it visits adds its share (the partial sum arrives
while the rank computes its own); one last hop returns them to their owner.
Only this rank's q, k, v, output and log-sum-exp are saved: activations of s/c tokens.

Every message is a batched point-to-point (``comm.batch_isend_irecv``: sends to the next
rank and receives from the previous one in one group, as NCCL needs), so the ledger counts
them and ``nccl_rules.nccl_hazards`` can replay them. The step functions are the algorithm; a
``record(phase, step, source, pairs)`` hook (a context manager, none by default) is how a
caller times the steps or draws the ring, from outside.

Laptop:  ``python -c "from lessonlib.context_parallel import ring_runs;
         print(ring_runs.run_parity(2))"``
GPU box: the same; on GPUs the blocks travel over NCCL.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from lessonlib import comm
from lessonlib.context_parallel.blocks import attend, attend_backward, chunk_pairs, merge
from lessonlib.context_parallel.layout import (check_split_divides, check_split_name, check_same_layout,
                                               chunks_of, group_rank, positions_of)
from lessonlib.context_parallel.masks import check_doc_ids, check_heads, keep, repeat_kv
from lessonlib.instruments.spans import no_record


@dataclass(frozen=True)
class Ring:
    """This rank's place in the ring: its neighbours (global ranks) and its chunks."""
    group: object
    rank: int          # place in the group
    c: int
    next: int
    prev: int
    layout: str
    causal: bool
    n: int             # tokens per chunk

    @classmethod
    def of(cls, group, layout: str, causal: bool, local_tokens: int) -> "Ring":
        rank, c = group_rank(group)
        members = dist.get_process_group_ranks(group) if group is not None else list(range(c))
        n = check_split_divides(local_tokens * c, c, layout)
        return cls(group, rank, c, members[(rank + 1) % c], members[(rank - 1) % c],
                   layout, causal, n)

    def source(self, step: int) -> int:
        """Whose key/value block this rank holds at ``step``."""
        return (self.rank - step) % self.c

    def pairs(self, source: int):
        """The chunk pairs computed between this rank's queries and ``source``'s keys."""
        return chunk_pairs(chunks_of(self.rank, self.c, self.layout),
                           chunks_of(source, self.c, self.layout), self.causal)


def pass_on(tensors, ring: Ring):
    """Post the send of ``tensors`` to the next rank and the receive of the previous rank's,
    as one batch; returns (the buffers being filled, the handles to wait on)."""
    received = [torch.empty_like(t) for t in tensors]
    ops = [comm.send_op(t, ring.next, ring.group) for t in tensors] + \
          [comm.recv_op(r, ring.prev, ring.group) for r in received]
    return received, comm.batch_isend_irecv(ops)


def arrive(posted):
    """Wait for a ``pass_on``; returns what came in."""
    received, works = posted
    for work in works:
        work.wait()
    return tuple(received)


def _chunk(slot: int, n: int) -> slice:
    return slice(slot * n, (slot + 1) * n)


def block_docs(doc_ids, ring: Ring, source: int):
    """(this rank's tokens' documents, ``source``'s), (b, s/c) each; None without a mask."""
    if doc_ids is None:
        return None
    return tuple(doc_ids[:, positions_of(r, ring.c, doc_ids.shape[1], ring.layout).to(
        doc_ids.device)] for r in (ring.rank, source))


def _kept(docs, rows, cols):
    return None if docs is None else keep(None, None, False, docs[0][:, rows], docs[1][:, cols])


def forward_step(q, kv, out, lse, pairs, n: int, docs=None):
    """Attend this rank's queries to one key/value block and merge it into (out, lse)."""
    k, v = kv
    for a, b, diagonal in pairs:
        rows, cols = _chunk(a, n), _chunk(b, n)
        block = attend(q[:, :, rows], k[:, :, cols], v[:, :, cols], diagonal,
                       _kept(docs, rows, cols))
        out[:, :, rows], lse[:, :, rows] = merge(out[:, :, rows], lse[:, :, rows], *block)
    return out, lse


def backward_step(q, kv, lse, dout, delta, dq, dkv, pairs, n: int, docs=None):
    """Add one key/value block's share to dq, and this rank's share to the block's dk, dv."""
    (k, v), (dk, dv) = kv, dkv
    for a, b, diagonal in pairs:
        rows, cols = _chunk(a, n), _chunk(b, n)
        gq, gk, gv = attend_backward(q[:, :, rows], k[:, :, cols], v[:, :, cols],
                                     lse[:, :, rows], dout[:, :, rows], delta[:, :, rows],
                                     diagonal, _kept(docs, rows, cols))
        dq[:, :, rows] += gq
        dk[:, :, cols] += gk
        dv[:, :, cols] += gv
    return dq, (dk, dv)


def ring_forward(q, k, v, ring: Ring, record=no_record, doc_ids=None):
    out = torch.zeros_like(q)                                         # (b, a, s/c, d)
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype, device=q.device)
    kv = (k, v)
    for step in range(ring.c):
        source = ring.source(step)
        incoming = pass_on(kv, ring) if step < ring.c - 1 else None   # the next block, first
        with record("forward", step, source, ring.pairs(source)):
            out, lse = forward_step(q, kv, out, lse, ring.pairs(source), ring.n,
                                    block_docs(doc_ids, ring, source))
        kv = arrive(incoming) if incoming else kv
    return out, lse


def ring_backward(q, k, v, out, lse, dout, ring: Ring, record=no_record, doc_ids=None):
    delta = (dout * out).sum(-1)                                      # (b, a, s/c)
    dq, kv, on_its_way = torch.zeros_like(q), (k, v), None
    for step in range(ring.c):
        source = ring.source(step)
        incoming = pass_on(kv, ring) if step < ring.c - 1 else None
        with record("backward", step, source, ring.pairs(source)):
            dq, mine = backward_step(q, kv, lse, dout, delta, dq,
                                     (torch.zeros_like(k), torch.zeros_like(v)),
                                     ring.pairs(source), ring.n,
                                     block_docs(doc_ids, ring, source))
        kv = arrive(incoming) if incoming else kv
        # the block's dk, dv so far came from the previous rank while we computed; add ours and
        # pass them on: after c hops they are back with the block's owner
        dkv = mine if on_its_way is None else tuple(a + b for a, b in zip(arrive(on_its_way), mine))
        on_its_way = pass_on(dkv, ring) if ring.c > 1 else None
    return (dq, *(arrive(on_its_way) if on_its_way else dkv))


class RingAttention(torch.autograd.Function):
    """Ring attention forward and backward; saves only this rank's shards."""

    @staticmethod
    def forward(ctx, q, k, v, ring, record, doc_ids):
        q, k, v = (t.contiguous() for t in (q, k, v))
        out, lse = ring_forward(q, k, v, ring, record, doc_ids)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring, ctx.record, ctx.doc_ids = ring, record, doc_ids
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = ring_backward(q, k, v, out, lse, dout.contiguous(), ctx.ring, ctx.record,
                                   ctx.doc_ids)
        return dq, dk, dv, None, None, None


def ring_attention(q, k, v, group=None, causal: bool = True, layout: str = "zigzag",
                   record=no_record, doc_ids=None):
    """Exact softmax attention of this rank's query shard over the whole sequence, whose
    keys and values are sharded over ``group`` in ``layout``; returns this rank's output
    shard (b, heads, s/c, head_dim). ``record`` is an optional per-step hook; ``doc_ids``
    (b, s) an optional document mask, the whole sequence's, the same on every rank. Every
    rank of the group must pass the same ``layout``, ``causal`` and ``doc_ids`` (checked
    on every call: ``check_same_layout``). k and v may have fewer heads than q (GQA,
    kv_heads dividing heads): they are repeated to every query head first, so the ring's
    blocks carry all the heads (``costmodel.context.cp_bytes_sent_per_rank`` counts them
    so), and autograd sums each repeated head's gradient back into its key head."""
    check_split_name(layout)
    groups = check_heads(q, k, v)
    k, v = repeat_kv(k, groups), repeat_kv(v, groups)                 # (b, heads, s/c, d)
    ring = Ring.of(group, layout, bool(causal), q.shape[2])
    check_doc_ids(doc_ids, q.shape[0], q.shape[2] * ring.c)
    check_same_layout(group, ring.layout, ring.causal, doc_ids)
    return RingAttention.apply(q, k, v, ring, record, doc_ids)
