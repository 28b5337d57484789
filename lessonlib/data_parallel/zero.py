"""ZeRO stage 1: every rank keeps the optimizer state of only its slice of the parameters.

What it teaches: Adam's two moments are twice the model's size, and replicated data
parallelism keeps them d times. ``ShardedOptimizer`` (the contract of PyTorch's
``torch.distributed.optim.ZeroRedundancyOptimizer``) wraps any torch optimizer: the
parameters, flattened one after another, are cut into d equal ranges (``sharded.flat_ranges``);
each rank builds the inner optimizer on views of its own range only, steps it, and then one
all-gather shares the updated ranges, so every rank holds the whole updated model again.

Two ways to sync the gradients first:

* replicated: ``DataParallel`` (or PyTorch's DDP) all-reduces them during backward, as with
  ``ZeroRedundancyOptimizer``. All-reduce plus all-gather is 3(n-1)/n x S per rank;
* sharded: ``reduce_scatter_gradients()`` after ``loss.backward()`` leaves each rank the
  averaged gradient of its own range only, which is all its step needs. Reduce-scatter plus
  all-gather is (n-1)/n x S twice: exactly an all-reduce's 2(n-1)/n x S, ZeRO's claim that
  stage 1 costs no more traffic than plain data parallelism (ZeRO §7.2.1).

Laptop:  ``python labs/zero.py --world-size 2``
GPU box: ``torchrun --nproc-per-node 8 labs/zero.py`` (NCCL)
"""
from __future__ import annotations

import torch
from torch import nn

from lessonlib import comm
from lessonlib.data_parallel.collectives import group_ranks
from lessonlib.data_parallel.sharded import (distinct_parameters, flat_ranges,
                                             optimizer_state_bytes, tensor_bytes)


class ShardedOptimizer:
    """``optimizer_cls(**kwargs)`` stepping only this rank's 1/d of ``params`` (ZeRO-1).

    ``step()`` expects gradients already averaged over ``group`` (by ``DataParallel``, or by
    ``reduce_scatter_gradients()``), steps this rank's range, then all-gathers every range
    into the parameters. Frozen parameters are left alone; a tied weight is stepped once.
    The parameters must start equal on every rank (``DataParallel`` or ``replicate`` copies
    rank 0's), as with PyTorch's ZeroRedundancyOptimizer."""

    def __init__(self, params, optimizer_cls, group=None, **kwargs):
        params = distinct_parameters(params)
        self.params = [p for p in params if p.requires_grad]
        if not self.params:
            raise ValueError(f"ShardedOptimizer got {len(params)} parameters, none of them "
                             f"trainable: pass a model's parameters() with requires_grad=True")
        dtypes = {p.dtype for p in self.params} | {p.device for p in self.params}
        if len(dtypes) > 2:
            raise ValueError(f"ShardedOptimizer needs parameters of one dtype on one device "
                             f"(they share one flat buffer); got {sorted(map(str, dtypes))}")
        self.rank, members = group_ranks(group)            # raises before any message
        self.group, self.world_size = group, len(members)
        numels = [p.numel() for p in self.params]
        self.shard_numel, self.ranges = flat_ranges(numels, self.rank, self.world_size)
        # The inner optimizer steps views into the parameters' own storage: no second copy.
        self.pieces = [nn.Parameter(self.params[i].detach().view(-1)[a:b])
                       for i, a, b in self.ranges]
        starts = [sum(numels[:i]) for i in range(len(numels))]
        self.offsets = [starts[i] + a - self.rank * self.shard_numel for i, a, _ in self.ranges]
        # A rank whose range is all padding (P < d x L) still takes part, stepping nothing.
        empty = [] if self.pieces else [nn.Parameter(self.params[0].new_zeros(0))]
        self.optim = optimizer_cls(self.pieces + empty, **kwargs)
        self._scattered: torch.Tensor | None = None

    # The torch.optim.Optimizer surface a training loop and an LR scheduler use.
    @property
    def param_groups(self):
        return self.optim.param_groups

    @property
    def state(self):
        return self.optim.state

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if p.grad is not None:
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.zero_()
        self._scattered = None

    def _flat(self, tensors) -> torch.Tensor:
        """The tensors flattened one after another and zero-padded to d x L elements."""
        p0 = self.params[0]
        flat = torch.zeros(self.world_size * self.shard_numel, dtype=p0.dtype, device=p0.device)
        torch.cat([t.reshape(-1) for t in tensors], out=flat[:sum(t.numel() for t in tensors)])
        return flat

    @torch.no_grad()
    def reduce_scatter_gradients(self) -> None:
        """Average the gradients over the group, keeping only this rank's range: one
        reduce-scatter of the flat gradients, (n-1)/n x S sent per rank. The parameters'
        ``.grad`` stay this rank's own; ``step()`` uses the averaged range."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        flat = self._flat(grads)                                       # (d * L,)
        mine = torch.empty(self.shard_numel, dtype=flat.dtype, device=flat.device)  # (L,)
        if self.world_size > 1:
            comm.reduce_scatter_tensor(mine, flat, group=self.group)
        else:
            mine.copy_(flat)
        self._scattered = mine.div_(self.world_size)

    @torch.no_grad()
    def step(self, closure=None):
        """Step this rank's range, then all-gather every rank's range into the parameters."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for piece, (i, a, b), offset in zip(self.pieces, self.ranges, self.offsets):
            if self._scattered is not None:
                piece.grad = self._scattered[offset:offset + b - a]
            else:
                grad = self.params[i].grad
                piece.grad = None if grad is None else grad.reshape(-1)[a:b]
        self.optim.step()
        mine = torch.zeros(self.shard_numel, dtype=self.params[0].dtype,
                           device=self.params[0].device)                      # (L,)
        for piece, offset in zip(self.pieces, self.offsets):
            mine[offset:offset + piece.numel()] = piece
        everything = torch.empty(self.world_size * self.shard_numel, dtype=mine.dtype,
                                 device=mine.device)                          # (d * L,)
        if self.world_size > 1:
            comm.all_gather_into_tensor(everything, mine, group=self.group)
        else:
            everything.copy_(mine)
        start = 0
        for p in self.params:
            p.view(-1).copy_(everything[start:start + p.numel()])
            start += p.numel()
        for piece in self.pieces:
            piece.grad = None
        self._scattered = None
        return loss

    def memory_bytes(self) -> dict[str, int]:
        """What this rank holds for the parameters it steps: the whole weights and gradients
        (replicated at stage 1) and the optimizer state of its range only."""
        held = {"weights": tensor_bytes(self.params),
                "gradients": tensor_bytes(p.grad for p in self.params),
                "optimizer": optimizer_state_bytes(self.optim, self.pieces)}
        return {**held, "total": sum(held.values())}

    def padding(self) -> int:
        """Elements of this rank's range that are padding (only the last ranks have any)."""
        return self.shard_numel - sum(b - a for _, a, b in self.ranges)
