"""Sequence parallelism (Korthikanti et al. 2022, §4.2): the parts of a layer that tensor
parallelism left replicated, split along the sequence instead.

What it teaches: tensor parallelism splits the matrices, but the LayerNorms, the residual
adds and the inputs of the column-parallel layers still run on the whole (b, s, h) on every
rank: 10sbh of Korthikanti's 34sbh bytes per layer stay replicated (Table 2). These parts
work on each token alone, so they can run on s/t rows per rank. What changes:

* ``SequenceParallelLayerNorm``: a LayerNorm on this rank's s/t rows. Its weight and bias
  are replicated but each rank's rows give only part of their gradient, so f
  (``copy_to_tp``: identity forward, all-reduce backward) sits on the weights themselves,
  and the gradient comes out summed over the tensor-parallel group (Megatron all-reduces the
  gradients of its ``sequence_parallel`` parameters for the same reason).
* ``linear_on_gathered_sequence``: a column-parallel layer's input is gathered along the
  sequence (as ``gather_sequence`` does) and multiplied, but only this rank's s/t rows are
  kept for backward, which gathers them again for the weight gradient (§4.2.2: that all-gather is
  overlapped with the input-gradient GEMM in Megatron). Keeping the gathered input instead
  would hold the whole (b, s, h) on every rank, just what SP is there to avoid.
* ``SequenceScatter`` / ``SequenceGather``: the embedding's output is split into s/t rows
  and the head's input gathered again, so the parallel model takes and returns what the
  dense one does.

Laptop:  ``python -m pytest -q tests/test_tensor_parallel_sp.py``
GPU box: the same layers under torchrun, one rank per GPU of a server (NCCL).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from lessonlib import bug_switches
from lessonlib.tensor_parallel.ops import (all_gather_along_sequence, copy_to_tp,
                                           gather_sequence, reduce_scatter_along_sequence,
                                           scatter_sequence)


class _LinearOnGatheredSequence(torch.autograd.Function):
    """Y = gather_sequence(X) A_r + b_r keeping only X's s/t rows: backward gathers X again."""

    @staticmethod
    def forward(ctx, x, weight, bias, group):
        ctx.group, ctx.has_bias = group, bias is not None
        ctx.save_for_backward(x, weight)                                # x: (b, s/t, in)
        return F.linear(all_gather_along_sequence(x, group), weight, bias)  # (b, s, out/t)

    @staticmethod
    def backward(ctx, grad):                                            # (b, s, out/t)
        x, weight = ctx.saved_tensors
        x_full = all_gather_along_sequence(x, ctx.group)                # again: (b, s, in)
        grad_x = reduce_scatter_along_sequence(grad @ weight, ctx.group)  # the gather's backward
        grad_weight = grad.flatten(0, -2).T @ x_full.flatten(0, -2)     # (out/t, in)
        grad_bias = grad.flatten(0, -2).sum(0) if ctx.has_bias else None
        return grad_x, grad_weight, grad_bias, None


def linear_on_gathered_sequence(x, weight, bias=None, group=None):
    """The column-parallel matmul under SP: (b, s/t, in) -> (b, s, out/t)."""
    if dist.get_world_size(group) == 1:
        return F.linear(x, weight, bias)
    return _LinearOnGatheredSequence.apply(x, weight, bias, group)


def check_shard(x, seq: int | None, group=None) -> None:
    """A sequence-parallel layer takes this rank's s/t rows, s at most ``seq`` (the model's
    length is a maximum, as for the dense model): fed more (the whole sequence, say) it would
    compute a wrong answer of the right shape, so say so instead."""
    t = dist.get_world_size(group)
    if seq is None or x.dim() < 2 or x.shape[1] * t <= seq:
        return
    n = x.shape[1]
    whole = " (the whole sequence?" if n == seq else " ("
    raise ValueError(f"a sequence-parallel layer takes this rank's s/t rows, but got {n} rows: "
                     f"{n} x t={t} is more than the model's sequence s={seq}{whole} feed it "
                     f"split_sequence(x, group) or a SequenceScatter's output)")


class SequenceParallelLayerNorm(nn.LayerNorm):
    """A LayerNorm on this rank's s/t rows, (b, s/t, h) -> (b, s/t, h), whose weight and
    bias gradients are summed over the tensor-parallel group by f. With ``seq`` (the
    sequence s the t ranks split) it refuses rows that are not an s/t shard."""

    def __init__(self, normalized_shape, eps: float = 1e-5, group=None, seq: int | None = None,
                 **factory):
        super().__init__(normalized_shape, eps, **factory)
        self.group, self.seq = group, seq

    @classmethod
    def from_layernorm(cls, ln: nn.LayerNorm, group=None,
                       seq: int | None = None) -> "SequenceParallelLayerNorm":
        """A copy of a dense LayerNorm's weight and bias, for this rank's rows."""
        layer = cls(ln.normalized_shape, ln.eps, group, seq, device=ln.weight.device,
                    dtype=ln.weight.dtype)
        layer.load_state_dict(ln.state_dict())
        return layer

    def forward(self, x):                                               # (b, s/t, h)
        check_shard(x, self.seq, self.group)
        weight, bias = self.weight, self.bias
        if not bug_switches.active("sp_layernorm_grad_not_summed"):    # the zoo drops the sum
            weight, bias = copy_to_tp(weight, self.group), copy_to_tp(bias, self.group)
        return F.layer_norm(x, self.normalized_shape, weight, bias, self.eps)


class SequenceScatter(nn.Module):
    """After a replicated part (the embedding): keep this rank's s/t rows."""

    def __init__(self, group=None):
        super().__init__()
        self.group = group

    def forward(self, x):
        return scatter_sequence(x, self.group)                          # (b, s/t, h)


class SequenceGather(nn.Module):
    """Before a replicated part (the head's output layer): gather the whole sequence; its
    gradient, already whole on every rank, is split back to this rank's rows."""

    def __init__(self, group=None):
        super().__init__()
        self.group = group

    def forward(self, x):
        return gather_sequence(x, self.group, split_grad=True)          # (b, s, h)
