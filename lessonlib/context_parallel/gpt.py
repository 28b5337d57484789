"""The tiny GPT on c ranks: each rank holds s/c tokens of every sequence.

What it teaches: only attention mixes tokens, so only attention needs the other ranks. The
embeddings, LayerNorms, MLPs and the head work on this rank's tokens alone (the position
embedding reads each token's place in the whole sequence, ``positions_of``); attention is
``ring_attention`` over the context-parallel group. The loss is the mean over all tokens of
all ranks: every rank holds the same number, so it is the mean of the ranks' local means,
and the gradient of the whole batch is the average of the ranks' gradients. ``method``
picks the attention: "ring" (default), "allgather" or "ulysses" (``methods``); the rest of
the model does not change.

Context parallelism combines with data parallelism on a (d, c) grid, c innermost as TP is in
``lessonlib.grid``: ranks r = j*c + i, groups of c consecutive ranks share one sequence
batch, the d groups take different sequences. Every rank holds a replica of the weights, so
one all-reduce over all c x d ranks averages the gradients (the data-parallel ladder's
flat rung, ``allreduce_flat_gradients``), as in DDP.

The hybrid layouts (``lessonlib.hybrid``) use the same two pieces, as modules put in place
by ``apply_cp``: ``context_parallel_attention`` and ``shard_embedding``.

The model is built around the plain ``TinyGPT``'s own parts (``lessonlib.models`` knows
nothing about ranks); its parameters keep their names, so the comparison with one process
is name by name.

Laptop:  ``python -c "from lessonlib.context_parallel import ring_runs; \\
          print(ring_runs.run_gpt_parity(4, 2))"``
GPU box: the same; one GPU per rank.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch.distributed as dist
from torch import nn

from lessonlib import comm
from lessonlib.argcheck import positive_int
from lessonlib.context_parallel.layout import positions_on
from lessonlib.context_parallel.methods import check_method, context_attention
from lessonlib.data_parallel.ladder import allreduce_flat_gradients, gradients
from lessonlib.grid import Axis, ParallelContext, destroy_groups
from lessonlib.models import Block, Embed, TinyGPT, lm_loss


@dataclass(frozen=True)
class ContextParallelGrid:
    """A view of ``ParallelContext``'s dp and cp axes on the (d, c) grid, under the grid's
    names: ``cp`` (this rank's context-parallel group, c consecutive ranks) and ``dp`` (the
    d groups taking different sequences), each an ``Axis`` (size, rank, group, ranks)."""
    cp: Axis
    dp: Axis

    @classmethod
    def build(cls, c: int) -> "ContextParallelGrid":
        """The grid's cp axis: groups of c consecutive ranks, made by ``ParallelContext``
        (its cp groups alone); every rank must call it (new_group is collective)."""
        world = dist.get_world_size()
        c = positive_int("c", c, most=world, what="the ranks of a context-parallel group")
        if world % c:
            raise ValueError(f"c={c} must divide the world size {world} (d = world / c groups)")
        ctx = ParallelContext.build(dp=world // c, pp=1, tp=1, cp=c, only=("cp",))
        return cls(ctx.axis("cp"), ctx.axis("dp"))

    def destroy(self) -> None:
        destroy_groups([self.cp.group])


def shard_embedding(embed: nn.Module, idx, group, layout: str = "zigzag"):
    """The embedding of this rank's (b, s/c) tokens: each token's own embedding plus the
    position it has in the whole sequence (``positions_on``)."""
    c = dist.get_world_size(group)
    positions = positions_on(dist.get_rank(group), c, idx.shape[1] * c, layout, idx.device)
    return embed.tok(idx) + embed.pos(positions)                       # (b, s/c, h)


def context_parallel_attention(attn: nn.Module, x, group, layout: str = "zigzag",
                               method: str = "ring"):
    """``attn``'s projections (dense or tensor-parallel) around ``method``'s attention over
    the cp group: (b, s/c, h) in and out (under SP the qkv gathered the s/(c t) rows)."""
    b = x.shape[0]
    q, k, v = attn.heads(x)                                            # (b, a or a/t, s/c, h/a)
    y = context_attention(method, q, k, v, group, causal=True, layout=layout)
    return attn.proj(y.transpose(1, 2).reshape(b, y.shape[2], -1))     # (b, s/c, h)


class ContextParallelGPT(nn.Module):
    """A ``TinyGPT``'s weights (copied) run on this rank's (b, s/c) tokens."""

    def __init__(self, model: TinyGPT, group=None, layout: str = "zigzag", method: str = "ring"):
        super().__init__()
        self.gpt, self.group, self.layout = copy.deepcopy(model), group, layout
        self.method = check_method(method)

    def forward(self, idx):
        gpt, group, layout = self.gpt, self.group, self.layout
        x = shard_embedding(gpt.embed, idx, group, layout)                # (b, s/c, h)
        for block in gpt.blocks:
            x = x + context_parallel_attention(block.attn, block.ln1(x), group, layout,
                                               self.method)
            x = x + block.mlp(block.ln2(x))
        return gpt.head(x)                                               # (b, s/c, V)


class ContextParallelAttention(nn.Module):
    """A block's attention as a module: ``context_parallel_attention`` over the cp group
    (the hybrid layouts' ring attention; ``apply_cp`` puts it in place)."""

    def __init__(self, attn: nn.Module, group, layout: str = "zigzag"):
        super().__init__()
        self.attn, self.group, self.layout = attn, group, layout

    def forward(self, x):                                              # (b, s/c, h)
        return context_parallel_attention(self.attn, x, self.group, self.layout)


class ShardPositionEmbed(nn.Module):
    """The embedding as a module: ``shard_embedding`` of this rank's shard."""

    def __init__(self, embed: nn.Module, group, layout: str = "zigzag"):
        super().__init__()
        self.embed, self.group, self.layout = embed, group, layout

    def forward(self, idx):                                            # (b, s/c)
        return shard_embedding(self.embed, idx, self.group, self.layout)


def apply_cp(part: nn.Module, ctx, layout: str = "zigzag") -> nn.Module:
    """The hybrid builder's CP room, on one part of a pipeline stage: a block's attention
    made ring attention over the grid's cp axis (``ctx.axis("cp")``); the embedding given
    the positions of this rank's shard of each sequence; at c = 1 nothing changes."""
    cp = ctx.axis("cp")
    if cp.size == 1:
        return part
    if isinstance(part, Block):
        part.attn = ContextParallelAttention(part.attn, cp.group, layout)
    return ShardPositionEmbed(part, cp.group, layout) if isinstance(part, Embed) else part


def forward_backward(model: ContextParallelGPT, idx, targets) -> float:
    """Forward and backward on this rank's (b, s/c) tokens, gradients averaged over the
    world; returns the loss over all tokens of all ranks (the mean of equal-sized means)."""
    loss = lm_loss(model(idx), targets)
    loss.backward()
    allreduce_flat_gradients(gradients(model))    # the mean over the c x d replicas
    total = loss.detach().clone()
    comm.all_reduce(total)
    return total.item() / dist.get_world_size()
