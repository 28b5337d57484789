"""Ulysses: trade the sequence split for a head split around attention, two all-to-alls.

What it teaches: attention mixes tokens but not heads, so a rank that holds every token of
a few heads needs nobody else. DeepSpeed-Ulysses (Jacobs et al. 2023; Megatron-Core's
``--cp-comm-type a2a``) turns the c ranks' sequence shards into head shards by one
all-to-all per tensor, runs ordinary attention over the whole sequence on heads/c heads, and
turns the output back into a sequence shard by one more:

    q  (b, heads, s/c, d)  -all-to-all->  (b, heads/c, s, d)        (k and v: kv_heads/c)
    attention over all s tokens, heads/c heads (the mask on the tokens' positions)
    out (b, heads/c, s, d) -all-to-all->  (b, heads, s/c, d)

Rank r sends head group j of its s/c tokens to rank j and receives head group r of every
rank's tokens: the sequence comes back in rank order (rank 0's chunks, rank 1's, ...), and
``masks.keep`` reads the tokens' positions, so the mask holds in that order. Each
all-to-all sends (c-1)/c of its tensor to the others; the backward runs the same four
all-to-alls on the gradients (an equal-split all-to-all is its own conjugate).

c is limited by the heads: heads and kv_heads must both divide by c (with grouped-query
attention kv_heads is the tighter limit: Llama 3 405B's 8 key heads allow c <= 8).

Laptop:  ``python -c "from lessonlib.context_parallel import method_runs as m; \\
          print(m.run_parity(2, methods=('ulysses',))[0])"``
GPU box: the same; on GPUs the all-to-alls run over NCCL.
"""
from __future__ import annotations

import torch

from lessonlib import bug_switches, comm
from lessonlib.context_parallel.allgather import key_positions
from lessonlib.context_parallel.layout import (check_split_divides, check_split_name, check_same_layout,
                                               group_rank)
from lessonlib.context_parallel.masks import (check_doc_ids, check_heads, keep, masked_attention,
                                              repeat_kv)


class AllToAll(torch.autograd.Function):
    """Equal-split ``all_to_all_single`` on dim 0 (row r goes to rank r); its backward is
    the same all-to-all on the gradients."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        out = x.new_empty(x.shape)             # contiguous (empty_like keeps x's strides)
        comm.all_to_all_single(out, x.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        back = grad.new_empty(grad.shape)
        comm.all_to_all_single(back, grad.contiguous(), group=ctx.group)
        return back, None


def to_heads(x, group, c: int):
    """Sequence shard -> head shard: (b, heads, s/c, d) -> (b, heads/c, s, d), the
    sequence in rank order."""
    b, heads, n, d = x.shape
    rows = x.view(b, c, heads // c, n, d).transpose(0, 1)      # (c, b, heads/c, s/c, d)
    got = AllToAll.apply(rows, group)                          # (c, b, heads/c, s/c, d)
    return got.permute(1, 2, 0, 3, 4).reshape(b, heads // c, c * n, d)


def to_sequence(y, group, c: int):
    """Head shard -> sequence shard: (b, heads/c, s, d) -> (b, heads, s/c, d)."""
    b, per, s, d = y.shape
    rows = y.view(b, per, c, s // c, d).permute(2, 0, 1, 3, 4)  # (c, b, heads/c, s/c, d)
    got = AllToAll.apply(rows, group)                          # from rank j: head group j
    if bug_switches.active("ulysses_head_groups_swapped"):  # BUG: read as head h = j + c * i
        return got.permute(1, 2, 0, 3, 4).reshape(b, c * per, s // c, d)
    return got.permute(1, 0, 2, 3, 4).reshape(b, c * per, s // c, d)


def check_divides_heads(heads: int, kv_heads: int, c: int) -> None:
    for name, count in (("heads", heads), ("kv_heads", kv_heads)):
        if count % c:
            raise ValueError(f"Ulysses splits the heads over the c={c} ranks: {name}={count} "
                             f"is not divisible by c; use a c dividing {name} (and "
                             f"{'kv_heads' if name == 'heads' else 'heads'}), or ring or "
                             f"all-gather context parallelism")


def ulysses_attention(q, k, v, group=None, causal: bool = True, doc_ids=None,
                      layout: str = "zigzag"):
    """Exact softmax attention of this rank's query shard (b, heads, s/c, d), made by
    ``shard_sequence`` in ``layout``, over the whole sequence: all-to-all to heads/c heads of
    all s tokens, attention, all-to-all back; returns this rank's output shard (b, heads,
    s/c, d). k, v: (b, kv_heads, s/c, d); heads and kv_heads must divide by c. ``doc_ids``:
    an optional (b, s) document mask, the same on every rank (``layout``, ``causal`` and
    ``doc_ids`` are checked to agree on every call)."""
    check_split_name(layout)
    groups = check_heads(q, k, v)
    _, c = group_rank(group)
    check_divides_heads(q.shape[1], k.shape[1], c)
    s = q.shape[2] * c
    check_split_divides(s, c, layout)
    check_doc_ids(doc_ids, q.shape[0], s)
    check_same_layout(group, layout, bool(causal), doc_ids)
    qh, kh, vh = (to_heads(t, group, c) for t in (q, k, v))   # (b, heads/c or kv/c, s, d)
    pos = key_positions(c, s, layout).to(q.device)
    docs = doc_ids[:, pos] if doc_ids is not None else None
    out = masked_attention(qh, repeat_kv(kh, groups), repeat_kv(vh, groups),
                           keep(pos, pos, bool(causal), docs, docs))   # (b, heads/c, s, d)
    return to_sequence(out, group, c)
