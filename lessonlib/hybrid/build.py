"""One builder for every layout: the tiny GPT (or its MoE variant) on PP, TP, EP, CP, DP/ZeRO/FSDP.

What it teaches: the strategies compose, each on its own axis of the grid (Megatron-LM 2021,
Narayanan et al., §2-3), each one room's idea applied in one place. ``build_stage`` only
orders the rooms, in torchtitan's shape (``parallelize_llama``: one ``apply_*`` per room,
each living in its strategy's package, each on the stage the pipeline cut gives):

1. **pipeline** (pp axis), first: the model cut into p stages of whole layers
   (``stage_counts``: the embedding on the first, the head on the last), run with 1F1B;
2. **tensor** (tp axis, ``tensor_parallel.apply_tp``): every block's attention and MLP
   split over t ranks; with ``sp`` sequence parallelism, the ends' scatter and gather;
3. **expert** (ep axis, ``expert_parallel.apply_ep``): an MoE layer's E experts E/e a rank,
   replicated over the t ranks, which hold the same activations;
4. **context** (cp axis, ``context_parallel.apply_cp``): attention becomes ring attention over
   the c shards of each sequence, the embedding reads each token's place in the whole one;
5. **data** (the dp_cp axis: the d*c ranks holding the same weights,
   ``data_parallel.apply_dp``): plain or ZeRO-1 leave the stage whole, FSDP wraps it.

Lesson 05's (dp, pp, tp) grid is the case c = e = 1. Every rank builds its shard from the
same full model (cut, then split), so the run equals one process training the model on the
whole batch (``runs``).

Laptop:  ``python -c "from lessonlib import hybrid as H; print(H.compare_parity(H.run(tp=2, cp=2,
         pp=2, dtype='float64')))"``
GPU box: ``torchrun --nproc-per-node 8 labs/hybrid.py --cp 2 --layouts t2p2d1`` (NCCL).
"""
from __future__ import annotations

import torch
from torch import nn

from lessonlib.context_parallel.gpt import apply_cp
from lessonlib.data_parallel.parallelize import apply_dp
from lessonlib.expert_parallel.layer import apply_ep
from lessonlib.grid import ParallelContext
from lessonlib.hybrid.checks import LAYOUT, N_EXPERTS, TOP_K
from lessonlib.layer_split import split_layers
from lessonlib.models import Block, TinyGPT, moe_gpt
from lessonlib.tensor_parallel.parallelize import apply_tp


def make_model(cfg, moe: bool = False, seed: int = 0, dtype: str = "float32") -> TinyGPT:
    """The full model in ``dtype``: the dense tiny GPT, or its MoE variant with capacity E/k
    (no token dropped)."""
    model = (moe_gpt(cfg, N_EXPERTS, TOP_K, capacity_factor=N_EXPERTS / TOP_K, seed=seed)
             if moe else TinyGPT(cfg, seed))
    return model.to(getattr(torch, dtype))


def stage_counts(layers: int, pp: int) -> list[int]:
    """Parts per stage for ``TinyGPT.parts()`` = [embed, L blocks, head]: the L blocks as even
    as possible (earlier stages take the extra one), the embedding on the first stage and the
    head on the last."""
    blocks = [layers // pp + (1 if s < layers % pp else 0) for s in range(pp)]
    blocks[0] += 1
    blocks[-1] += 1
    return blocks


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
            part = apply_cp(apply_ep(apply_tp(part, ctx, sp), ctx), ctx, LAYOUT)
        else:          # the ends: the c-shard's positions, then SP's scatter (or gather)
            part = apply_tp(apply_cp(part, ctx, LAYOUT), ctx, sp)
        parts.append(part)
    stage = nn.Sequential(*parts)
    return apply_dp(stage if device is None else stage.to(device), ctx, shard_on)
