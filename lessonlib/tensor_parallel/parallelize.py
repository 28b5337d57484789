"""Tensor parallelism for the course's tiny GPT: which parts are split and which are copied.

What it teaches: Megatron-LM (Shoeybi et al. 2019, §3) splits only the big matrices of each
transformer layer. ``parallelize_gpt`` takes a plain ``TinyGPT`` and swaps, in every block,
``attn`` for ``TensorParallelSelfAttention`` (a/t heads per rank) and ``mlp`` for
``TensorParallelMLP`` (4h/t inner columns per rank). Per layer that is two all-reduces in the
forward pass (g after attention and after the MLP) and two in the backward (f before each),
each of b*s*h elements. A ring all-reduce of S bytes moves 2(t-1)/t * S bytes per rank, so
one layer moves 4 * 2(t-1)/t * b*s*h = 8*b*s*h*(t-1)/t elements per rank per micro-batch,
Megatron-LM 2021 (Narayanan et al.) §3.2.

What stays replicated (every rank holds a full copy and computes the same thing on the
same data): the token and position embeddings, the LayerNorms, the biases of the
row-parallel layers (added once, after g), and the output head, unless
``vocab_parallel=True``: then the token embedding and the head are split by vocabulary rows
(Megatron-LM 2019, §3), at the cost of one all-reduce forward for the embedding (g), and an
all-gather of the logits forward plus an all-reduce backward (f) for the head. (Megatron
also splits the cross-entropy so the logits are never gathered; not done here.)

With ``sequence_parallel=True`` (Korthikanti et al. 2022, §4.2.2) what stayed replicated
is split along the sequence instead: the LayerNorms run on s/t rows
(``SequenceParallelLayerNorm``), each column layer gathers its input along the sequence and
each row layer reduce-scatters its output (the all-reduces become all-gathers and
reduce-scatters of the same bytes), the embedding's output (tokens plus positions) is
scattered and the head gathers, so the model still takes (b, s) tokens and returns (b, s, V)
logits.

The model class is untouched: the result is still a ``TinyGPT`` (``parts()`` works), built
by slicing the weights of the dense model, so t = 1, 2 and 4 are the same model.

Laptop:  ``python -c "import lessonlib as L; print(L.launch(L.tensor_parallel.parallelize.demo_mlp, 2))"``
GPU box: the same call uses NCCL on 2 GPUs; under torchrun call ``parallelize_gpt`` on each
rank with the rank's tensor-parallel group.
"""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from lessonlib import bug_switches, comm, device
from lessonlib.models import MLP, Block, Head, init_weights_
from lessonlib.models.moe import MoELayer
from lessonlib.tensor_parallel.layers import (ColumnParallelLinear, TensorParallelMLP,
                                 TensorParallelSelfAttention, check_divisible, tp_size)
from lessonlib.tensor_parallel.ops import reduce_from_tp
from lessonlib.tensor_parallel.sequence import (SequenceGather, SequenceParallelLayerNorm,
                                                SequenceScatter)


def param_bytes(module: nn.Module) -> int:
    """Bytes of the parameters this rank holds (a DTensor counts its local shard)."""
    total = 0
    for p in module.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        total += local.numel() * local.element_size()
    return total


# ---------------------------------------------------------------- vocabulary-parallel embedding
class VocabParallelEmbedding(nn.Module):
    """Token embedding split by vocabulary rows: rank r holds rows r*V/t .. (r+1)*V/t - 1.

    Each rank looks up the tokens it owns and writes zeros for the others; g's all-reduce
    sums the t partial tables into the full embedding, (b, s) -> (b, s, h)."""

    def __init__(self, embedding: nn.Embedding, group=None, t: int | None = None):
        super().__init__()
        self.t, self.group = tp_size(group, t), group
        check_divisible("vocab", embedding.num_embeddings, self.t)
        rows = embedding.num_embeddings // self.t
        self.start = dist.get_rank(group) * rows
        self.weight = nn.Parameter(embedding.weight.detach()[self.start:self.start + rows].clone())

    def forward(self, idx):
        local = idx - self.start
        outside = (local < 0) | (local >= self.weight.shape[0])
        y = F.embedding(local.masked_fill(outside, 0), self.weight)   # (b, s, h)
        return reduce_from_tp(y.masked_fill(outside.unsqueeze(-1), 0.0), self.group)


# ---------------------------------------------------------------- whole models
def _copy_except(module: nn.Module, skip) -> nn.Module:
    """Deep copy of ``module`` in which the submodules in ``skip`` become None: no point
    copying the matrices that are about to be replaced by their slices."""
    return copy.deepcopy(module, memo={id(m): None for m in skip})


def parallelize_block(block: nn.Module, group=None, t: int | None = None,
                      sequence_parallel: bool = False, seq: int | None = None) -> nn.Module:
    """A copy of a ``Block`` whose attention and MLP are split over the group's t ranks;
    the LayerNorms are copied whole (replicated), or with ``sequence_parallel`` run on this
    rank's s/t rows: the block then takes and returns (b, s/t, h), and refuses anything
    whose length times t is more than ``seq``, a maximum as for the dense block (default:
    its model's s, ``block.seq``; under context parallelism the s/c tokens of the c-shard).
    ``recompute`` carries over from ``block`` and can be set on the copy."""
    seq = getattr(block, "seq", None) if seq is None else seq
    if sequence_parallel and seq is None:
        raise ValueError("sequence_parallel=True needs the sequence the t ranks split: pass "
                         "seq=s (a Block built from a GPTConfig knows its own)")
    tp = _copy_except(block, [block.attn, block.mlp])
    tp.attn = TensorParallelSelfAttention.from_attention(block.attn, group, t, sequence_parallel)
    tp.mlp = TensorParallelMLP.from_mlp(block.mlp, group, t, sequence_parallel=sequence_parallel)
    if bug_switches.active("tp_layer_left_unsharded"):                # the MLP left dense
        tp.mlp = copy.deepcopy(block.mlp)
    if sequence_parallel:
        tp.ln1, tp.ln2 = (SequenceParallelLayerNorm.from_layernorm(ln, group, seq)
                          for ln in (block.ln1, block.ln2))
    return tp


def parallelize_gpt(model: nn.Module, group=None, t: int | None = None,
                    vocab_parallel: bool = False, sequence_parallel: bool = False) -> nn.Module:
    """A tensor-parallel copy of a ``TinyGPT`` for this rank of ``group`` (default: world).

    ``t``, if given, must equal the group's size. Checks every divisibility (hidden, heads,
    4h, vocabulary, and the sequence s under ``sequence_parallel``) before building
    anything, and sends nothing while building."""
    t = tp_size(group, t)
    cfg = model.cfg
    check_divisible("hidden", cfg.hidden, t)
    check_divisible("heads", cfg.heads, t)
    if vocab_parallel:
        check_divisible("vocab", cfg.vocab, t)
    if sequence_parallel:
        check_divisible("s", cfg.seq, t)
    tp = _copy_except(model, list(model.blocks))
    tp.blocks = nn.ModuleList(parallelize_block(b, group, t, sequence_parallel)
                              for b in model.blocks)
    if vocab_parallel:
        tp.embed.tok = VocabParallelEmbedding(model.embed.tok, group, t)
        tp.head.out = ColumnParallelLinear.from_linear(model.head.out, group, True, t,
                                                       sequence_parallel)
    if sequence_parallel:
        tp.embed = sequence_parallel_ends(tp.embed, group)             # (b, s/t, h)
        tp.head = sequence_parallel_ends(tp.head, group, gather=not vocab_parallel)
    return tp


def sequence_parallel_ends(part: nn.Module, group=None, gather: bool = True) -> nn.Module:
    """SP's two ends: the embedding's output scattered to this rank's s/t rows; the head's
    LayerNorm on them and, with ``gather`` (a replicated head), the rows gathered before
    ``out`` (a vocabulary-parallel head gathers them itself)."""
    if isinstance(part, Head):
        part.ln = SequenceParallelLayerNorm.from_layernorm(part.ln, group)
        if gather:
            part.out = nn.Sequential(SequenceGather(group), part.out)
        return part
    return nn.Sequential(part, SequenceScatter(group))                 # the embedding


def apply_tp(part: nn.Module, ctx, sp: bool = False) -> nn.Module:
    """The hybrid builder's TP room, on one part of a pipeline stage (``part`` is already
    this stage's copy): a block's attention and MLP split over the grid's tp axis, with
    ``sp`` its LayerNorms on s/(c t) rows (c the context-parallel shards); an MoE block's
    attention only; with ``sp`` the ends' scatter and gather. Every block is split, even over
    t = 1, so its q, k and v are one qkv tensor at every t (as checkpoints hold them:
    ``long_run.shard_map``)."""
    tp, cp = ctx.axis("tp"), ctx.axis("cp")
    if not isinstance(part, Block):
        return sequence_parallel_ends(part, tp.group) if sp and tp.size > 1 else part
    if isinstance(part.mlp, MoELayer):
        if sp:
            raise ValueError("sequence parallelism is not combined with MoE blocks here")
        part.attn = TensorParallelSelfAttention.from_attention(part.attn, tp.group)
        return part
    return parallelize_block(part, tp.group, sequence_parallel=sp, seq=part.seq // cp.size)


def demo_mlp(b: int = 2, s: int = 8, h: int = 32) -> dict:
    """Split a dense MLP over every rank; compare with the dense output; count messages."""
    dense = init_weights_(MLP(h), seed=0, std=0.02).to(device.current_device())
    tp = TensorParallelMLP.from_mlp(dense)
    x = torch.randn(b, s, h, generator=torch.Generator().manual_seed(1)).to(dense.fc1.weight)
    with comm.ledger() as book:
        out = tp(x)                                                    # (b, s, h)
    return {"rank": dist.get_rank(), "t": tp.fc1.t,
            "max_abs_error": (out - dense(x)).abs().max().item(),
            "forward_all_reduces": book.count("all_reduce"),
            "param_bytes": param_bytes(tp), "dense_param_bytes": param_bytes(dense)}
