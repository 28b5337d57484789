"""Sharding the replica: who holds which slice, what that saves, and what it costs.

What it teaches: replicated data parallelism keeps d copies of everything a model needs to
train. ZeRO (Rajbhandari et al. 2020) keeps one: each of the d ranks holds 1/d of the
optimizer state (stage 1), of the gradients too (stage 2), of the weights too (stage 3),
and fetches what it is missing just before it needs it. This file holds the arithmetic the
two sharded pieces share (``zero.ShardedOptimizer``, ``fsdp.FullyShardedDataParallel``):

* where a rank's slice lies: ``flat_ranges`` (stage 1 cuts the flattened parameters into d
  equal ranges, the last one short by the padding) and ``row_shard`` (stages 2 and 3 cut
  every parameter along dim 0 into d pieces of ceil(rows/d) rows, zero-padded, as FSDP2's
  ``fully_shard`` does);
* what a rank holds, by ZeRO's per-stage formula (``zero_stage_bytes``, from
  ``lessonlib.costmodel.memory.model_state_bytes``), and what it measures (``tensor_bytes``);
* what a rank sends over a ring for the collectives in its ledger (``ring_bytes_per_rank``):
  stages 1 and 2 move an all-reduce's 2(n-1)/n x S, stage 3 moves 3(n-1)/n x S (ZeRO §7).

Laptop:  ``python labs/zero.py --world-size 2``
GPU box: ``torchrun --nproc-per-node 8 labs/zero.py`` (NCCL)
"""
from __future__ import annotations

import math

import torch
from torch import nn

from lessonlib.costmodel.memory import GRAD_BYTES, OPTIMIZER_BYTES, WEIGHT_BYTES, model_state_bytes


def distinct_parameters(params) -> list[nn.Parameter]:
    """``params`` as a list, each tensor once (a tied weight appears once), in order."""
    seen, out = set(), []
    for p in params:
        if isinstance(p, dict):
            raise TypeError("parameter groups (dicts) are not supported: pass the parameters "
                            "themselves, e.g. model.parameters()")
        if id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


# ---------------------------------------------------------------- where a slice lies
def flat_ranges(numels: list[int], rank: int, d: int) -> tuple[int, list[tuple[int, int, int]]]:
    """Stage 1's cut: the parameters flattened one after another, padded with zeros to a
    multiple of d, and cut into d ranges of L = ceil(P/d) elements. Returns (L, pieces):
    each piece (parameter index, first element, end) of this rank's range, in order."""
    total = sum(numels)
    length = math.ceil(total / d) if total else 0
    lo, hi = rank * length, (rank + 1) * length
    pieces, start = [], 0
    for i, numel in enumerate(numels):
        a, b = max(lo, start), min(hi, start + numel)
        if a < b:
            pieces.append((i, a - start, b - start))
        start += numel
    return length, pieces


def shard_rows(shape: torch.Size, d: int) -> int:
    """Rows of a parameter every rank holds: ceil(dim0 / d) (a scalar counts as one row)."""
    rows = shape[0] if len(shape) else 1
    return math.ceil(rows / d)


def padded_numel(shape: torch.Size, d: int) -> int:
    """Elements of a parameter once padded to d equal row shards: d x ceil(dim0/d) rows."""
    row = math.prod(shape[1:]) if len(shape) > 1 else 1
    return d * shard_rows(shape, d) * row


def row_shard(full: torch.Tensor, rank: int, d: int) -> torch.Tensor:
    """This rank's rows of ``full``, zero-padded to ceil(dim0/d) rows (a new tensor)."""
    rows = full.reshape(-1) if full.ndim == 0 else full
    c = shard_rows(full.shape, d)
    out = torch.zeros((c, *rows.shape[1:]), dtype=full.dtype, device=full.device)
    mine = rows[rank * c:(rank + 1) * c]                                   # (<= c, ...)
    out[:mine.shape[0]] = mine
    return out


# ---------------------------------------------------------------- bytes held
def zero_stage_bytes(stage: int, n_params: int, d: int, padded_params: int | None = None,
                     weight_bytes: int = 4, grad_bytes: int = 4,
                     state_bytes: int = 8) -> dict[str, float]:
    """What one rank holds at ZeRO ``stage``: ZeRO's per-stage formula (stage 1: 4P + 12P/N,
    2: 2P + 14P/N, 3: 16P/N for mixed-precision Adam) with this run's bytes per parameter.

    ``weight_bytes`` per weight, ``grad_bytes`` per gradient, ``state_bytes`` of optimizer
    state per parameter (AdamW: 8, two moments; SGD with momentum: 4). A sharded part counts
    ``padded_params / d`` (the shards are equal, padding included); a replicated part counts
    all ``n_params``."""
    padded = n_params if padded_params is None else padded_params
    exact, cut = model_state_bytes(n_params, stage, d), model_state_bytes(padded, stage, d)
    weights, grads, state = (cut[i] if stage >= first else exact[i]
                             for i, first in enumerate((3, 2, 1)))
    out = {"weights": weights / WEIGHT_BYTES * weight_bytes,
           "gradients": grads / GRAD_BYTES * grad_bytes,
           "optimizer": state / OPTIMIZER_BYTES * state_bytes}
    return {k: int(round(v)) for k, v in out.items()}


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def optimizer_state_bytes(optimizer, params) -> int:
    """Bytes of ``optimizer``'s state for ``params``: the tensors shaped like a parameter
    (momentum, Adam's two moments). Step counters (one scalar per parameter) are left out:
    ZeRO's formula does not count them either."""
    total = 0
    for p in params:
        for value in optimizer.state.get(p, {}).values():
            if isinstance(value, torch.Tensor) and value.shape == p.shape:
                total += value.numel() * value.element_size()
    return total


# ---------------------------------------------------------------- bytes moved
def ring_bytes_per_rank(summary: dict, n: int) -> float:
    """Bytes one rank sends over a ring for the collectives in a ledger ``summary``.

    The ledger records each call's payload: the whole tensor for an all-reduce or a
    reduce-scatter, this rank's shard for an all-gather. On a ring an all-reduce sends
    2(n-1)/n of its payload, a reduce-scatter (n-1)/n, an all-gather (n-1) x its shard."""
    factor = {"all_reduce": 2 * (n - 1) / n, "reduce_scatter": (n - 1) / n,
              "all_gather": n - 1}
    return sum(entry["bytes"] * factor.get(op, 0) for op, entry in summary.items())
