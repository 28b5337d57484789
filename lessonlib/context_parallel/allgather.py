"""All-gather context parallelism: every rank gathers all keys and values, keeps its queries.

What it teaches: Llama 3 (Dubey et al. 2024, §3.3.2) does not pass K and V around a ring. Each
of the c ranks all-gathers the whole sequence's K and V over the context-parallel group, then
computes attention for its own s/c queries against all s keys, with the causal and document
mask of its chunks (``masks.keep`` on the tokens' positions). The all-gather is exposed, not
hidden behind compute; Meta took it because

* grouped-query attention makes K and V small (8 key heads for 128 query heads in 405B):
  a rank receives (c-1)/c of K and V, a fraction of what its queries would weigh;
* a document mask makes the ring's steps uneven (a block may hold nothing this rank's
  queries may see, another everything), while here each rank does its own queries' work
  once, and the zig-zag split (chunks i and 2c-1-i) balances that work.

The backward is the all-gather's conjugate: every rank holds gradients for all s keys and
values, of which only its own s/c are its to keep, summed over the ranks whose queries
used them: a reduce-scatter (``GatherKV``, the same pair as FSDP's weight gather). Every
message goes through ``lessonlib.comm``: one all-gather forward, one reduce-scatter
backward, K and V stacked into one tensor each time.

    forward:  kv (2, b, kv_heads, s/c, d) -all-gather-> (c, 2, b, kv_heads, s/c, d)
    backward: d(c, 2, b, kv_heads, s/c, d) -reduce-scatter-> d(2, b, kv_heads, s/c, d)

Laptop:  ``python -c "from lessonlib.context_parallel import method_runs as m; \\
          print(m.run_parity(2, methods=('allgather',))[0])"``
GPU box: the same; on GPUs the all-gather and the reduce-scatter run over NCCL.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from lessonlib import bug_switches, comm
from lessonlib.context_parallel.layout import (check_split_divides, check_split_name, check_same_layout,
                                               group_rank, positions_of)
from lessonlib.context_parallel.masks import (check_doc_ids, check_heads, keep, masked_attention,
                                              repeat_kv)


class GatherKV(torch.autograd.Function):
    """Forward: all-gather this rank's stacked K and V over the group. Backward: reduce-scatter
    the gradients of all of them, so each rank gets the sum for its own."""

    @staticmethod
    def forward(ctx, kv, group):
        ctx.group = group
        c = dist.get_world_size(group)
        gathered = kv.new_empty(c * kv.shape[0], *kv.shape[1:])    # (c 2, b, kv_heads, s/c, d)
        comm.all_gather_into_tensor(gathered, kv.contiguous(), group=group)
        return gathered.view(c, *kv.shape)                     # (c, 2, b, kv_heads, s/c, d)

    @staticmethod
    def backward(ctx, grad):
        mine = grad.new_empty(grad.shape[1:])                  # (2, b, kv_heads, s/c, d)
        if bug_switches.active("cp_allgather_grads_not_reduced"):  # BUG: keeps its queries' share
            return grad[dist.get_rank(ctx.group)].clone(), None
        comm.reduce_scatter_tensor(mine, grad.flatten(0, 1).contiguous(), group=ctx.group)
        return mine, None


def key_positions(c: int, s: int, layout: str) -> torch.Tensor:
    """Where the gathered keys sit in the whole sequence: rank 0's shard, rank 1's, ..."""
    return torch.cat([positions_of(r, c, s, layout) for r in range(c)])


def allgather_forward(q, k, v, group, causal: bool, layout: str, doc_ids=None):
    """This rank's queries against the gathered keys and values, under the mask."""
    rank, c = group_rank(group)
    b, heads, n, _ = q.shape
    s = n * c
    gathered = GatherKV.apply(torch.stack([k, v]), group)     # (c, 2, b, kv_heads, s/c, d)
    k_all, v_all = gathered.permute(1, 2, 3, 0, 4, 5).flatten(3, 4)   # (b, kv_heads, s, d)
    q_pos = positions_of(rank, c, s, layout).to(q.device)
    k_pos = key_positions(c, s, layout).to(q.device)
    docs = (doc_ids[:, q_pos], doc_ids[:, k_pos]) if doc_ids is not None else (None, None)
    groups = heads // k.shape[1]
    return masked_attention(q, repeat_kv(k_all, groups), repeat_kv(v_all, groups),
                            keep(q_pos, k_pos, causal, *docs))  # (b, heads, s/c, d)


def allgather_attention(q, k, v, group=None, causal: bool = True, layout: str = "zigzag",
                        doc_ids=None):
    """Exact softmax attention of this rank's query shard (b, heads, s/c, d) over the whole
    sequence, K and V all-gathered over ``group`` (k, v: (b, kv_heads, s/c, d), kv_heads
    dividing heads); returns this rank's output shard (b, heads, s/c, d). ``doc_ids``: an
    optional (b, s) document mask, the same on every rank. Every rank of the group must pass
    the same ``layout``, ``causal`` and ``doc_ids`` (checked on every call)."""
    check_split_name(layout)
    check_heads(q, k, v)
    _, c = group_rank(group)
    check_split_divides(q.shape[2] * c, c, layout)
    check_doc_ids(doc_ids, q.shape[0], q.shape[2] * c)
    check_same_layout(group, layout, bool(causal), doc_ids)
    return allgather_forward(q, k, v, group, bool(causal), layout, doc_ids)
