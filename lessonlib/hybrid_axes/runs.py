"""The runs on the ranks and their proof against one process: ``train`` (rank side: 3 steps
with ``HybridTrainer``, then this rank's share of one process's first gradients and final
weights against its own, and the recorded messages for ``nccl_rules.nccl_hazards``), ``run``
(caller side), ``reference`` (one process, whole batch) and ``parity``.

Laptop:  ``python -c "from lessonlib import hybrid_axes as H; print(H.parity(H.run(tp=2,
         pp=2, dp=2, shard_on='fsdp')))"``  (8 CPU ranks)
GPU box: ``torchrun --nproc-per-node 8 labs/hybrid.py --shard fsdp --layouts t2p2d2`` (NCCL).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from lessonlib import comm, device
from lessonlib.baseline import corpus_batches, grads_as_model, max_abs_diff, train_one_process
from lessonlib.data_parallel.ladder import allreduce_flat_gradients
from lessonlib.data_parallel.sharded import row_shard
from lessonlib.grid import ParallelContext
from lessonlib.grid_layout import AXES, MEGATRON_ORDER
from lessonlib.hybrid_axes.build import build_stage, check_axes, make_model
from lessonlib.hybrid_axes.trainer import HybridTrainer
from lessonlib.instruments import placement
from lessonlib.launcher import launch
from lessonlib.models import HYBRID_CONFIG, GPTConfig, TinyGPT


# ---------------------------------------------------------------- the run and its proof
@dataclass(frozen=True)
class StepTraffic:
    """One step's messages on one rank, as its two ledgers summed them (``Ledger.summary``:
    {op: {"calls", "bytes", "seconds"}}): ``pipe`` the pipeline's (TP all-reduces inside the
    stage, PP sends and receives between stages), ``dp`` the gradient averaging's."""
    pipe: dict
    dp: dict


def my_share(model: TinyGPT, ctx: ParallelContext, shard_on: str, sp: bool) -> list:
    """This rank's share of ``model``'s tensors: its shard's, or under FSDP their row shards."""
    tensors = list(build_stage(model, ctx, sp).parameters())
    if shard_on != "fsdp":
        return tensors
    dp_cp = ctx.axis("dp_cp")
    return [row_shard(t.detach(), dp_cp.rank, dp_cp.size) for t in tensors]


def reference(model: TinyGPT, global_batch: int = 8, steps: int = 3, lr: float = 0.1,
              seed: int = 0, dev=None):
    """One process, whole batch: (``model`` after the steps, a model of its first-step
    gradients, losses), trained on ``dev`` (the CPU by default; a rank's own device inside
    ``train``) in its own dtype (lesson 05's float32, the five-axis runs' float64)."""
    model = model.to(dev)
    batch_of = corpus_batches(model.cfg, global_batch, seed)
    run = train_one_process(model, lambda step: tuple(t.to(dev) for t in batch_of(step)),
                            steps, lr=lr)
    return model, grads_as_model(model, run["first_grads"]), run["losses"]


def train(tp: int = 1, cp: int = 1, pp: int = 1, dp: int = 1, ep: int = 1,
          shard_on: str = "none", moe: bool = False, cfg: GPTConfig = HYBRID_CONFIG,
          m: int = 2, global_batch: int = 8, steps: int = 3, lr: float = 0.1,
          seed: int = 0, sp: bool = False) -> dict:
    """Rank side: ``steps`` SGD steps on the grid, then this rank's shard of one process's
    first-step gradients and final weights against its own; ``traffic``: one ``StepTraffic``
    per step; ``events``: every message of the run, groups' creation included, for
    ``nccl_rules.nccl_hazards``."""
    with comm.ledger() as book:
        result = _train(tp, cp, pp, dp, ep, shard_on, moe, cfg, m, global_batch, steps, lr, seed,
                        sp)
    return {**result, "events": book.events}


def _train(tp, cp, pp, dp, ep, shard_on, moe, cfg, m, global_batch, steps, lr, seed, sp):
    ctx = ParallelContext.build(dp, pp, tp, cp=cp, ep=ep, order=MEGATRON_ORDER)
    batch_of = corpus_batches(cfg, global_batch, seed)
    trainer = HybridTrainer(make_model(cfg, moe, seed), ctx, m, global_batch, lr, shard_on, sp)
    losses, books, first_grads, seconds = [], [], [], []
    for step in range(steps):
        comm.barrier()                   # every rank starts the step together, so times compare
        start = time.perf_counter()
        copy_first = step == 0 and shard_on == "zero1"     # ZeRO-1 keeps each rank's own
        with placement.timed(step, 0):
            out = trainer.step(*batch_of(step),
                               before_sync=averaged_copy(first_grads) if copy_first else None)
        seconds.append(time.perf_counter() - start)
        if step == 0 and not copy_first:      # the gradients the optimizer used
            first_grads = [p.grad.detach().clone() for p in trainer.params]
        losses.append(out["losses"])
        books.append(StepTraffic(pipe=out["pipe"], dp=out["dp"]))
    dense, dense_grads, dense_losses = reference(make_model(cfg, moe, seed), global_batch, steps,
                                                 lr, seed, device.current_device())
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


def averaged_copy(into: list):
    """A ``before_sync`` hook, for the check only: ZeRO-1 leaves each rank its own gradients
    (its optimizer averages its range), so ``into`` gets a copy of them averaged over the
    dp_cp group (one flat all-reduce)."""
    def hook(trainer: HybridTrainer) -> None:
        dp_cp = trainer.ctx.axis("dp_cp")
        into[:] = [p.grad.clone() for p in trainer.params]
        allreduce_flat_gradients(into, dp_cp.group, dp_cp.size)
    return hook


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


def step_losses(per_rank: list[dict]) -> list[float]:
    """The global batch's mean loss per step, from the last stages' micro-batch losses
    (mean over the m micro-batches of each replica, then over the d replicas)."""
    places = [dict(zip(AXES, r["coords"])) for r in per_rank]     # {"dp": i, "pp": j, "tp": k}
    last_stage = max(place["pp"] for place in places)
    last = [r for r, place in zip(per_rank, places)
            if place["pp"] == last_stage and place["tp"] == 0]
    return [statistics.fmean(statistics.fmean(r["losses"][s]) for r in last)
            for s in range(len(last[0]["losses"]))]


def largest(per_rank: list[dict], key: str) -> float:
    """The largest ``key`` over the ranks; a rank that did not report it is an error."""
    missing = [r.get("rank") for r in per_rank if key not in r]
    if missing:
        raise ValueError(f"rank(s) {missing} did not report {key}: train them with "
                         f"check=True (the default) to compare them with one process")
    return max(r[key] for r in per_rank)
