"""The seven communication operators of tensor and sequence parallelism, as autograd functions.

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

Sequence parallelism (Korthikanti et al. 2022, §4.2.2) keeps the LayerNorms and the residual
stream split along the sequence, s/t rows per rank, and replaces f and g by their
sequence-parallel conjugates. A ring all-reduce is a reduce-scatter followed by an
all-gather: g's all-reduce becomes a reduce-scatter (the row layer's output lands on s/t rows)
and the all-gather moves to the next column layer's input.

Korthikanti et al. call Megatron-2019's f and g "f and f-bar" and name the new pair "g and
g-bar"; here g already means Megatron-2019's, so the new pair goes by what it does:

* ``gather_sequence`` (their g): all-gather along the sequence forward, reduce-scatter of
  the gradient backward. It sits where f sat, before a column-parallel matrix: every rank
  needs the whole sequence, and each rank's partial input gradient must be summed and
  split back to s/t rows.
* ``reduce_scatter_sequence`` (their g-bar): reduce-scatter along the sequence forward,
  all-gather backward. It sits where g sat, after a row-parallel matrix.

Two more move between a replicated and a split sequence: ``scatter_sequence`` (keep this
rank's s/t rows forward, all-gather backward: after the embedding) and
``gather_sequence(x, group, split_grad=True)`` (all-gather forward, keep this rank's rows
of the gradient backward: before a replicated head, whose gradient every rank already has
whole).

Every message goes through ``lessonlib.comm``, so a ledger can count them. With a group of
one rank every operator is the identity and sends nothing.

Laptop:  ``python -c "import lessonlib as L; print(L.launch(L.tensor_parallel.ops.demo_f_and_g, 2))"``
GPU box: the same call runs on NCCL when 2 GPUs are visible; under torchrun call the
functions inside your own rank function.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from lessonlib import bug_switches, comm, device


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


def all_gather_along_sequence(x, group):
    """The plain collective (no autograd): every rank's s/t rows, concatenated along dim 1."""
    t, _ = _size_and_rank(group)
    x = x.contiguous()                                                 # (b, s/t, h)
    shards = [torch.empty_like(x) for _ in range(t)]
    comm.all_gather(shards, x, group=group)
    return torch.cat(shards, dim=1)                                    # (b, s, h)


def reduce_scatter_along_sequence(x, group):
    """The plain collective (no autograd): the sum over ranks of x, this rank's s/t rows."""
    t, _ = _size_and_rank(group)
    stacked = torch.cat(x.chunk(t, dim=1), dim=0)                      # (t*b, s/t, h)
    out = x.new_empty(stacked.shape[0] // t, *stacked.shape[1:])       # (b, s/t, h)
    comm.reduce_scatter_tensor(out, stacked, group=group)
    return out


def split_sequence(x, group):
    """This rank's s/t rows of the sequence (dim 1); one error naming s and t otherwise."""
    t, rank = _size_and_rank(group)
    if x.shape[1] % t:
        raise ValueError(f"sequence parallelism splits the sequence over the tensor-parallel "
                         f"ranks: s={x.shape[1]} is not divisible by t={t}; pick s a multiple "
                         f"of t, or sequence_parallel=False")
    return x.chunk(t, dim=1)[rank].contiguous()                        # (b, s/t, h)


class _CopyToTP(torch.autograd.Function):
    """Megatron's f: identity forward, all-reduce of the input gradient backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        # Bug zoo: f's all-reduce left out, each rank keeps its partial input gradient
        if bug_switches.active("tp_missing_backward_all_reduce"):
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


class _GatherSequence(torch.autograd.Function):
    """``gather_sequence``: all-gather along the sequence forward; backward,
    reduce-scatter the gradient (``split_grad``: keep this rank's rows of it)."""

    @staticmethod
    def forward(ctx, x, group, split_grad):
        ctx.group, ctx.split_grad = group, split_grad
        return all_gather_along_sequence(x, group)

    @staticmethod
    def backward(ctx, grad):
        if ctx.split_grad:
            return split_sequence(grad, ctx.group), None, None
        return reduce_scatter_along_sequence(grad, ctx.group), None, None


class _ReduceScatterSequence(torch.autograd.Function):
    """``reduce_scatter_sequence``: reduce-scatter along the sequence forward, all-gather
    backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return reduce_scatter_along_sequence(x, group)

    @staticmethod
    def backward(ctx, grad):
        return all_gather_along_sequence(grad, ctx.group), None


class _ScatterSequence(torch.autograd.Function):
    """Keep this rank's s/t rows forward; all-gather the gradient backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return split_sequence(x, group)

    @staticmethod
    def backward(ctx, grad):
        return all_gather_along_sequence(grad, ctx.group), None


def _apply(op, x, group, *args):
    if dist.get_world_size(group) == 1:
        return x
    return op.apply(x, group, *args)


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


def gather_sequence(x, group=None, split_grad: bool = False):
    """All-gather the sequence forward (b, s/t, h) -> (b, s, h) (Korthikanti et al.'s g);
    reduce-scatter the gradient backward (before a column split), or with
    ``split_grad`` keep this rank's rows of it (before a replicated layer)."""
    return _apply(_GatherSequence, x, group, split_grad)


def reduce_scatter_sequence(x, group=None):
    """Reduce-scatter the partial sums forward (b, s, h) -> (b, s/t, h) (their g-bar),
    each rank's s/t rows complete; all-gather the gradient backward (after a row split)."""
    return _apply(_ReduceScatterSequence, x, group)


def scatter_sequence(x, group=None):
    """Keep this rank's s/t rows forward (b, s, h) -> (b, s/t, h); all-gather backward."""
    return _apply(_ScatterSequence, x, group)


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
