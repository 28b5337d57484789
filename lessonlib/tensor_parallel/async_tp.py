"""Asynchronous tensor parallelism: the sequence all-gather and reduce-scatter cut into pieces
that travel while the GEMMs compute (Wang et al. 2023, "Overlap communication with dependent
computation via decomposition"; torchtitan's async TP, ``_micro_pipeline_tp`` in PyTorch).

What it teaches: under sequence parallelism a column layer must wait for the all-gather of
its input before it multiplies, and a row layer's reduce-scatter waits for its GEMM: the
communication is *exposed*. But the GEMM works row by row, so it can start on the rows that
are here. Cut the sequence into the t ranks' pieces (s/t rows each) and pass them round a
ring: post the transfer of the next piece, multiply the piece you have, wait, repeat
(``ring_all_gather``). The row layer runs the ring the other way (``ring_reduce_scatter``):
compute the partial product destined for the next rank down the ring while the running sum
travels, add, pass it on. t pieces, t-1 transfers, each hidden behind one piece's GEMM.

* ``all_gather_matmul``: Y = AllGather(X) A_r + b_r (the column layer). Backward: the weight
  gradient is accumulated piece by piece as X's pieces come round again, and the input
  gradient is a matmul-reduce-scatter, both decomposed the same way;
* ``matmul_reduce_scatter``: Y = ReduceScatter(X A_r) (the row layer). Backward: the output
  gradient's pieces come round the ring and each gives its rows of the input gradient and
  its share of the weight gradient;
* ``enable_async_tp(module)``: every sequence-parallel column/row layer in ``module`` runs
  the decomposed version, the same parameters (torchtitan's ``enable_async_tp`` switch).

Every transfer is one ``comm.batch_isend_irecv`` (a send to the next rank and a receive from
the previous one) on the tensor-parallel group: the pair is one NCCL group call, and only
that group's communicator is ever busy (``lessonlib.instruments.nccl_inflight``, rule 8). The pieces add
in the ring's order, so the sums differ from one reduce-scatter's only in rounding (at t = 2
there is one addition: the same).

Laptop:  ``python -c "from lessonlib.tensor_parallel import async_tp_runs as r;
         print(r.overlap_report())"``
GPU box: the same layers under torchrun (NCCL): the ring's sends run on NCCL's stream while
         the GEMMs run on the compute stream.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from lessonlib import comm
from lessonlib.tensor_parallel.layers import (ColumnParallelLinear, RowParallelLinear,
                                              check_input_slice)
from lessonlib.tensor_parallel.ops import copy_to_tp, gather_last_dim, scatter_last_dim


def _ring(group) -> tuple[int, int, int, int]:
    """(t, this rank's place r in the group, the global ranks of r+1 and r-1)."""
    members = dist.get_process_group_ranks(group or dist.group.WORLD)
    t, r = len(members), dist.get_rank(group)
    return t, r, members[(r + 1) % t], members[(r - 1) % t]


def _pass_on(piece, group, nxt, prev):
    """Post: ``piece`` to the next rank, the previous rank's into a fresh buffer. The
    handles come back receive first: by the time it has landed the send is usually done."""
    arriving = torch.empty_like(piece)
    works = comm.batch_isend_irecv([comm.recv_op(arriving, prev, group),
                                    comm.send_op(piece, nxt, group)])
    return arriving, works


def ring_all_gather(x, group, use) -> None:
    """Call ``use(j, x_j)`` for every rank j's piece x_j, this rank's first; each piece's
    ``use`` runs while the next piece travels."""
    t, r, nxt, prev = _ring(group)
    here = x.contiguous()                                              # (b, s/t, ...)
    for k in range(t):
        if k < t - 1:
            arriving, works = _pass_on(here, group, nxt, prev)        # post the next piece
        use((r - k) % t, here)                                         # compute on this one
        if k < t - 1:
            for work in works:
                work.wait()
            here = arriving


def ring_reduce_scatter(partial, group):
    """The sum over ranks of ``partial(r)``, on each rank r: the running sum for rank j starts
    at rank j+1 and goes round the ring, each rank adding ``partial(j)`` while the sum it
    passed on is in flight."""
    t, r, nxt, prev = _ring(group)
    total = partial((r - 1) % t)
    for k in range(1, t):
        arriving, works = _pass_on(total.contiguous(), group, nxt, prev)
        mine = partial((r - 1 - k) % t)                                # compute meanwhile
        for work in works:
            work.wait()
        total = arriving + mine
    return total                                                       # (b, s/t, ...)


def _rows(x, j: int, t: int):
    """Rank j's s/t rows of x along the sequence (dim 1)."""
    return x.chunk(t, dim=1)[j]


class _AllGatherMatmul(torch.autograd.Function):
    """Y = AllGather(X) W^T + b, keeping only X's s/t rows for backward (as SP does)."""

    @staticmethod
    def forward(ctx, x, weight, bias, group):                          # x: (b, s/t, in)
        ctx.group, ctx.has_bias = group, bias is not None
        ctx.save_for_backward(x, weight)
        t = dist.get_world_size(group)
        out = [None] * t

        def multiply(j, piece):
            out[j] = F.linear(piece, weight, bias)                     # (b, s/t, out/t)
        ring_all_gather(x, group, multiply)
        return torch.cat(out, dim=1)                                   # (b, s, out/t)

    @staticmethod
    def backward(ctx, grad):                                           # (b, s, out/t)
        x, weight = ctx.saved_tensors
        t = dist.get_world_size(ctx.group)
        grad_weight = torch.zeros_like(weight)                         # (out/t, in)

        def accumulate(j, piece):
            grad_weight.add_(_rows(grad, j, t).flatten(0, -2).T @ piece.flatten(0, -2))
        ring_all_gather(x, ctx.group, accumulate)                      # X's pieces again
        grad_x = ring_reduce_scatter(lambda j: _rows(grad, j, t) @ weight, ctx.group)
        grad_bias = grad.flatten(0, -2).sum(0) if ctx.has_bias else None
        return grad_x, grad_weight, grad_bias, None


class _MatmulReduceScatter(torch.autograd.Function):
    """Y = ReduceScatter(X W^T) along the sequence: (b, s, in/t) -> (b, s/t, out)."""

    @staticmethod
    def forward(ctx, x, weight, group):
        ctx.group = group
        ctx.save_for_backward(x, weight)
        t = dist.get_world_size(group)
        return ring_reduce_scatter(lambda j: F.linear(_rows(x, j, t), weight), group)

    @staticmethod
    def backward(ctx, grad):                                           # (b, s/t, out)
        x, weight = ctx.saved_tensors
        t = dist.get_world_size(ctx.group)
        grad_x, grad_weight = [None] * t, torch.zeros_like(weight)     # (out, in/t)

        def use(j, piece):                                             # rank j's rows
            grad_x[j] = piece @ weight                                 # (b, s/t, in/t)
            grad_weight.add_(piece.flatten(0, -2).T @ _rows(x, j, t).flatten(0, -2))
        ring_all_gather(grad, ctx.group, use)
        return torch.cat(grad_x, dim=1), grad_weight, None


def all_gather_matmul(x, weight, bias=None, group=None):
    """The column layer under SP, decomposed: (b, s/t, in) -> (b, s, out/t)."""
    if dist.get_world_size(group) == 1:
        return F.linear(x, weight, bias)
    return _AllGatherMatmul.apply(x, weight, bias, group)


def matmul_reduce_scatter(x, weight, group=None):
    """The row layer's GEMM and reduce-scatter under SP, decomposed: (b, s, in/t) ->
    (b, s/t, out), the sum over ranks (no bias)."""
    if dist.get_world_size(group) == 1:
        return F.linear(x, weight)
    return _MatmulReduceScatter.apply(x, weight, group)


class AsyncColumnParallelLinear(ColumnParallelLinear):
    """A sequence-parallel ``ColumnParallelLinear`` whose gather overlaps its GEMM."""

    def forward(self, x):                                              # (b, s/t, in)
        y = all_gather_matmul(x, self.weight, self.bias, self.group)   # (b, s, out/t)
        return gather_last_dim(y, self.group) if self.gather_output else y


class AsyncRowParallelLinear(RowParallelLinear):
    """A sequence-parallel ``RowParallelLinear`` whose GEMM overlaps its reduce-scatter."""

    def forward(self, x):
        x = x if self.input_is_parallel else scatter_last_dim(x, self.group)  # (b, s, in/t)
        check_input_slice(self, x)
        y = matmul_reduce_scatter(x, self.weight, self.group)         # (b, s/t, out)
        return y if self.bias is None else y + copy_to_tp(self.bias, self.group)


def enable_async_tp(module):
    """Every sequence-parallel column and row layer in ``module`` runs decomposed, in place
    (the same parameters and hooks); returns ``module``."""
    for layer in module.modules():
        if getattr(layer, "sequence_parallel", False):
            if type(layer) is ColumnParallelLinear:
                layer.__class__ = AsyncColumnParallelLinear
            elif type(layer) is RowParallelLinear:
                layer.__class__ = AsyncRowParallelLinear
    return module
