"""Which (query, key) scores a mask keeps, by the tokens' places in the whole sequence.

What it teaches: a mask is a function of two tokens, not of where a shard put them. Causal:
key position <= query position. Document (Llama 3 §3.3.2 trains on packed sequences): a
batch row holds several documents, ``doc_ids`` (b, s) names each token's, and a token
attends only to tokens of its own document (and, causally, earlier ones). Computed from
positions, the mask holds in any order the tokens arrive in: the ring's blocks, the
all-gather's keys in rank order, Ulysses' sequence put back together from c shards.

Grouped-query attention (GQA) gives k and v fewer heads than q: each of ``kv_heads`` key
heads serves heads/kv_heads query heads. The context-parallel methods move the small k and v
and repeat them here, next to the attention (``repeat_kv``); autograd sums the repeated
heads' gradients back.

``masked_attention`` is plain softmax attention under a boolean mask (every row keeps at
least its own token, so no row is empty); ``attention`` is the one-process reference the
parity tests hold every method to.

Laptop:  ``python -c "import torch; from lessonlib.context_parallel.masks import keep; \\
          print(keep(torch.arange(4), torch.arange(4), True, torch.tensor([[0, 0, 1, 1]])))"``
GPU box: the same; plain tensor arithmetic on whatever device the tensors are on.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def check_doc_ids(doc_ids, b: int, s: int):
    """``doc_ids`` as given if it is None or a (b, s) integer tensor; else one ValueError."""
    if doc_ids is None:
        return None
    if not isinstance(doc_ids, torch.Tensor):
        raise ValueError(f"doc_ids must be a (b, s) = ({b}, {s}) torch.long tensor of document "
                         f"numbers, or None; got {type(doc_ids).__name__}")
    if doc_ids.dtype != torch.long or tuple(doc_ids.shape) != (b, s):
        got = f"shape {tuple(doc_ids.shape)}, {str(doc_ids.dtype).replace('torch.', '')}"
        raise ValueError(f"doc_ids must be (b, s) = ({b}, {s}) int64 (torch.long), the whole "
                         f"sequence's document of each token on every rank; got {got}")
    return doc_ids


def check_heads(q, k, v) -> int:
    """heads // kv_heads (the query heads per key head); ValueError naming the shapes when
    q, k, v are not (b, heads, s/c, d) shards of one float dtype with kv_heads | heads."""
    dtypes = {name: str(t.dtype).replace("torch.", "") for name, t in zip("qkv", (q, k, v))}
    if len(set(dtypes.values())) > 1 or not q.is_floating_point():
        said = ", ".join(f"{name} {dtype}" for name, dtype in dtypes.items())
        raise ValueError(f"q, k, v must share one floating-point dtype; got {said} (cast them, "
                         f"e.g. k.to(q.dtype), or all three .float())")
    shapes = [tuple(t.shape) for t in (q, k, v)]
    if any(len(s) != 4 for s in shapes) or shapes[1] != shapes[2] or \
            shapes[0][::2] != shapes[1][::2] or shapes[0][3] != shapes[1][3]:
        raise ValueError(f"q, k, v must be (b, heads, s/c, head_dim) shards, k and v alike with "
                         f"the same b, s/c and head_dim as q; got shapes {shapes}")
    heads, kv_heads = shapes[0][1], shapes[1][1]
    if heads % kv_heads:
        raise ValueError(f"kv_heads={kv_heads} (k and v's heads) must divide heads={heads} "
                         f"(q's): each key head serves heads/kv_heads query heads")
    return heads // kv_heads


def repeat_kv(x, groups: int):
    """(b, kv_heads, n, d) -> (b, kv_heads * groups, n, d): key head j serves query heads
    j*groups .. (j+1)*groups - 1 (the grouping of Llama's and PyTorch's GQA)."""
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


def keep(q_pos, k_pos, causal: bool, q_docs=None, k_docs=None):
    """The scores the mask keeps: (1 or b, 1, queries, keys) booleans, or None for none
    masked. ``q_pos``/``k_pos``: positions in the whole sequence; ``*_docs``: (b, n)."""
    mask = None
    if causal:
        mask = (k_pos[None, :] <= q_pos[:, None])[None, None]            # (1, 1, nq, nk)
    if q_docs is not None:
        same = (q_docs[:, :, None] == k_docs[:, None, :]).unsqueeze(1)   # (b, 1, nq, nk)
        mask = same if mask is None else mask & same
    return mask


def masked_attention(q, k, v, mask):
    """softmax(q k^T / sqrt(d), masked) v; autograd differentiates it."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])            # (b, a, nq, nk)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v                             # (b, a, nq, d)


def attention(q, k, v, causal: bool = True, doc_ids=None):
    """One process on the whole tensors (b, heads, s, d), k and v maybe of fewer heads:
    PyTorch's ``scaled_dot_product_attention`` under the mask."""
    groups = check_heads(q, k, v)
    pos = torch.arange(q.shape[2], device=q.device)
    check_doc_ids(doc_ids, q.shape[0], q.shape[2])
    mask = keep(pos, pos, causal, doc_ids, doc_ids)
    return F.scaled_dot_product_attention(q, repeat_kv(k, groups), repeat_kv(v, groups),
                                          attn_mask=mask)
