"""The data-parallel room of a hybrid layout: how a pipeline stage's replicas share their work.

What it teaches: on the grid, data parallelism is a choice on the d*c ranks that hold the same
weights (the dp_cp axis: the data-parallel replicas and the context-parallel shards of each
sequence), not a new model. Plain DP leaves the stage whole and averages its gradients after
backward (``ladder.sync_gradients``); ZeRO-1 leaves it whole too and gives it an optimizer
that reduce-scatters the gradients and steps 1/(d c) of the weights (``zero``); FSDP wraps
it, each unit's weights held as 1/(d c) row shards, gathered for its forward and backward,
its gradients reduce-scattered (``fsdp``). ``apply_dp`` and ``build_optimizer`` are those two
choices, as the hybrid builder (``lessonlib.hybrid.build``) applies them last.

Laptop:  ``python -c "from lessonlib import hybrid as H; print(H.compare_parity(H.run(tp=2, pp=2,
         dp=2, shard_on='fsdp', dtype='float64')))"``  (8 CPU ranks)
GPU box: ``torchrun --nproc-per-node 8 labs/hybrid.py --shard fsdp --layouts t2p2d2`` (NCCL).
"""
from __future__ import annotations

from torch import nn

from lessonlib.data_parallel.fsdp import FullyShardedDataParallel
from lessonlib.data_parallel.zero import ShardedOptimizer

SHARDS = ("none", "zero1", "fsdp")


def apply_dp(stage: nn.Module, ctx, shard_on: str = "none") -> nn.Module:
    """FSDP (``shard_on="fsdp"``) wraps the stage over the grid's dp_cp axis; plain DP and
    ZeRO-1 leave it whole (``ladder.sync_gradients`` after backward, ``build_optimizer``)."""
    if shard_on != "fsdp":
        return stage
    # with TP or CP collectives inside the stage's compute, FSDP's own wait at once:
    # one communicator busy at a time (lessonlib.instruments.nccl_inflight)
    alone = ctx.axis("tp").size == 1 and ctx.axis("cp").size == 1
    return FullyShardedDataParallel(stage, group=ctx.axis("dp_cp").group, overlap=alone)


def build_optimizer(params, ctx, kind, lr: float, shard_on: str = "none"):
    """``kind`` (an optimizer class) over ``params``, or under ZeRO-1 a ``ShardedOptimizer``
    on the grid's dp_cp axis: one reduce-scatter of the gradients, each rank stepping 1/(d c)."""
    if shard_on == "zero1":
        return ShardedOptimizer(params, kind, group=ctx.axis("dp_cp").group, lr=lr)
    return kind(params, lr=lr)
