"""Beyond three axes: the tiny GPT (or its MoE variant) on TP, CP, PP, DP/ZeRO/FSDP and EP at once.

What it teaches: the layouts trained since 2021 add axes to lesson 05's three, and each new
axis is one room's idea applied in one place. The builder applies them in one documented
order, as torchtitan's ``parallelize_llama`` does (TP, then CP, then PP, then FSDP/DP):

1. **tensor** (tp group): every block's attention and MLP split over t ranks
   (``tensor_parallel.parallelize_block``; with ``sp``, sequence parallelism: the LayerNorms
   on s/(c t) rows, the embedding's output scattered and the head's input gathered, as
   ``parallelize_gpt`` does); in an MoE block the attention is split and the
   MoE layer becomes **expert-parallel** over the ep group (``expert_parallel``), its E/e
   experts replicated over the t ranks, which hold the same activations;
2. **context** (cp group): every sequence cut into c shards (zig-zag); attention becomes
   ``ring_attention`` over the cp group and the embedding reads each token's place in the
   whole sequence (``context_parallel.layout.positions_of``); nothing else sees the cut;
3. **pipeline** (pp group): the model cut into p stages of whole layers
   (``hybrid.stage_counts``), run with 1F1B on (b, s/c, h) activations;
4. **data** (the dp_cp group: the d*c ranks holding the same weights): the gradients of the
   dense weights averaged over them, one flat all-reduce; or ``shard_on="zero1"`` (a
   reduce-scatter, each rank stepping its 1/(d c), an all-gather: ``ShardedOptimizer``); or
   ``"fsdp"`` (the stage wrapped in ``FullyShardedDataParallel``: weights held as 1/(d c)
   row shards, each unit gathered for its forward and backward, its gradients
   reduce-scattered). An expert's gradients are summed over the d/e ranks holding a copy
   (the edp group) and divided by d (``expert_parallel.groups``).

The ranks are laid out in Megatron-Core's order (``grid.MEGATRON_ORDER``: tp innermost,
then cp, then dp, pp outermost). Every rank builds its shard from the same full model, so
the run equals one process training the model on the whole batch, in float64: ``train``
compares each rank's shard of the first step's gradients and of the final weights
(``parity`` the losses). The MoE runs use a capacity factor E/k (no token is
ever dropped, so routing does not depend on how the batch is cut) and no auxiliary loss.

Here: the checks, the model, the rooms in order (``build_stage``) and the gradient sync;
the trainer and the proof are in ``runs``.

Laptop:  ``python -c "from lessonlib import hybrid_axes as H; print(H.parity(H.run(2, 2, 2)))"``
GPU box: ``torchrun --nproc-per-node 8 labs/hybrid.py --cp 2 --layouts t2p2d1`` (NCCL).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from lessonlib import comm
from lessonlib.context_parallel.layout import check_divisible, positions_on
from lessonlib.context_parallel.ring import ring_attention
from lessonlib.expert_parallel.groups import expert_parameters
from lessonlib.expert_parallel.layer import check_split, expert_parallel
from lessonlib.grid import MEGATRON_ORDER, ParallelContext, check_grid
from lessonlib.hybrid import check_layout, stage_counts
from lessonlib.models import Block, Embed, GPTConfig, Head, TinyGPT, moe_gpt
from lessonlib.moe import MoELayer
from lessonlib.layer_split import split_layers
from lessonlib.tensor_parallel.layers import TensorParallelSelfAttention
from lessonlib.tensor_parallel.parallelize import parallelize_block
from lessonlib.tensor_parallel.sequence import (SequenceGather, SequenceParallelLayerNorm,
                                                SequenceScatter)

SHARDS = ("none", "zero1", "fsdp")
N_EXPERTS, TOP_K = 4, 2
LAYOUT = "zigzag"


# ---------------------------------------------------------------- checks (pure, before any process)
def check_axes(cfg: GPTConfig, tp: int = 1, cp: int = 1, pp: int = 1, dp: int = 1, ep: int = 1,
               shard_on: str = "none", global_batch: int = 8, m: int = 2,
               world_size: int | None = None, sp: bool = False) -> int:
    """One line naming the setting that cannot train ``cfg``; returns the micro-batch size."""
    b = check_layout(cfg, dp, pp, tp, global_batch, m)
    check_grid(world_size or dp * pp * cp * tp, dp, pp, tp, None, cp, ep, MEGATRON_ORDER)
    if cp > 1:
        check_divisible(cfg.seq, cp, LAYOUT)
    if sp and (cfg.seq // cp) % tp:
        raise ValueError(f"sequence parallelism needs s/c = {cfg.seq}/{cp} tokens divisible "
                         f"by tp={tp} (each TP rank's LayerNorms take s/(c t) of them)")
    if shard_on not in SHARDS:
        raise ValueError(f"shard={shard_on!r} is not a sharding of the dp axis; use one of {SHARDS}")
    if ep > 1:
        check_split(N_EXPERTS, ep, TOP_K)
        if cp > 1 or shard_on != "none":
            raise ValueError(f"ep={ep} with cp={cp}, shard={shard_on!r}: expert parallelism "
                             f"is combined here with tp, pp and plain dp only; use cp=1, "
                             f"shard='none'")
    return b


def make_model(cfg: GPTConfig, moe: bool, seed: int = 0) -> TinyGPT:
    """The full model, float64: the dense tiny GPT, or its MoE variant with capacity E/k."""
    model = (moe_gpt(cfg, N_EXPERTS, TOP_K, capacity_factor=N_EXPERTS / TOP_K, seed=seed)
             if moe else TinyGPT(cfg, seed))
    return model.double()


# ---------------------------------------------------------------- the rooms, in order
def tensor_parallel_block(block: Block, ctx: ParallelContext, sp: bool = False) -> nn.Module:
    """Step 1: TP (with ``sp``, sequence parallelism) inside the block; an MoE layer becomes
    expert-parallel instead."""
    if not isinstance(block.mlp, MoELayer):
        return parallelize_block(block, ctx.tp_group, sequence_parallel=sp,
                                 seq=block.seq // ctx.cp) if ctx.tp > 1 \
            else block
    if sp:
        raise ValueError("sequence parallelism is not combined with MoE blocks here")
    twin = block                                   # already this stage's copy
    if ctx.tp > 1:
        twin.attn = TensorParallelSelfAttention.from_attention(block.attn, ctx.tp_group)
    if ctx.ep > 1:
        twin.mlp = expert_parallel(block.mlp, ctx.ep_group)
    return twin


class RingSelfAttention(nn.Module):
    """Step 2 on attention: the same projections (dense or TP), ring attention over cp."""

    def __init__(self, attn: nn.Module, group):
        super().__init__()
        self.attn, self.group = attn, group

    def forward(self, x):                                              # (b, s/c, h)
        attn, b = self.attn, x.shape[0]
        if hasattr(attn, "qkv"):                                       # tensor-parallel
            q, k, v = (attn.split_heads(z) for z in attn.qkv(x).chunk(3, dim=-1))
        else:
            q, k, v = (attn.split_heads(f(x)) for f in (attn.q, attn.k, attn.v))
        y = ring_attention(q, k, v, self.group, causal=True, layout=LAYOUT)
        n = y.shape[2]                         # s/c tokens (SP's qkv gathered its s/(c t))
        return attn.proj(y.transpose(1, 2).reshape(b, n, -1))         # (b, s/c, h) or SP's


class ShardPositionEmbed(nn.Module):
    """Step 2 on the embedding: tokens plus the positions of this rank's shard."""

    def __init__(self, embed: nn.Module, group):
        super().__init__()
        self.embed, self.group = embed, group

    def forward(self, idx):                                            # (b, s/c)
        c = dist.get_world_size(self.group)
        positions = positions_on(dist.get_rank(self.group), c, idx.shape[1] * c, LAYOUT,
                                 idx.device)
        return self.embed.tok(idx) + self.embed.pos(positions)


def sequence_parallel_ends(part: nn.Module, ctx: ParallelContext) -> nn.Module:
    """SP's two ends, as ``parallelize_gpt`` places them: the embedding's output scattered
    to this rank's s/t rows; the head's LayerNorm on them, the rows gathered before ``out``."""
    if isinstance(part, Head):
        part.ln = SequenceParallelLayerNorm.from_layernorm(part.ln, ctx.tp_group)
        part.out = nn.Sequential(SequenceGather(ctx.tp_group), part.out)
        return part
    return nn.Sequential(part, SequenceScatter(ctx.tp_group))          # the embedding


def build_stage(model: TinyGPT, ctx: ParallelContext, sp: bool = False) -> nn.Sequential:
    """This rank's shard: TP/EP (and SP) in every block, then CP, on the layers of its stage.
    Copies; sends nothing (so the same call cuts a dense model of gradients for the check).
    The stage's layers are copied out first, because a layer holding a process group cannot
    be deep-copied; applying the rooms to those copies gives the same modules."""
    cut = split_layers(model, ctx.pp, stage_counts(model.cfg.layers, ctx.pp))[ctx.pp_rank]
    parts = []
    for part in cut:
        if isinstance(part, Block):
            part = tensor_parallel_block(part, ctx, sp)
            if ctx.cp > 1:
                part.attn = RingSelfAttention(part.attn, ctx.cp_group)
        else:
            if isinstance(part, Embed) and ctx.cp > 1:
                part = ShardPositionEmbed(part, ctx.cp_group)
            if sp and ctx.tp > 1:
                part = sequence_parallel_ends(part, ctx)
        parts.append(part)
    return nn.Sequential(*parts)


def average_over(params, group, divisor: float) -> None:
    """Sum the gradients over ``group`` (one flat all-reduce) and divide by ``divisor``."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    if dist.get_world_size(group) > 1:
        comm.all_reduce(flat, group=group)
    flat /= divisor
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def sync_gradients(stage: nn.Module, ctx: ParallelContext) -> None:
    """Step 4: dense weights averaged over the d*c ranks that hold them; an expert's summed
    over the d/e ranks holding a copy and divided by d."""
    experts = {id(p) for p in expert_parameters(stage)}
    dense = [p for p in stage.parameters() if id(p) not in experts]
    average_over(dense, ctx.dp_cp_group, ctx.dp * ctx.cp)
    if experts:
        average_over([p for p in stage.parameters() if id(p) in experts], ctx.edp_group, ctx.dp)
