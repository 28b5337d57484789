"""Every hybrid layout's run on the ranks and its proof against one process.

``train_layout`` (rank side: ``steps`` SGD steps with ``HybridTrainer`` through the one loop,
``trainer.train``, then this rank's share of one process's first gradients and final weights
against its own, the messages of each step, and every message of the run for
``nccl_rules.nccl_hazards``), ``run`` (caller side: the checks, then the launch),
``reference`` (one process, whole batch) and ``compare_parity`` (the run against it). Lesson 05's
(dp, pp, tp) run is the case c = e = 1 in float32; the five-axis runs prove themselves in
float64.

Laptop:  ``python -c "from lessonlib import hybrid as H; print(H.compare_parity(H.run(tp=2, pp=2,
         dp=2, shard_on='fsdp', dtype='float64')))"``  (8 CPU ranks)
GPU box: ``torchrun --nproc-per-node 8 labs/hybrid.py --shard fsdp --layouts t2p2d2`` (NCCL).
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass, field

from lessonlib import comm, device
from lessonlib.baseline import corpus_batches, grads_as_model, max_abs_diff, train_one_process
from lessonlib.data_parallel.ladder import allreduce_flat_gradients
from lessonlib.data_parallel.sharded import row_shard
from lessonlib.grid import ParallelContext
from lessonlib.grid_layout import AXES
from lessonlib.hybrid.build import build_stage, make_model
from lessonlib.hybrid.checks import check_layout
from lessonlib.hybrid.recorder import StepRecorder
from lessonlib.hybrid.trainer import HybridTrainer, train
from lessonlib.launcher import launch
from lessonlib.models import HYBRID_CONFIG, GPTConfig, TinyGPT
from lessonlib.tensor_parallel.parallelize import param_bytes


@dataclass(frozen=True, kw_only=True)
class RankRun:
    """One rank's run of one layout: its place (``coords`` (dp, pp, tp), ``coords4``
    (dp, pp, cp, tp), its cp, ep and edp groups' global ranks), the last stage's micro-batch
    losses per step, the median step time and idle share (with a timeline; else None) over
    the steps after the warm-up, one ``StepTraffic`` per step, its parameters' count and
    bytes, the stash's peak, every message of the run (``events``) and, with the check, its
    largest differences from its share of one process and that process's losses."""
    rank: int
    coords: tuple
    coords4: tuple
    cp_ranks: tuple
    ep_ranks: tuple
    edp_ranks: tuple
    losses: list
    step_time_s: float
    idle_share: float | None
    traffic: list = field(repr=False)
    param_count: int
    param_bytes: int
    peak_stash: int
    events: list = field(default_factory=list, repr=False)
    max_grad_diff: float | None = None
    max_weight_diff: float | None = None
    dense_losses: list | None = None


@dataclass(frozen=True)
class Parity:
    """A run against one process: the global batch's loss per step on both, the largest
    loss difference, and the ranks' largest gradient and weight differences from their
    shard of the one-process model."""
    losses: list
    dense_losses: list
    max_loss_diff: float
    max_grad_diff: float
    max_weight_diff: float


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
    ``train_layout``) in its own dtype."""
    model = model.to(dev)
    batch_of = corpus_batches(model.cfg, global_batch, seed)
    run = train_one_process(model, lambda step: tuple(t.to(dev) for t in batch_of(step)),
                            steps, lr=lr)
    return model, grads_as_model(model, run["first_grads"]), run["losses"]


def averaged_copy(into: list):
    """A ``before_sync`` hook, for the check only: ZeRO-1 leaves each rank its own gradients
    (its optimizer averages its range), so ``into`` gets a copy of them averaged over the
    dp_cp group (one flat all-reduce)."""
    def hook(trainer: HybridTrainer) -> None:
        dp_cp = trainer.ctx.axis("dp_cp")
        into[:] = [p.grad.clone() for p in trainer.params]
        allreduce_flat_gradients(into, dp_cp.group, dp_cp.size)
    return hook


def train_layout(*, dp: int = 1, pp: int = 1, cp: int = 1, tp: int = 1, ep: int = 1,
                 shard_on: str = "none", moe: bool = False, sp: bool = False,
                 cfg: GPTConfig = HYBRID_CONFIG, m: int = 2, global_batch: int = 8,
                 steps: int = 3, lr: float = 0.1, seed: int = 0, dtype: str = "float32",
                 check: bool = True, warmup: int = 0, timeline: bool = False) -> RankRun:
    """Rank side: ``steps`` SGD steps on the grid. With ``check``, also train the model in
    this process and compare this rank's share of it (gradients of the first step, weights
    after the last) with the rank's own. ``timeline``: time every action of the pipeline
    (for the idle share; the step timed by the device's clock)."""
    if not 0 <= warmup < steps:
        raise ValueError(f"warmup={warmup} must be at least 0 and below steps={steps}: the "
                         f"times are medians over the steps after the warm-up")
    with comm.ledger() as book:
        result = _train(dp, pp, cp, tp, ep, shard_on, moe, sp, cfg, m, global_batch, steps, lr,
                        seed, dtype, check, warmup, timeline)
    return dataclasses.replace(result, events=book.events)


def _train(dp, pp, cp, tp, ep, shard_on, moe, sp, cfg, m, global_batch, steps, lr, seed, dtype,
           check, warmup, timeline) -> RankRun:
    ctx = ParallelContext.build(dp, pp, tp, cp=cp, ep=ep)
    books = StepRecorder(device.timer if timeline else time.perf_counter)
    trainer = HybridTrainer(make_model(cfg, moe, seed, dtype), ctx, m, global_batch, lr,
                            shard_on, sp, recorder=books, timeline=timeline)
    first_grads, kept = [], []
    if shard_on == "zero1":         # ZeRO-1 keeps each rank's own: average a copy first
        trainer.before_sync = averaged_copy(first_grads)

    def on_step(step, result):
        if step == 0 and trainer.before_sync is None:     # the gradients the optimizer used
            first_grads[:] = [p.grad.detach().clone() for p in trainer.params]
        trainer.before_sync = None
        kept.append((result, *books.read()))

    train(trainer, corpus_batches(cfg, global_batch, seed), steps, on_step, warmup=warmup)
    timed = kept[warmup:]
    out = RankRun(rank=ctx.rank, coords=ctx.coords, coords4=ctx.coords4,
                  cp_ranks=ctx.axis("cp").ranks, ep_ranks=ctx.axis("ep").ranks,
                  edp_ranks=ctx.axis("edp").ranks, losses=[r.losses for r, _, _ in kept],
                  step_time_s=statistics.median(s for _, _, s in timed),
                  idle_share=statistics.median(r.idle_share for r, _, _ in timed)
                  if timeline else None,
                  traffic=[t for _, t, _ in kept], param_bytes=param_bytes(trainer.stage),
                  param_count=sum(p.numel() for p in trainer.params),
                  peak_stash=kept[-1][0].peak_stash)
    if check:
        dense, dense_grads, dense_losses = reference(make_model(cfg, moe, seed, dtype),
                                                     global_batch, steps, lr, seed, trainer.dev)
        out = dataclasses.replace(
            out, dense_losses=dense_losses,
            max_grad_diff=max_abs_diff(first_grads, my_share(dense_grads, ctx, shard_on, sp)),
            max_weight_diff=max_abs_diff(trainer.params, my_share(dense, ctx, shard_on, sp)))
    ctx.destroy()          # each layout makes its own groups: free them before the next
    return out


def train_layouts(layouts, **settings) -> list[RankRun]:
    """Rank side: ``train_layout`` each (dp, pp, tp) of ``layouts`` in turn, in one launch
    (the world size must be the product of each); one result per layout."""
    return [train_layout(dp=dp, pp=pp, tp=tp, **settings) for dp, pp, tp in layouts]


def run(*, dp: int = 1, pp: int = 1, cp: int = 1, tp: int = 1, ep: int = 1,
        shard_on: str = "none", moe: bool = False, sp: bool = False,
        cfg: GPTConfig = HYBRID_CONFIG, m: int = 2, global_batch: int = 8,
        timeout: float = 180, **settings) -> list[RankRun]:
    """Caller side: check the layout (one line), then launch ``train_layout`` on
    d*p*c*t ranks."""
    check_layout(cfg, dp=dp, pp=pp, cp=cp, tp=tp, ep=ep, global_batch=global_batch, m=m,
                 shard_on=shard_on, sp=sp, moe=moe)
    return launch(train_layout, dp * pp * cp * tp, dp=dp, pp=pp, cp=cp, tp=tp, ep=ep,
                  shard_on=shard_on, moe=moe, sp=sp, cfg=cfg, m=m, global_batch=global_batch,
                  timeout=timeout, **settings)


def compare_parity(per_rank: list[RankRun]) -> Parity:
    """Caller side: the run's losses (the last stages' micro-batch means) against one
    process's, and the ranks' largest gradient and weight differences from their shard."""
    grads, weights = largest(per_rank, "max_grad_diff"), largest(per_rank, "max_weight_diff")
    losses = step_losses([r.coords for r in per_rank], [r.losses for r in per_rank])
    dense = per_rank[0].dense_losses
    return Parity(losses, dense, max(abs(a - b) for a, b in zip(losses, dense)), grads, weights)


def step_losses(coords: list, losses: list) -> list[float]:
    """The global batch's mean loss per step, from each rank's (dp, pp, tp) ``coords`` and
    its ``losses`` per step (the last stages' micro-batch losses): the mean over the m
    micro-batches of each replica, then over the d replicas."""
    places = [dict(zip(AXES, c)) for c in coords]                  # {"dp": i, "pp": j, "tp": k}
    last_stage = max(place["pp"] for place in places)
    last = [mine for mine, place in zip(losses, places)
            if place["pp"] == last_stage and place["tp"] == 0]
    return [statistics.fmean(statistics.fmean(mine[s]) for mine in last)
            for s in range(len(last[0]))]


def largest(per_rank: list[RankRun], name: str) -> float:
    """The largest ``name`` over the ranks; a rank that did not report it is an error."""
    missing = [r.rank for r in per_rank if getattr(r, name) is None]
    if missing:
        raise ValueError(f"rank(s) {missing} did not report {name}: train them with "
                         f"check=True (the default) to compare them with one process")
    return max(getattr(r, name) for r in per_rank)
