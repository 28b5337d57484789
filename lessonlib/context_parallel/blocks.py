"""Attention one block at a time, merged exactly: the arithmetic inside ring attention.

What it teaches: softmax attention over all keys can be computed over blocks of keys, one at
a time, and merged without approximation. A block returns its normalised output o_j and the
log-sum-exp of its scores l_j = log sum_k exp(q.k / sqrt(d)); two partial results merge as

    l = log(exp(l_1) + exp(l_2)),     o = exp(l_1 - l) o_1 + exp(l_2 - l) o_2

(the online-softmax recurrence of FlashAttention, Dao et al. 2022, which ring attention,
Liu et al. 2023, runs across ranks). The backward needs only the final l and the output:
P = exp(S - l) is each block's share of the softmax, recomputed block by block.

Work is done chunk pair by chunk pair (a shard holds one chunk, or two in the zig-zag
layout). Under a causal mask a query chunk attends fully to earlier key chunks, with the
triangular mask to its own chunk, and not at all to later ones: those pairs are skipped,
never computed. ``chunk_pairs`` lists what is computed; ``useful_pairs`` counts the
(query, key) scores that survive the mask, the FLOPs a causal kernel does. A document mask
(``masks.keep``) is applied inside a pair's scores: a pair whose queries see none of its
keys gives them an empty block, l = -inf and o = 0, which the merge weighs by exp(-inf) = 0.

Laptop:  ``python -c "from lessonlib.context_parallel.blocks import chunk_pairs; \\
          print(chunk_pairs((0, 3), (1, 2), True))"``
GPU box: the same; plain tensor arithmetic on whatever device q is on.
"""
from __future__ import annotations

import math

import torch


def chunk_pairs(q_chunks, k_chunks, causal: bool) -> list[tuple[int, int, bool]]:
    """(query chunk slot, key chunk slot, diagonal?) of every pair that has any unmasked
    score: all pairs without a mask; with one, a key chunk not after the query chunk."""
    return [(a, b, qc == kc) if causal else (a, b, False)
            for a, qc in enumerate(q_chunks) for b, kc in enumerate(k_chunks)
            if not causal or kc <= qc]


def useful_pairs(pairs, n: int) -> int:
    """The (query, key) scores of ``chunk_pairs`` that the mask keeps, chunks of n tokens."""
    return sum(n * (n + 1) // 2 if diagonal else n * n for _, _, diagonal in pairs)


def _scores(q, k, diagonal: bool, kept=None):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])              # (b, a, n, n)
    if diagonal:
        n = q.shape[-2]
        above = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
        s = s.masked_fill(above, float("-inf"))
    if kept is not None:                                               # (b, 1, n, n) or None
        s = s.masked_fill(~kept, float("-inf"))
    return s


def _finite(lse):
    """-inf (a row that saw no key yet) read as 0, so exp(x - lse) is 0, never NaN."""
    return torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)


def attend(q, k, v, diagonal: bool, kept=None):
    """One chunk pair: the normalised output and the log-sum-exp of each query's scores
    (a row with every score masked: output 0, log-sum-exp -inf)."""
    s = _scores(q, k, diagonal, kept)
    lse = torch.logsumexp(s, dim=-1)                                   # (b, a, n)
    return torch.exp(s - _finite(lse).unsqueeze(-1)) @ v, lse          # (b, a, n, d)


def merge(out, lse, block_out, block_lse):
    """The log-sum-exp rule: two partial softmaxes over disjoint keys -> one, exactly."""
    new = torch.logaddexp(lse, block_lse)
    safe = _finite(new).unsqueeze(-1)
    return (torch.exp(lse.unsqueeze(-1) - safe) * out
            + torch.exp(block_lse.unsqueeze(-1) - safe) * block_out), new


def attend_backward(q, k, v, lse, dout, delta, diagonal: bool, kept=None):
    """One chunk pair's gradients from the final log-sum-exp ``lse`` and
    ``delta`` = rowsum(dout * out): returns (dq, dk, dv) contributions."""
    p = torch.exp(_scores(q, k, diagonal, kept) - lse.unsqueeze(-1))  # (b, a, n, n)
    dv = p.transpose(-2, -1) @ dout
    ds = p * (dout @ v.transpose(-2, -1) - delta.unsqueeze(-1)) / math.sqrt(q.shape[-1])
    return ds @ k, ds.transpose(-2, -1) @ q, dv
