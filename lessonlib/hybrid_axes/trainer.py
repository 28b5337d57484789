"""The one trainer of every layout: one rank's stage, its pipeline, its gradient sync, its step.

What it teaches: a training step on a hybrid layout is lesson 05's four lines, whatever the
axes: this rank's rows (and, under context parallelism, its shard of each sequence) through
the pipeline (forward and backward, ``pipeline.executor``), the gradients averaged over the
ranks holding the same weights (``expert_parallel.sync_gradients``; reduce-scattered by
ZeRO-1's optimizer; under FSDP inside backward), one optimizer step. ``build_stage`` (in
``build``) made the stage; nothing here knows which rooms it holds.

Laptop:  ``python -c "import lessonlib as L; print(L.hybrid.parity_summary(
         L.hybrid.run(2, 2, 2)))"``  (8 CPU ranks train with it)
GPU box: ``torchrun --nproc-per-node 8 labs/hybrid.py --layouts t2p2d2`` (NCCL).
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from lessonlib import comm, device
from lessonlib.context_parallel.layout import shard_sequence
from lessonlib.data import shard
from lessonlib.expert_parallel.groups import sync_gradients
from lessonlib.grid import ParallelContext
from lessonlib.hybrid_axes.build import LAYOUT, build_optimizer, build_stage, check_axes
from lessonlib.models import TinyGPT, lm_loss
from lessonlib.pipeline.executor import PipelineExecutor
from lessonlib.pipeline.schedules import make
from lessonlib.pipeline.recorder import StageRecorder


class HybridTrainer:
    """One rank of a (tp, cp, pp, dp, ep) run (lesson 05's (dp, pp, tp) at c = e = 1): its
    stage, an executor of ``schedule`` on its pipeline, and an optimizer over the stage
    (``"sgd"`` or ``"adamw"``; with ``shard_on``, ZeRO-1 or FSDP on the dp_cp group).
    ``step(x, y)`` takes the *global* batch (every rank builds the same one). Activations
    travel in the model's dtype."""

    OPTIMIZERS = {"sgd": torch.optim.SGD, "adamw": torch.optim.AdamW}

    def __init__(self, model: TinyGPT, ctx: ParallelContext, m: int, global_batch: int,
                 lr: float = 0.1, shard_on: str = "none", sp: bool = False,
                 optimizer: str = "sgd", schedule: str = "1f1b"):
        if optimizer not in self.OPTIMIZERS:
            raise ValueError(f"optimizer={optimizer!r}; use one of {sorted(self.OPTIMIZERS)}")
        cfg = model.cfg
        self.b = check_axes(cfg, ctx.tp, ctx.cp, ctx.pp, ctx.dp, ctx.ep, shard_on, global_batch,
                            m, dist.get_world_size(), sp)
        self.ctx, self.shard_on = ctx, shard_on
        self.stage = build_stage(model, ctx, sp, shard_on, device.current_device())
        self.params = list(self.stage.parameters())
        pp = ctx.axis("pp")
        self.timeline = StageRecorder(f"pipeline stage {pp.rank}", group=pp.group)
        self.executor = PipelineExecutor(
            make(schedule, pp.size, m), pp.rank, [self.stage], lm_loss,
            (self.b, cfg.seq // (ctx.cp * (ctx.tp if sp else 1)), cfg.hidden),  # (b, s/c[/t], h)
            stage_ranks=pp.ranks, group=pp.group, recorder=self.timeline)
        self.opt = build_optimizer(self.params, ctx, self.OPTIMIZERS[optimizer], lr, shard_on)

    def my_tokens(self, t: torch.Tensor) -> torch.Tensor:
        """This rank's rows (dp) and sequence shard (cp) of a global (B, s) batch."""
        dp, cp = self.ctx.axis("dp"), self.ctx.axis("cp")
        t = shard(t, dp.rank, dp.size)
        return shard_sequence(t, cp.group, LAYOUT) if cp.size > 1 else t

    def step(self, x, y, timeline: bool = False, before_sync=None) -> dict:
        """Forward and backward of this rank's tokens through the pipeline, the gradients
        averaged, one optimizer step. Returns this rank's losses (last stage), the pipeline's
        and the averaging's ledger summaries, the step's seconds and the stash's peak.
        ``timeline``: line the stages up and time every action, for the share of the step
        this stage spent outside F and B (else None). ``before_sync(trainer)``: called
        between backward and the averaging (a check's hook; None by default)."""
        ctx, dev = self.ctx, device.current_device()
        x, y = self.my_tokens(x).to(dev), self.my_tokens(y).to(dev)
        self.opt.zero_grad(set_to_none=False)
        start = device.timer() if timeline else time.perf_counter()
        self.timeline.on = timeline
        with comm.ledger() as pipe_book:
            result = self.executor.step(x if ctx.is_first_stage else None,
                                        y if ctx.is_last_stage else None)
        with comm.ledger() as dp_book:
            if before_sync is not None:
                before_sync(self)
            if self.shard_on == "zero1":         # reduce-scattered; under FSDP inside backward
                self.opt.reduce_scatter_gradients()
            elif self.shard_on == "none":
                sync_gradients(self.stage, ctx.dp_cp_group, ctx.edp_group, ctx.dp)
        self.opt.step()
        busy = sum(s.end - s.start for s in result.spans if s.kind in ("F", "B"))
        return {"losses": result.losses, "seconds": device.timer() - start,
                "pipe": pipe_book.summary(), "dp": dp_book.summary(),
                "peak_stash": result.peak_stash,
                "idle_share": 1 - busy / result.wall_s if timeline else None}
