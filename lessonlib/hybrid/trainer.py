"""The one trainer of every layout and its one loop: a rank's stage, pipeline, gradient sync, step.

What it teaches: a training step on a hybrid layout is lesson 05's four lines, whatever the
axes: this rank's rows (and, under context parallelism, its shard of each sequence) through
the pipeline (forward and backward, ``pipeline.executor``), the gradients averaged over the
ranks holding the same weights (``data_parallel.ladder.sync_gradients``; reduce-scattered by
ZeRO-1's optimizer; under FSDP inside backward), one optimizer step. ``build_stage`` made the
stage; nothing here knows which rooms it holds. ``train`` is the one loop around it: lesson
05's run, the five-axis runs and ``long_run`` each hand it their batches and a per-step hook.

What the course measures of a step is recorded from outside, as the executor's timeline is:
the trainer is handed a ``recorder`` that scopes its two phases (``"pipe"`` and ``"dp"``) and
is silent by default (``no_record``); ``recorder.StepRecorder`` is the one the runs hand it
(the ranks lined up, the step timed, one ledger per phase).

Laptop:  ``python -c "from lessonlib import hybrid as H; print(H.compare_parity(H.run(dp=2, pp=2,
         tp=2)))"``  (8 CPU ranks train with it)
GPU box: ``torchrun --nproc-per-node 8 labs/hybrid.py --layouts t2p2d2`` (NCCL).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from lessonlib import device
from lessonlib.context_parallel.layout import shard_sequence
from lessonlib.data import shard
from lessonlib.data_parallel.ladder import sync_gradients
from lessonlib.data_parallel.parallelize import build_optimizer
from lessonlib.expert_parallel.groups import expert_parameters
from lessonlib.grid import ParallelContext
from lessonlib.hybrid.build import build_stage
from lessonlib.hybrid.checks import LAYOUT, check_layout
from lessonlib.instruments import placement
from lessonlib.instruments.breadcrumbs import progress
from lessonlib.instruments.spans import no_record
from lessonlib.models import TinyGPT, lm_loss
from lessonlib.models.moe import MoELayer
from lessonlib.pipeline.executor import PipelineExecutor
from lessonlib.pipeline.recorder import StageRecorder
from lessonlib.pipeline.schedules import make


@dataclass(frozen=True)
class StepResult:
    """One step on one rank: the last stage's micro-batch ``losses`` (none elsewhere), the
    most micro-batches its stash held, and with a timeline the pipeline's spans and wall
    seconds (else none and 0)."""
    losses: list
    peak_stash: int
    spans: list = field(default_factory=list, repr=False)
    wall_s: float = 0.0

    @property
    def idle_share(self) -> float | None:
        """The share of the step this stage spent outside F and B (None without a timeline)."""
        if not self.wall_s:
            return None
        return 1 - sum(s.end - s.start for s in self.spans if s.kind in ("F", "B")) / self.wall_s


class HybridTrainer:
    """One rank of a (dp, pp, cp, tp, ep) run (lesson 05's (dp, pp, tp) at c = e = 1): its
    stage, an executor of ``schedule`` on its pipeline, and an optimizer over the stage
    (``"sgd"`` or ``"adamw"``; with ``shard_on``, ZeRO-1 or FSDP on the dp_cp axis).
    ``step(x, y)`` takes the *global* batch (every rank builds the same one). Activations
    travel in the model's dtype. Instruments are handed in: ``recorder`` scopes the step's
    phases (``recorder.StepRecorder``; silent by default), ``timeline`` times every action of the
    pipeline (for the idle share); ``before_sync(trainer)``, if set, runs between backward
    and the averaging (a check's hook)."""

    OPTIMIZERS = {"sgd": torch.optim.SGD, "adamw": torch.optim.AdamW}

    def __init__(self, model: TinyGPT, ctx: ParallelContext, m: int, global_batch: int,
                 lr: float = 0.1, shard_on: str = "none", sp: bool = False,
                 optimizer: str = "sgd", schedule: str = "1f1b", *, recorder=no_record,
                 timeline: bool = False):
        if optimizer not in self.OPTIMIZERS:
            raise ValueError(f"optimizer={optimizer!r}; use one of {sorted(self.OPTIMIZERS)}")
        cfg = model.cfg
        dp, pp, cp, tp, ep = (ctx.axis(a) for a in ("dp", "pp", "cp", "tp", "ep"))
        moe = any(isinstance(layer, MoELayer) for layer in model.modules())
        self.b = check_layout(cfg, dp=dp.size, pp=pp.size, cp=cp.size, tp=tp.size, ep=ep.size,
                              global_batch=global_batch, m=m, shard_on=shard_on, sp=sp, moe=moe,
                              world_size=dist.get_world_size())
        self.ctx, self.shard_on, self.dev = ctx, shard_on, device.current_device()
        self.stage = build_stage(model, ctx, sp, shard_on, self.dev)
        self.params, self.experts = list(self.stage.parameters()), expert_parameters(self.stage)
        self.first, self.last = pp.rank == 0, pp.rank == pp.size - 1
        self.record, self.before_sync = recorder, None
        clock = StageRecorder(f"pipeline stage {pp.rank}", group=pp.group, on=timeline)
        self.executor = PipelineExecutor(
            make(schedule, pp.size, m), pp.rank, [self.stage], lm_loss,
            (self.b, cfg.seq // (cp.size * (tp.size if sp else 1)), cfg.hidden),  # (b, s/c[/t], h)
            stage_ranks=pp.ranks, group=pp.group, recorder=clock)
        self.opt = build_optimizer(self.params, ctx, self.OPTIMIZERS[optimizer], lr, shard_on)

    def my_tokens(self, t: torch.Tensor) -> torch.Tensor:
        """This rank's rows (dp) and sequence shard (cp) of a global (B, s) batch, on its
        device."""
        dp, cp = self.ctx.axis("dp"), self.ctx.axis("cp")
        t = shard(t, dp.rank, dp.size)
        return (shard_sequence(t, cp.group, LAYOUT) if cp.size > 1 else t).to(self.dev)

    def step(self, x, y) -> StepResult:
        """Forward and backward of this rank's tokens through the pipeline, the gradients
        averaged, one optimizer step."""
        x, y = self.my_tokens(x), self.my_tokens(y)
        self.opt.zero_grad(set_to_none=False)
        with self.record("pipe"):
            result = self.executor.step(x if self.first else None, y if self.last else None)
        with self.record("dp"):
            if self.before_sync is not None:
                self.before_sync(self)
            self.sync_gradients()
        self.opt.step()
        return StepResult(result.losses, result.peak_stash, result.spans, result.wall_s)

    def sync_gradients(self) -> None:
        """The gradients averaged over the ranks holding the same weights: reduce-scattered
        by ZeRO-1's optimizer; under FSDP already, inside backward; else one flat all-reduce
        over the dp_cp axis (the experts' over the edp axis, divided by d)."""
        if self.shard_on == "zero1":
            self.opt.reduce_scatter_gradients()
        elif self.shard_on == "none":
            sync_gradients(self.stage, self.ctx.axis("dp_cp").group, self.experts,
                           self.ctx.axis("edp").group, self.ctx.axis("dp").size)


def train(trainer: HybridTrainer, batches, steps: int, on_step, *, start: int = 0,
          warmup: int = 0) -> None:
    """The one step loop: for each step from ``start`` to ``steps``, the global batch
    ``batches(step)`` through ``trainer.step``, then ``on_step(step, result)`` (the caller's
    hook: what it keeps, checks or saves). The GPU audit, if on, checks the first step and
    the ``warmup`` steps only (``placement.timed``)."""
    for step in range(start, steps):
        progress(f"step {step + 1} of {steps}")
        x, y = batches(step)                                               # (B, s) each
        with placement.timed(step - start, warmup):
            result = trainer.step(x, y)
        on_step(step, result)
