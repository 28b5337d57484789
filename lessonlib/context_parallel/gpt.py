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
from lessonlib.grid import ParallelContext
from lessonlib.models import TinyGPT, lm_loss


@dataclass(frozen=True)
class ContextParallelGrid:
    """This rank's place on the (d, c) grid, a view of ``ParallelContext``'s dp and cp axes:
    its context-parallel group and coordinates."""
    c: int
    d: int
    cp_rank: int
    dp_rank: int
    group: object

    @classmethod
    def build(cls, c: int) -> "ContextParallelGrid":
        """The grid's cp axis: groups of c consecutive ranks, made by ``ParallelContext``
        (its cp groups alone); every rank must call it (new_group is collective)."""
        world = dist.get_world_size()
        c = positive_int("c", c, most=world, what="the ranks of a context-parallel group")
        if world % c:
            raise ValueError(f"c={c} must divide the world size {world} (d = world / c groups)")
        ctx = ParallelContext.build(dp=world // c, pp=1, tp=1, cp=c, only=("cp",))
        return cls(c, ctx.dp, ctx.cp_rank, ctx.dp_rank, ctx.cp_group)

    def destroy(self) -> None:
        dist.destroy_process_group(self.group)


class ContextParallelGPT(nn.Module):
    """A ``TinyGPT``'s weights (copied) run on this rank's (b, s/c) tokens."""

    def __init__(self, model: TinyGPT, group=None, layout: str = "zigzag", method: str = "ring"):
        super().__init__()
        self.gpt, self.group, self.layout = copy.deepcopy(model), group, layout
        self.method = check_method(method)

    def attention(self, attn, x):
        b, n, _ = x.shape                                                # (b, s/c, h)
        q, k, v = attn.heads(x)                                          # (b, a, s/c, h/a)
        y = context_attention(self.method, q, k, v, self.group, causal=True, layout=self.layout)
        return attn.proj(y.transpose(1, 2).reshape(b, n, -1))          # (b, s/c, h)

    def forward(self, idx):
        gpt, c = self.gpt, dist.get_world_size(self.group)
        positions = positions_on(dist.get_rank(self.group), c, idx.shape[1] * c, self.layout,
                                 idx.device)
        x = gpt.embed.tok(idx) + gpt.embed.pos(positions)                # (b, s/c, h)
        for block in gpt.blocks:
            x = x + self.attention(block.attn, block.ln1(x))
            x = x + block.mlp(block.ln2(x))
        return gpt.head(x)                                               # (b, s/c, V)


def forward_backward(model: ContextParallelGPT, idx, targets) -> float:
    """Forward and backward on this rank's (b, s/c) tokens, gradients averaged over the
    world; returns the loss over all tokens of all ranks (the mean of equal-sized means)."""
    loss = lm_loss(model(idx), targets)
    loss.backward()
    allreduce_flat_gradients(gradients(model))    # the mean over the c x d replicas
    total = loss.detach().clone()
    comm.all_reduce(total)
    return total.item() / dist.get_world_size()
