"""One builder for every layout: the tiny GPT (or its MoE variant) on TP, CP, PP, DP/ZeRO/FSDP and EP.

What it teaches: the three strategies of lesson 05 compose, each on its own axis of the
grid (Megatron-LM 2021, Narayanan et al., §2-3), and the layouts trained since add axes, each
one room's idea applied in one place. ``build_stage`` applies them in torchtitan's shape
(``parallelize_llama``: one ``apply_*`` per room, each on the stage the pipeline cut gives):

1. **pipeline** (pp group), first: the model cut into p stages of whole layers
   (``stage_counts``: the embedding on the first, the head on the last), run with 1F1B;
2. **tensor** (tp group, ``apply_tp``): every block's attention and MLP split over t ranks
   (``tensor_parallel.parallelize_block``); with ``sp``, sequence parallelism: the
   LayerNorms on s/(c t) rows, the embedding's output scattered and the head's input
   gathered, as ``parallelize_gpt`` does; in an MoE block the attention only;
3. **expert** (ep group, ``apply_ep``): an MoE layer's E experts spread E/e a rank
   (``expert_parallel``), replicated over the t ranks, which hold the same activations;
4. **context** (cp group, ``apply_cp``): every sequence cut into c shards (zig-zag);
   attention becomes ``ring_attention`` over the cp group and the embedding reads each
   token's place in the whole sequence (``context_parallel.layout.positions_of``);
5. **data** (the dp_cp group: the d*c ranks holding the same weights, ``apply_dp``): plain,
   the gradients averaged after backward by ``expert_parallel.sync_gradients`` (an expert's
   over the d/e ranks holding a copy, divided by d); ZeRO-1, an optimizer that
   reduce-scatters them and steps 1/(d c) of the weights (``build_optimizer``); or FSDP,
   the stage wrapped in ``FullyShardedDataParallel`` (weights held as 1/(d c) row shards,
   each unit gathered for its forward and backward, its gradients reduce-scattered).

At c = e = 1 on lesson 05's grid (``grid_layout.LESSON_ORDER``) this is lesson 05's builder; the
five-axis runs lay the ranks out in Megatron-Core's order (``grid_layout.MEGATRON_ORDER``). Every
rank builds its shard from the same full model (cut, then split), so the run equals one
process training the model on the whole batch (``runs``).

Laptop:  ``python -c "from lessonlib import hybrid_axes as H; print(H.parity(H.run(tp=2,
         cp=2, pp=2)))"``
GPU box: ``torchrun --nproc-per-node 8 labs/hybrid.py --cp 2 --layouts t2p2d1`` (NCCL).
"""
from __future__ import annotations

import torch.distributed as dist
from torch import nn

from lessonlib.argcheck import positive_int
from lessonlib.context_parallel.layout import check_split_divides, positions_on
from lessonlib.context_parallel.ring import ring_attention
from lessonlib.data_parallel.fsdp import FullyShardedDataParallel
from lessonlib.data_parallel.zero import ShardedOptimizer
from lessonlib.expert_parallel.layer import check_split, expert_parallel
from lessonlib.grid import ParallelContext
from lessonlib.grid_layout import LESSON_ORDER, MEGATRON_ORDER, check_grid
from lessonlib.layer_split import split_layers
from lessonlib.models import Block, Embed, GPTConfig, Head, TinyGPT, moe_gpt
from lessonlib.models.moe import MoELayer
from lessonlib.tensor_parallel.layers import TensorParallelSelfAttention
from lessonlib.tensor_parallel.parallelize import parallelize_block
from lessonlib.tensor_parallel.sequence import (SequenceGather, SequenceParallelLayerNorm,
                                                SequenceScatter)

SHARDS = ("none", "zero1", "fsdp")
N_EXPERTS, TOP_K = 4, 2
LAYOUT = "zigzag"


# ---------------------------------------------------------------- checks (pure, before any process)
def check_3d_layout(cfg: GPTConfig, dp: int, pp: int, tp: int, global_batch: int, m: int) -> int:
    """Raise ValueError naming the setting if (dp, pp, tp, B, m) cannot train ``cfg``;
    return the micro-batch size b = B / (d m)."""
    for name, value in (("dp", dp), ("pp", pp), ("tp", tp), ("global_batch", global_batch),
                        ("m", m)):
        positive_int(name, value)
    if pp > cfg.layers:
        raise ValueError(f"pp={pp} stages but the model has layers={cfg.layers}: every stage "
                         f"needs at least one transformer layer; use pp <= {cfg.layers} or a "
                         f"deeper model")
    for setting, value in (("heads", cfg.heads), ("hidden", cfg.hidden)):
        if value % tp:
            ok = [k for k in range(1, cfg.heads + 1) if cfg.heads % k == 0 and cfg.hidden % k == 0]
            raise ValueError(f"tp={tp} must divide {setting}={value} (each TP rank takes an "
                             f"equal share); use tp in {ok}")
    if global_batch % (dp * m):
        ok = dp * m * max(1, round(global_batch / (dp * m)))
        raise ValueError(f"global_batch={global_batch} is not divisible by dp*m = {dp}*{m} = "
                         f"{dp * m}: each of the d replicas needs m equal micro-batches; use "
                         f"global_batch={ok}, or change m")
    return global_batch // (dp * m)


def check_axes(cfg: GPTConfig, tp: int = 1, cp: int = 1, pp: int = 1, dp: int = 1, ep: int = 1,
               shard_on: str = "none", global_batch: int = 8, m: int = 2,
               world_size: int | None = None, sp: bool = False) -> int:
    """One line naming the setting that cannot train ``cfg``; returns the micro-batch size."""
    b = check_3d_layout(cfg, dp, pp, tp, global_batch, m)
    check_grid(world_size or dp * pp * cp * tp, dp, pp, tp, None, cp, ep, MEGATRON_ORDER)
    if cp > 1:
        check_split_divides(cfg.seq, cp, LAYOUT)
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


def stage_counts(layers: int, pp: int) -> list[int]:
    """Parts per stage for ``TinyGPT.parts()`` = [embed, L blocks, head]: the L blocks as even
    as possible (earlier stages take the extra one), the embedding on the first stage and the
    head on the last."""
    blocks = [layers // pp + (1 if s < layers % pp else 0) for s in range(pp)]
    blocks[0] += 1
    blocks[-1] += 1
    return blocks


# ---------------------------------------------------------------- the rooms, in order
def build_stage(model: TinyGPT, ctx: ParallelContext, sp: bool = False, shard_on: str = "none",
                device=None) -> nn.Module:
    """This rank's shard of ``model``: the pipeline's cut first, then on each of its parts
    TP (and SP), EP, CP, moved to ``device``; then DP's wrapping of the whole stage. Copies;
    with ``shard_on="none"`` sends nothing (so the same call cuts a dense model of gradients
    for the check). The stage's layers are copied out first, because a layer holding a
    process group cannot be deep-copied; the rooms are applied to those copies."""
    pp = ctx.axis("pp")
    cut = split_layers(model, pp.size, stage_counts(model.cfg.layers, pp.size))[pp.rank]
    parts = []
    for part in cut:
        if isinstance(part, Block):
            part = apply_cp(apply_ep(apply_tp(part, ctx, sp), ctx), ctx)
        else:          # the ends: the c-shard's positions, then SP's scatter (or gather)
            part = apply_tp(apply_cp(part, ctx), ctx, sp)
        parts.append(part)
    stage = nn.Sequential(*parts)
    return apply_dp(stage if device is None else stage.to(device), ctx, shard_on)


def apply_tp(part: nn.Module, ctx: ParallelContext, sp: bool = False) -> nn.Module:
    """A block's attention and MLP split over the tp group (with ``sp`` its LayerNorms on
    s/(c t) rows); an MoE block's attention only; with ``sp`` the ends' scatter and gather.
    Lesson 05's grid splits every block, even over t = 1 (its checkpoints hold q, k and v
    fused: ``shard_map.Layout.fused``); Megatron-Core's order keeps a block whole at t = 1."""
    if not isinstance(part, Block):
        return sequence_parallel_ends(part, ctx) if sp and ctx.tp > 1 else part
    if isinstance(part.mlp, MoELayer):
        if sp:
            raise ValueError("sequence parallelism is not combined with MoE blocks here")
        if ctx.tp > 1:                                 # ``part`` is already this stage's copy
            part.attn = TensorParallelSelfAttention.from_attention(part.attn, ctx.tp_group)
        return part
    if ctx.tp == 1 and ctx.order != LESSON_ORDER:
        return part
    return parallelize_block(part, ctx.tp_group, sequence_parallel=sp, seq=part.seq // ctx.cp)


def apply_ep(block: Block, ctx: ParallelContext) -> Block:
    """An MoE layer's experts spread over the ep group, E/e a rank."""
    if ctx.ep > 1 and isinstance(block.mlp, MoELayer):
        block.mlp = expert_parallel(block.mlp, ctx.ep_group)
    return block


def apply_cp(part: nn.Module, ctx: ParallelContext) -> nn.Module:
    """A block's attention made ring attention over the cp group; the embedding given the
    positions of this rank's shard of each sequence."""
    if ctx.cp == 1:
        return part
    if isinstance(part, Block):
        part.attn = RingSelfAttention(part.attn, ctx.cp_group)
    return ShardPositionEmbed(part, ctx.cp_group) if isinstance(part, Embed) else part


def apply_dp(stage: nn.Module, ctx: ParallelContext, shard_on: str = "none") -> nn.Module:
    """FSDP (``shard_on="fsdp"``) wraps the stage over the dp_cp group; plain DP and ZeRO-1
    leave it whole (``expert_parallel.sync_gradients`` after backward, ``build_optimizer``)."""
    if shard_on != "fsdp":
        return stage
    # with TP or CP collectives inside the stage's compute, FSDP's own wait at once:
    # one communicator busy at a time (lessonlib.instruments.nccl_inflight)
    return FullyShardedDataParallel(stage, group=ctx.dp_cp_group,
                                    overlap=ctx.tp == 1 and ctx.cp == 1)


def build_optimizer(params, ctx: ParallelContext, kind, lr: float, shard_on: str = "none"):
    """``kind`` (an optimizer class) over ``params``, or under ZeRO-1 a ``ShardedOptimizer``
    on the dp_cp group: one reduce-scatter of the gradients, each rank stepping 1/(d c)."""
    if shard_on == "zero1":
        return ShardedOptimizer(params, kind, group=ctx.dp_cp_group, lr=lr)
    return kind(params, lr=lr)


class RingSelfAttention(nn.Module):
    """Step 2 on attention: the same projections (dense or TP), ring attention over cp."""

    def __init__(self, attn: nn.Module, group):
        super().__init__()
        self.attn, self.group = attn, group

    def forward(self, x):                                              # (b, s/c, h)
        attn, b = self.attn, x.shape[0]
        q, k, v = attn.heads(x)                        # (b, a or a/t, s/c, h/a) each
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
