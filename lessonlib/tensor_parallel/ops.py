"""The four communication operators of tensor parallelism, as autograd functions.

What it teaches: Megatron-LM (Shoeybi et al. 2019, §3) makes a layer tensor-parallel with
two conjugate operators placed around the split matrices:

* **f** (``copy_to_tp``): identity in the forward pass, all-reduce in the backward pass. It
  sits where a replicated activation enters the column-parallel matrix: every rank uses
  the whole input, so the gradient of that input is the *sum* of the ranks' partial
  gradients.
* **g** (``reduce_from_tp``): all-reduce in the forward pass, identity in the backward
  pass. It sits after the row-parallel matrix: each rank holds a partial sum of the output,
  the all-reduce completes it, and the gradient of a sum flows back unchanged to each term.

f and g are each other's transpose: one all-reduce forward (g) and one backward (f) per MLP.
Two more operators move between a replicated and a split last dim:

* ``gather_last_dim``: all-gather forward (concatenate the shards), split backward;
* ``scatter_last_dim``: split forward (keep this rank's slice), all-gather backward.

Every message goes through ``lessonlib.comm``, so a ledger can count them. With a group of
one rank every operator is the identity and sends nothing.

Laptop:  ``python -c "import lessonlib as L; print(L.launch(L.tensor_parallel.ops.demo_f_and_g, 2))"``
GPU box: the same call runs on NCCL when 2 GPUs are visible; under torchrun call the
functions inside your own rank function.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from lessonlib import bugs, comm, device


def _size_and_rank(group) -> tuple[int, int]:
    return dist.get_world_size(group), dist.get_rank(group)


def _all_gather_last_dim(x, group):
    t, _ = _size_and_rank(group)
    x = x.contiguous()
    shards = [torch.empty_like(x) for _ in range(t)]
    comm.all_gather(shards, x, group=group)
    return torch.cat(shards, dim=-1)                                   # (..., t * n)


def _split_last_dim(x, group):
    t, rank = _size_and_rank(group)
    if x.shape[-1] % t:
        raise ValueError(f"the last dim ({x.shape[-1]}) must be divisible by the tensor-"
                         f"parallel size t={t} to split it evenly")
    return x.chunk(t, dim=-1)[rank].contiguous()                       # (..., n / t)


class _CopyToTP(torch.autograd.Function):
    """Megatron's f: identity forward, all-reduce of the input gradient backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        # Bug zoo: f's all-reduce left out, each rank keeps its partial input gradient
        if bugs.active("tp_missing_backward_all_reduce"):
            return grad, None
        grad = grad.contiguous().clone()   # never write into a gradient autograd still owns
        comm.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    """Megatron's g: all-reduce of the partial sums forward, identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        out = x.contiguous().clone()
        comm.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherLastDim(torch.autograd.Function):
    """All-gather along the last dim forward; keep this rank's slice of the gradient backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _all_gather_last_dim(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _split_last_dim(grad, ctx.group), None


class _ScatterLastDim(torch.autograd.Function):
    """Keep this rank's slice of the last dim forward; all-gather the gradient backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _split_last_dim(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather_last_dim(grad, ctx.group), None


def _apply(op, x, group):
    if dist.get_world_size(group) == 1:
        return x
    return op.apply(x, group)


def copy_to_tp(x, group=None):
    """Megatron's **f**: identity forward, all-reduce backward (before a column split)."""
    return _apply(_CopyToTP, x, group)


def reduce_from_tp(x, group=None):
    """Megatron's **g**: all-reduce forward, identity backward (after a row split)."""
    return _apply(_ReduceFromTP, x, group)


def gather_last_dim(x, group=None):
    """All-gather the last dim forward (..., n/t) -> (..., n); split it backward."""
    return _apply(_GatherLastDim, x, group)


def scatter_last_dim(x, group=None):
    """Keep this rank's slice of the last dim forward (..., n) -> (..., n/t); all-gather
    backward."""
    return _apply(_ScatterLastDim, x, group)


f = copy_to_tp
g = reduce_from_tp


def demo_f_and_g() -> dict:
    """On each rank: f leaves x alone but sums its gradient; g sums x but not its gradient."""
    rank = dist.get_rank()
    x = torch.full((3,), float(rank + 1), device=device.current_device(), requires_grad=True)
    with comm.ledger() as book:
        y_f = copy_to_tp(x)
        y_f.sum().backward()
        grad_f = x.grad.clone()
        x.grad = None
        y_g = reduce_from_tp(x)
        y_g.sum().backward()
    return {"rank": rank, "f(x)": y_f.tolist(), "f grad": grad_f.tolist(),
            "g(x)": y_g.tolist(), "g grad": x.grad.tolist(),
            "all_reduces": book.count("all_reduce")}
