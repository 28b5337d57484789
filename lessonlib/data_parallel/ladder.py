"""The first three rungs of the data-parallel ladder, and what every rung shares.

What it teaches: data parallelism is five steps (replicate the model, shard the batch,
compute local gradients, all-reduce them, update), and the engineering is all in *how* the
gradients are all-reduced. Each rung keeps the numbers identical and spends less time:

(a) ``allreduce_gradients``: after backward, one blocking all-reduce per parameter.
    Simple, and slow: many small messages, each paying the latency, none overlapping compute.
(b) ``allreduce_flat_gradients``: after backward, copy every gradient into one flat buffer
    and all-reduce it once. One latency instead of hundreds, still no overlap. The hybrid
    layouts, context and expert parallelism average their gradients with this same rung
    (``sync_gradients``: the dense weights over their group, the experts' over theirs).
(c) ``AsyncGradientHooks``: during backward, as soon as a parameter's gradient is final
    (``register_post_accumulate_grad_hook``), launch its all-reduce asynchronously; a
    callback at the end of backward waits for them all. Overlap, but many small messages.
(d) ``lessonlib.data_parallel.DataParallel``: (c) with gradients packed into buckets, the
    design of PyTorch's DistributedDataParallel (Li et al., VLDB 2020).

Every rung starts from ``replicate``: the ranks check that their models have the same
parameter shapes, then take rank 0's weights, so all replicas start identical.

Laptop:  ``python labs/ddp.py --world-size 2 --rungs naive,flat,async,bucketed``
GPU box: ``torchrun --nproc-per-node 8 labs/ddp.py --rungs naive,flat,async,bucketed``
"""
from __future__ import annotations

import zlib

import torch
import torch.distributed as dist
from torch import nn

from lessonlib import bug_switches, comm
from lessonlib.data_parallel.collectives import group_ranks


def trainable_parameters(module: nn.Module) -> list[nn.Parameter]:
    """The parameters whose gradients are all-reduced: each once (a weight tied into two
    places is one parameter), frozen ones (``requires_grad=False``) left out."""
    return [p for p in module.parameters() if p.requires_grad]


_DTYPE_CODES = {torch.float32: 0, torch.float64: 1, torch.float16: 2, torch.bfloat16: 3}


def _signature(p: torch.Tensor) -> list[int]:
    """What must match across replicas, as integers: trainable?, dtype, ndim, then the dims."""
    return [int(p.requires_grad), _DTYPE_CODES.get(p.dtype, -2), p.ndim, *p.shape]


def _describe(row: list[int]) -> str:
    if row[0] < 0:
        return "missing"
    dtype = next((d for d, c in _DTYPE_CODES.items() if c == row[1]), "another dtype")
    frozen = "" if row[0] else ", frozen"
    return f"{tuple(row[3:3 + row[2]])} {str(dtype).replace('torch.', '')}{frozen}"


def check_same_shapes(module: nn.Module, group=None) -> None:
    """Raise the same ValueError on every rank if the replicas' parameters differ in number,
    shape, dtype or trainability (each changes which gradients are all-reduced). One
    all-gather of three integers; a second one, only on a mismatch, to name the first
    parameter that differs."""
    _, members = group_ranks(group)
    named = list(module.named_parameters())
    rows = [_signature(p) for _, p in named]
    n = len(members)
    if n == 1:
        return
    dev = named[0][1].device if named else None
    width = max((len(r) for r in rows), default=1)
    mine = torch.tensor([len(rows), width, zlib.crc32(repr(rows).encode())], dtype=torch.int64,
                        device=dev)
    gathered = [torch.empty_like(mine) for _ in range(n)]
    comm.all_gather(gathered, mine, group=group)
    summary = torch.stack(gathered).tolist()                             # (n, 3)
    if len({tuple(r) for r in summary}) == 1:
        return
    count, width = max(r[0] for r in summary), max(r[1] for r in summary)
    table = torch.full((count, width), -1, dtype=torch.int64, device=dev)   # (count, width)
    for i, row in enumerate(rows):
        table[i, :len(row)] = torch.tensor(row)
    tables = [torch.empty_like(table) for _ in range(n)]
    comm.all_gather(tables, table, group=group)
    counts = ", ".join(f"rank {members[i]}: {r[0]}" for i, r in enumerate(summary))
    for i in range(count):
        rows_i = [t[i].tolist() for t in tables]
        if len({tuple(r) for r in rows_i}) > 1:
            everywhere = i < min(r[0] for r in summary)     # then its name is the same too
            name = f" ({named[i][0]})" if everywhere else ""
            seen = ", ".join(f"rank {members[r]}: {_describe(row)}"
                             for r, row in enumerate(rows_i))
            raise ValueError(
                f"data parallelism needs the same model on every rank, but parameter #{i}"
                f"{name} differs: {seen} (parameter counts {counts}). Build every replica "
                f"from the same configuration")
    raise ValueError(f"the replicas' parameters differ across ranks (counts {counts})")


@torch.no_grad()
def broadcast_parameters(module: nn.Module, group=None) -> None:
    """Copy the group's first rank's parameters and buffers to every other rank (frozen
    ones too: they must match for the replicas to compute the same function)."""
    if dist.get_world_size(group) == 1:
        return
    _, members = group_ranks(group)
    for tensor in [*module.parameters(), *module.buffers()]:
        comm.broadcast(tensor.data, src=members[0], group=group)


def replicate(module: nn.Module, group=None) -> nn.Module:
    """Step one of data parallelism: make this rank's model a copy of rank 0's."""
    check_same_shapes(module, group)
    broadcast_parameters(module, group)
    return module


def _grad_or_zeros(p: torch.Tensor) -> torch.Tensor:
    """A parameter that got no gradient on this rank still takes part, with zeros, so every
    rank sends the same messages."""
    if p.grad is None:
        p.grad = torch.zeros_like(p)
    return p.grad


def gradients(params) -> list[torch.Tensor]:
    """The gradients to average of ``params`` (a module: its trainable parameters), zeros
    for a parameter that got none."""
    if isinstance(params, nn.Module):
        params = trainable_parameters(params)
    return [_grad_or_zeros(p) for p in params]


# ---------------------------------------------------------------- rung (a)
@torch.no_grad()
def allreduce_gradients(module: nn.Module, group=None) -> None:
    """Rung (a), called after ``loss.backward()``: average each gradient, one by one."""
    n = dist.get_world_size(group)
    for p in trainable_parameters(module):
        grad = _grad_or_zeros(p)
        comm.all_reduce(grad, group=group)
        grad.div_(n)


# ---------------------------------------------------------------- rung (b)
@torch.no_grad()
def allreduce_flat_gradients(grads: list[torch.Tensor], group=None,
                             divisor: float | None = None) -> None:
    """Rung (b), called after ``loss.backward()`` with ``gradients(model)``: one all-reduce
    of all the gradients, flattened, then each divided by ``divisor`` (default: the group's
    ranks), in place. A group of one rank sends nothing."""
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])                     # (total,)
    if dist.get_world_size(group) > 1:
        comm.all_reduce(flat, group=group)
    flat.div_(dist.get_world_size(group) if divisor is None else divisor)
    for grad, piece in zip(grads, flat.split([g.numel() for g in grads])):
        grad.copy_(piece.view_as(grad))


def sync_gradients(module: nn.Module, group=None, experts=(), expert_group=None,
                   d: int | None = None) -> None:
    """Rung (b) for a model whose weights are not all held by the same ranks: average
    ``module``'s gradients in place, one flat all-reduce each. The dense weights over
    ``group`` (divided by its ranks); the ``experts`` (the expert-parallel layers' own
    parameters, ``expert_parallel.expert_parameters``), if any, over ``expert_group`` (the
    ranks holding a copy of them), divided by the d data-parallel ranks. The hybrid layouts
    call it with their dp (or dp*cp) and edp groups, the expert-parallel lesson with the
    world and its edp group."""
    mine = {id(p) for p in experts}
    params = trainable_parameters(module)
    allreduce_flat_gradients(gradients(p for p in params if id(p) not in mine), group)
    if mine:
        if bug_switches.active("ep_expert_grads_wrong_group"):
            expert_group = group   # the bug: experts averaged like dense weights, over all d
        allreduce_flat_gradients(gradients(p for p in params if id(p) in mine), expert_group, d)


# ---------------------------------------------------------------- rung (c)
def queue_end_of_backward(callback) -> None:
    """Run ``callback`` once the current backward pass has finished computing gradients,
    before ``loss.backward()`` returns (the hook PyTorch's DDP uses for the same job)."""
    torch.autograd.Variable._execution_engine.queue_callback(callback)


class AsyncGradientHooks:
    """Rung (c): an asynchronous all-reduce per parameter, launched from the parameter's
    post-accumulate-grad hook while backward is still computing earlier layers.

    Gradients are averaged by the time ``loss.backward()`` returns. ``remove()`` detaches."""

    def __init__(self, module: nn.Module, group=None):
        self.module, self.group = replicate(module, group), group
        self.world_size = dist.get_world_size(group)
        self.params = trainable_parameters(module)
        self._pending: list[tuple[torch.Tensor, object]] = []
        self._waiting = False
        self._handles = [p.register_post_accumulate_grad_hook(self._on_grad) for p in self.params]

    def _on_grad(self, p: torch.Tensor) -> None:
        if not self._waiting:
            self._waiting = True
            queue_end_of_backward(self._finish)
        self._pending.append((p.grad, comm.all_reduce(p.grad, group=self.group, async_op=True)))

    @torch.no_grad()
    def _finish(self) -> None:
        launched = {id(g) for g, _ in self._pending}
        for p in self.params:                    # no gradient this step: all-reduce zeros
            if p.grad is None or id(p.grad) not in launched:
                grad = _grad_or_zeros(p)
                self._pending.append((grad, comm.all_reduce(grad, group=self.group,
                                                            async_op=True)))
        for grad, handle in self._pending:
            handle.wait()
            grad.div_(self.world_size)
        self._pending, self._waiting = [], False

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
