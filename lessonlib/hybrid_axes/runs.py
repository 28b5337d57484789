"""The five-axis run on the ranks and its proof: ``AxesTrainer`` (one rank's shard, its 1F1B
pipeline, SGD plain, ZeRO-1 or FSDP on the dp_cp group), ``train`` (rank side: 3 steps, then
this rank's share of one process's first gradients and final weights against its own, and
the recorded messages for ``comm.nccl_hazards``), ``run`` (caller side) and ``parity``.

Laptop:  ``python -c "from lessonlib import hybrid_axes as H; print(H.parity(H.run(tp=2,
         pp=2, dp=2, shard_on='fsdp')))"``  (8 CPU ranks)
GPU box: ``torchrun --nproc-per-node 8 labs/hybrid.py --shard fsdp --layouts t2p2d2`` (NCCL).
"""
from __future__ import annotations

import statistics
import time
from types import SimpleNamespace

import torch
import torch.distributed as dist

from lessonlib import comm, device, placement
from lessonlib.baseline import corpus_batches, grads_as_model, max_abs_diff, train_one_process
from lessonlib.context_parallel.layout import shard_sequence
from lessonlib.data import shard
from lessonlib.data_parallel.fsdp import FullyShardedDataParallel
from lessonlib.data_parallel.sharded import row_shard
from lessonlib.data_parallel.zero import ShardedOptimizer
from lessonlib.grid import MEGATRON_ORDER, ParallelContext
from lessonlib.hybrid import HybridTrainer, largest, step_losses
from lessonlib.hybrid_axes.build import (LAYOUT, average_over, build_stage, check_axes, make_model,
                                         sync_gradients)
from lessonlib.launcher import launch
from lessonlib.models import HYBRID_CONFIG, GPTConfig, TinyGPT, lm_loss
from lessonlib.pipeline.executor import PipelineExecutor
from lessonlib.pipeline.schedules import make


class AxesTrainer:
    """One rank of a (tp, cp, pp, dp, ep) run: its shard, a 1F1B executor on its pipeline,
    SGD (or ``optimizer="adamw"``) on the shard: plain, ZeRO-1 or FSDP (``shard_on``) on the
    dp_cp group. Activations travel in the model's dtype."""

    def __init__(self, model: TinyGPT, ctx: ParallelContext, m: int, global_batch: int,
                 lr: float = 0.1, shard_on: str = "none", sp: bool = False,
                 optimizer: str = "sgd"):
        cfg = model.cfg
        self.b = check_axes(cfg, ctx.tp, ctx.cp, ctx.pp, ctx.dp, ctx.ep, shard_on, global_batch,
                            m, dist.get_world_size(), sp)
        self.ctx, self.shard_on = ctx, shard_on
        self.stage = build_stage(model, ctx, sp).to(device.current_device())
        if shard_on == "fsdp":       # the gradients are reduce-scattered inside backward
            # with TP or CP collectives inside the stage's compute, FSDP's own wait at once:
            # one communicator busy at a time (lessonlib.nccl_inflight)
            self.stage = FullyShardedDataParallel(self.stage, group=ctx.dp_cp_group,
                                                  overlap=ctx.tp == 1 and ctx.cp == 1)
        self.params = list(self.stage.parameters())
        self.executor = PipelineExecutor(
            make("1f1b", ctx.pp, m), ctx.pp_rank, [self.stage], lm_loss,
            (self.b, cfg.seq // (ctx.cp * (ctx.tp if sp else 1)), cfg.hidden),  # (b, s/c[/t], h)
            stage_ranks=ctx.pp_ranks, group=ctx.pp_group, dtype=self.params[0].dtype)
        kind = HybridTrainer.OPTIMIZERS[optimizer]
        self.opt = (ShardedOptimizer(self.params, kind, group=ctx.dp_cp_group, lr=lr)
                    if shard_on == "zero1" else kind(self.params, lr=lr))

    def my_tokens(self, t: torch.Tensor) -> torch.Tensor:
        """This rank's rows (dp) and sequence shard (cp) of a global (B, s) batch."""
        t = shard(t, self.ctx.dp_rank, self.ctx.dp)
        return shard_sequence(t, self.ctx.cp_group, LAYOUT) if self.ctx.cp > 1 else t

    def step(self, x, y, keep_grads: bool = False) -> dict:
        """Pipeline forward/backward on this rank's tokens, the dp_cp sync (under FSDP done
        inside backward), one SGD step. ``keep_grads``: also return the averaged gradients
        (under ZeRO-1 an extra all-reduce of a copy, made for the check only)."""
        ctx, dev = self.ctx, device.current_device()
        x, y = self.my_tokens(x).to(dev), self.my_tokens(y).to(dev)
        self.opt.zero_grad(set_to_none=False)
        with comm.ledger() as pipe_book:
            result = self.executor.step(x if ctx.is_first_stage else None,
                                        y if ctx.is_last_stage else None)
        grads = None
        with comm.ledger() as dp_book:
            if self.shard_on == "zero1":
                if keep_grads:                       # for the check: a copy, all-reduced
                    copies = [SimpleNamespace(grad=p.grad.clone()) for p in self.params]
                    average_over(copies, ctx.dp_cp_group, ctx.dp * ctx.cp)
                    grads = [c.grad for c in copies]
                self.opt.reduce_scatter_gradients()
            elif self.shard_on == "none":
                sync_gradients(self.stage, ctx)
        if keep_grads and grads is None:
            grads = [p.grad.detach().clone() for p in self.params]
        self.opt.step()
        return {"losses": result.losses, "grads": grads,
                "pipe": pipe_book.summary(), "dp": dp_book.summary()}


# ---------------------------------------------------------------- the run and its proof
def my_share(model: TinyGPT, ctx: ParallelContext, shard_on: str, sp: bool) -> list:
    """This rank's share of ``model``'s tensors: its shard's, or under FSDP their row shards."""
    tensors = list(build_stage(model, ctx, sp).parameters())
    if shard_on != "fsdp":
        return tensors
    rank, n = ctx.dp_cp_ranks.index(ctx.rank), len(ctx.dp_cp_ranks)
    return [row_shard(t.detach(), rank, n) for t in tensors]


def reference(cfg: GPTConfig, moe: bool, global_batch: int = 8, steps: int = 3,
              lr: float = 0.1, seed: int = 0, dev=None):
    """One process, whole batch, float64: (model after the steps, first grads, losses)."""
    model = make_model(cfg, moe, seed).to(dev)
    batch_of = corpus_batches(cfg, global_batch, seed)
    run = train_one_process(model, lambda step: tuple(t.to(dev) for t in batch_of(step)),
                            steps, lr=lr)
    return model, grads_as_model(model, run["first_grads"]), run["losses"]


def train(tp: int = 1, cp: int = 1, pp: int = 1, dp: int = 1, ep: int = 1,
          shard_on: str = "none", moe: bool = False, cfg: GPTConfig = HYBRID_CONFIG,
          m: int = 2, global_batch: int = 8, steps: int = 3, lr: float = 0.1,
          seed: int = 0, sp: bool = False) -> dict:
    """Rank side: ``steps`` SGD steps on the grid, then this rank's shard of one process's
    first-step gradients and final weights against its own; ``events``: every message of
    the run, groups' creation included, for ``comm.nccl_hazards``."""
    with comm.ledger() as book:
        result = _train(tp, cp, pp, dp, ep, shard_on, moe, cfg, m, global_batch, steps, lr, seed,
                        sp)
    return {**result, "events": book.events}


def _train(tp, cp, pp, dp, ep, shard_on, moe, cfg, m, global_batch, steps, lr, seed, sp):
    ctx = ParallelContext.build(dp, pp, tp, cp=cp, ep=ep, order=MEGATRON_ORDER)
    batch_of = corpus_batches(cfg, global_batch, seed)
    trainer = AxesTrainer(make_model(cfg, moe, seed), ctx, m, global_batch, lr, shard_on, sp)
    losses, books, first_grads, seconds = [], [], None, []
    for step in range(steps):
        comm.barrier()                   # every rank starts the step together, so times compare
        start = time.perf_counter()
        with placement.timed(step, 0):
            out = trainer.step(*batch_of(step), keep_grads=step == 0)
        seconds.append(time.perf_counter() - start)
        first_grads = out["grads"] if step == 0 else first_grads
        losses.append(out["losses"])
        books.append({"pipe": out["pipe"], "dp": out["dp"]})
    dense, dense_grads, dense_losses = reference(cfg, moe, global_batch, steps, lr, seed,
                                                 device.current_device())
    result = {"rank": ctx.rank, "coords": ctx.coords, "coords4": ctx.coords4, "losses": losses,
              "cp_ranks": ctx.cp_ranks, "ep_ranks": ctx.ep_ranks,
              "edp_ranks": ctx.edp_ranks,
              "traffic": books, "param_count": sum(p.numel() for p in trainer.params),
              "step_time_s": statistics.median(seconds[1:] or seconds),
              "max_grad_diff": max_abs_diff(first_grads, my_share(dense_grads, ctx, shard_on, sp)),
              "max_weight_diff": max_abs_diff(trainer.params, my_share(dense, ctx, shard_on, sp)),
              "dense_losses": dense_losses}
    ctx.destroy()
    return result


def run(tp: int = 1, cp: int = 1, pp: int = 1, dp: int = 1, ep: int = 1, shard_on: str = "none",
        moe: bool = False, cfg: GPTConfig = HYBRID_CONFIG, m: int = 2, global_batch: int = 8,
        timeout: float = 180, sp: bool = False, **settings) -> list[dict]:
    """Caller side: check the layout (one line), then launch ``train`` on t*c*p*d ranks."""
    check_axes(cfg, tp, cp, pp, dp, ep, shard_on, global_batch, m, None, sp)
    if ep > 1 and not moe:
        raise ValueError(f"ep={ep} needs experts: pass moe=True (the MoE tiny GPT)")
    if sp and moe:
        raise ValueError("sp=True with moe=True: sequence parallelism is not combined with "
                         "MoE blocks here; use sp=False")
    return launch(train, tp * cp * pp * dp, tp=tp, cp=cp, pp=pp, dp=dp, ep=ep,
                  shard_on=shard_on, moe=moe, cfg=cfg, m=m, global_batch=global_batch, sp=sp,
                  timeout=timeout, **settings)


def parity(per_rank: list[dict]) -> dict:
    """Caller side: the run's losses (the last stages' micro-batch means) against one
    process's, and the ranks' largest gradient and weight differences from their shard."""
    losses, dense = step_losses(per_rank), per_rank[0]["dense_losses"]
    return {"losses": losses, "dense_losses": dense,
            "max_loss_diff": max(abs(a - b) for a, b in zip(losses, dense)),
            "max_grad_diff": largest(per_rank, "max_grad_diff"),
            "max_weight_diff": largest(per_rank, "max_weight_diff")}
