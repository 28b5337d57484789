"""Megatron's tensor-parallel layers: column-parallel and row-parallel linear, an MLP and
self-attention split over t ranks (Megatron-LM, Shoeybi et al. 2019, §3).

What it teaches: a linear layer Y = X A can be split two ways.

* **Column-parallel** (``ColumnParallelLinear``): A = [A_1 ... A_t] split by columns (output
  features). Every rank needs the whole X and produces its slice Y_r = X A_r. Nothing to
  add up, so a nonlinearity such as GeLU can be applied to each slice on its own.
* **Row-parallel** (``RowParallelLinear``): A split by rows (input features); rank r takes
  the slice X_r of the input and produces a partial result X_r A_r; the output is the sum
  over ranks, one all-reduce (operator g).

The MLP Z = GeLU(X A) B splits A by columns and B by rows: the slice GeLU(X A_r) is exactly
the input slice the row-parallel B_r needs, so the only messages are g's all-reduce forward
and f's all-reduce backward. Attention splits the same way, by heads: Q, K, V column-parallel
(a/t heads per rank), the output projection row-parallel.

PyTorch's ``nn.Linear`` stores A transposed, as ``weight`` (out, in): a column split of A is a
split of ``weight``'s rows. Every layer is built from a dense layer by slicing its weights
(``from_linear``), so any t is the same model as t = 1.

Laptop:  ``python -c "import lessonlib as L; print(L.launch(L.tensor_parallel.parallelize.demo_mlp, 2))"``
GPU box: the same call uses NCCL on 2 GPUs; under torchrun build the layers on each rank.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from lessonlib.argcheck import positive_int
from lessonlib.models import attention_core, init_weights_
from lessonlib.tensor_parallel.ops import (copy_to_tp, gather_last_dim, reduce_from_tp,
                                           reduce_scatter_sequence, scatter_last_dim)
from lessonlib.tensor_parallel.sequence import linear_on_gathered_sequence


# ---------------------------------------------------------------- checks (no collectives)
def tp_size(group=None, t: int | None = None) -> int:
    """The tensor-parallel size t = the group's size; ``t``, if given, must agree with it."""
    if not dist.is_initialized():
        raise ValueError("tensor-parallel layers need a process group: build them inside a "
                         "function run by lessonlib.launch (or under torchrun)")
    size = dist.get_world_size(group)
    if t is not None and positive_int("t", t, what="the tensor-parallel size") != size:
        raise ValueError(f"t={t} but the tensor-parallel group has {size} ranks; pass a group "
                         f"of t ranks (dist.new_group) or t={size}")
    return size


def check_divisible(setting: str, value: int, t: int) -> None:
    """``value`` must split evenly over t ranks; say which t would work if not."""
    if value % t:
        ok = [d for d in range(1, value + 1) if value % d == 0 and d <= 64]
        raise ValueError(f"{setting}={value} is not divisible by the tensor-parallel size t={t}; "
                         f"each rank must get an equal share (t in {ok} would work)")


def check_pair(gather_output: bool, input_is_parallel: bool) -> None:
    """A column-parallel layer feeding a row-parallel one must agree on what passes between."""
    if gather_output and input_is_parallel:
        raise ValueError("gather_output=True hands the row-parallel layer the full (..., n) "
                         "output, but input_is_parallel=True expects this rank's (..., n/t) "
                         "slice: use gather_output=False with input_is_parallel=True (Megatron's "
                         "pairing, nothing sent in between) or True with False")
    if not gather_output and not input_is_parallel:
        raise ValueError("gather_output=False hands the row-parallel layer this rank's "
                         "(..., n/t) slice, but input_is_parallel=False would slice it again: "
                         "use input_is_parallel=True (Megatron's pairing)")


def _my_slice(tensor, t: int, rank: int, dim: int):
    return tensor.detach().chunk(t, dim=dim)[rank].clone()


# ---------------------------------------------------------------- the two linear layers
class ColumnParallelLinear(nn.Module):
    """Y = f(X) A_r (+ b_r): this rank's out_features/t output columns of a dense linear.

    Input (..., in) replicated on every rank; output (..., out/t), or (..., out) when
    ``gather_output`` all-gathers the slices. The f before the matmul all-reduces the input
    gradient in the backward pass. With ``sequence_parallel`` the input is this rank's s/t
    rows, (b, s/t, in), gathered along the sequence instead of f (``sequence`` module).

    The constructor fills the weights as ``init_weights_`` fills a dense ``nn.Linear(in,
    out)`` from ``seed`` and keeps this rank's rows, so every t is the same dense layer;
    ``from_linear`` slices a dense layer you already have.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, group=None,
                 gather_output: bool = True, t: int | None = None, seed: int = 0,
                 sequence_parallel: bool = False):
        super().__init__()
        dense = init_weights_(nn.Linear(in_features, out_features, bias), seed)
        self._keep_my_slices([dense], group, gather_output, t, sequence_parallel)

    @classmethod
    def from_linear(cls, linear: nn.Linear, group=None, gather_output: bool = True,
                    t: int | None = None, sequence_parallel: bool = False):
        """This rank's rows of ``linear.weight`` (= columns of A) and of its bias."""
        return cls.from_linears([linear], group, gather_output, t, sequence_parallel)

    @classmethod
    def from_linears(cls, linears, group=None, gather_output: bool = False,
                     t: int | None = None, sequence_parallel: bool = False):
        """One fused layer for several linears that read the same input (Megatron fuses Q, K
        and V into one GEMM): this rank's slice of each, stacked. With more than one linear
        the local output is [slice of 1, slice of 2, ...], so it cannot be gathered."""
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer._keep_my_slices(list(linears), group, gather_output, t, sequence_parallel)
        return layer

    def _keep_my_slices(self, linears, group, gather_output, t, sequence_parallel):
        if len(linears) > 1 and gather_output:
            raise ValueError("gather_output=True is not possible for a fused layer (the "
                             "gathered columns would be interleaved by rank)")
        self.t = tp_size(group, t)
        for lin in linears:
            check_divisible("out_features", lin.out_features, self.t)
        self.group, self.gather_output = group, gather_output
        self.sequence_parallel = sequence_parallel
        self.in_features = linears[0].in_features
        self.out_features = sum(lin.out_features for lin in linears)
        rank = dist.get_rank(group)
        self.weight = nn.Parameter(torch.cat(
            [_my_slice(lin.weight, self.t, rank, 0) for lin in linears]))
        self.bias = None if linears[0].bias is None else nn.Parameter(torch.cat(
            [_my_slice(lin.bias, self.t, rank, 0) for lin in linears]))

    def forward(self, x):
        if self.sequence_parallel:                              # gathered: (b, s/t, in) in
            y = linear_on_gathered_sequence(x, self.weight, self.bias, self.group)
        else:
            y = F.linear(copy_to_tp(x, self.group), self.weight, self.bias)  # f: (..., in) in
        return gather_last_dim(y, self.group) if self.gather_output else y  # (..., out/t)

    def extra_repr(self):
        return (f"in={self.in_features}, out={self.out_features}, t={self.t}, "
                f"gather_output={self.gather_output}, sequence_parallel={self.sequence_parallel}")


class RowParallelLinear(nn.Module):
    """Y = g(X_r A_r) + b: this rank's in_features/t input rows of a dense linear.

    Input (..., in/t) when ``input_is_parallel``, else (..., in) and this rank keeps its
    slice; output (..., out), complete on every rank after g's all-reduce. The bias is added
    once, after the sum, so every rank holds the whole (replicated) bias. With
    ``sequence_parallel`` the sum is a reduce-scatter along the sequence (Korthikanti's
    g-bar): each rank gets its s/t rows complete, (b, s/t, out), and the bias, added to
    those rows only, gets its gradient summed over the group by f.

    The constructor fills the weights like ``ColumnParallelLinear``'s, from ``seed``.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, group=None,
                 input_is_parallel: bool = False, t: int | None = None, seed: int = 0,
                 sequence_parallel: bool = False):
        super().__init__()
        dense = init_weights_(nn.Linear(in_features, out_features, bias), seed)
        self._keep_my_slice(dense, group, input_is_parallel, t, sequence_parallel)

    @classmethod
    def from_linear(cls, linear: nn.Linear, group=None, input_is_parallel: bool = False,
                    t: int | None = None, sequence_parallel: bool = False):
        """This rank's columns of ``linear.weight`` (= rows of A); the bias is copied whole."""
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer._keep_my_slice(linear, group, input_is_parallel, t, sequence_parallel)
        return layer

    def _keep_my_slice(self, linear, group, input_is_parallel, t, sequence_parallel):
        self.t = tp_size(group, t)
        check_divisible("in_features", linear.in_features, self.t)
        self.group, self.input_is_parallel = group, input_is_parallel
        self.sequence_parallel = sequence_parallel
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = nn.Parameter(_my_slice(linear.weight, self.t, dist.get_rank(group), 1))
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone())

    def forward(self, x):
        x = x if self.input_is_parallel else scatter_last_dim(x, self.group)  # (..., in/t)
        check_input_slice(self, x)
        partial = F.linear(x, self.weight)                             # X_r A_r, a partial sum
        if self.sequence_parallel:
            y = reduce_scatter_sequence(partial, self.group)           # (b, s/t, out)
            bias = self.bias if self.bias is None else copy_to_tp(self.bias, self.group)
        else:
            y, bias = reduce_from_tp(partial, self.group), self.bias   # g: (..., out)
        return y if bias is None else y + bias

    def extra_repr(self):
        return (f"in={self.in_features}, out={self.out_features}, t={self.t}, "
                f"input_is_parallel={self.input_is_parallel}, "
                f"sequence_parallel={self.sequence_parallel}")


def check_input_slice(layer: RowParallelLinear, x) -> None:
    """A row-parallel layer takes this rank's in/t slice: say so if it got something else."""
    if x.shape[-1] != layer.weight.shape[1]:
        raise ValueError(
            f"RowParallelLinear(input_is_parallel=True) takes this rank's slice of the input, "
            f"last dim in/t = {layer.weight.shape[1]}, but got {x.shape[-1]}"
            + (" (the full input?): pass input_is_parallel=False to split it here, or feed "
               "it a ColumnParallelLinear(gather_output=False)'s output"
               if x.shape[-1] == layer.in_features else ""))


# ---------------------------------------------------------------- MLP and attention
class TensorParallelMLP(nn.Module):
    """Z = g(GeLU(f(X) A_r) B_r) + b2: ``fc1`` column-parallel, ``fc2`` row-parallel."""

    def __init__(self, fc1: ColumnParallelLinear, fc2: RowParallelLinear):
        super().__init__()
        check_pair(fc1.gather_output, fc2.input_is_parallel)
        self.fc1, self.fc2 = fc1, fc2

    @classmethod
    def from_mlp(cls, mlp, group=None, t: int | None = None, gather_output: bool = False,
                 input_is_parallel: bool = True,
                 sequence_parallel: bool = False) -> "TensorParallelMLP":
        """Split a dense ``lessonlib.models.MLP`` (fc1, fc2) over the group's t ranks; with
        ``sequence_parallel`` it takes and returns this rank's s/t rows."""
        check_pair(gather_output, input_is_parallel)
        return cls(ColumnParallelLinear.from_linear(mlp.fc1, group, gather_output, t,
                                                    sequence_parallel),
                   RowParallelLinear.from_linear(mlp.fc2, group, input_is_parallel, t,
                                                 sequence_parallel))

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))                           # (..., h)


class TensorParallelSelfAttention(nn.Module):
    """Causal self-attention with a/t heads per rank: fused Q, K, V column-parallel by
    heads (one f), each rank attends with its own heads, ``proj`` row-parallel (one g)."""

    def __init__(self, qkv: ColumnParallelLinear, proj: RowParallelLinear, head_dim: int):
        super().__init__()
        check_pair(qkv.gather_output, proj.input_is_parallel)
        self.qkv, self.proj, self.head_dim = qkv, proj, head_dim
        self.recompute_core = False     # selective recompute, as in the dense model

    @classmethod
    def from_attention(cls, attn, group=None, t: int | None = None,
                       sequence_parallel: bool = False):
        """Split a dense ``lessonlib.models.SelfAttention``: rank r keeps heads
        r*a/t .. (r+1)*a/t - 1 of Q, K and V, and the matching input rows of ``proj``."""
        t = tp_size(group, t)
        heads = attn.q.out_features // attn.head_dim
        check_divisible("heads", heads, t)
        qkv = ColumnParallelLinear.from_linears([attn.q, attn.k, attn.v], group, False, t,
                                                sequence_parallel)
        proj = RowParallelLinear.from_linear(attn.proj, group, True, t, sequence_parallel)
        layer = cls(qkv, proj, attn.head_dim)
        layer.recompute_core = attn.recompute_core
        return layer

    def forward(self, x):                                              # (b, s, h) or SP's s/t
        q, k, v = self.heads(x)                                        # (b, a/t, s, h/a)
        b, s = q.shape[0], q.shape[2]
        y = attention_core(q, k, v, self.recompute_core)               # (b, a/t, s, h/a)
        return self.proj(y.transpose(1, 2).reshape(b, s, -1))         # (b, s, h) or s/t

    def heads(self, x):
        """This rank's q, k and v of ``x``, (b, a/t, s, h/a) each (SP: s gathered from s/t),
        as the dense ``SelfAttention.heads`` gives all a heads."""
        qkv = self.qkv(x)                                              # (b, s, 3h/t)
        return tuple(self.split_heads(z) for z in qkv.chunk(3, dim=-1))

    def split_heads(self, x):
        b, s, _ = x.shape
        return x.view(b, s, -1, self.head_dim).transpose(1, 2)        # (b, a/t, s, h/a)
