"""One pipeline case's runner: this stage's chunks and the engine that steps them.

What it teaches: the same cut of the same model runs under lessonlib's executor (its own
schedule, timed step by step with a ``StageRecorder``) or under PyTorch's own schedules
(``torch.distributed.pipelining``), behind one ``.step(inputs, targets)``; every run of the
lesson, the lab and the tests builds its runner here, so the two engines are compared on
exactly the same chunks.

Laptop:  see ``lessonlib.pipeline.schedule_runs`` (``measure`` and ``rank_parity`` build their
         runners here).
GPU box: the same; the chunks move to this rank's GPU.
"""
from __future__ import annotations

import torch.nn.functional as F
from torch import nn

from lessonlib.device import current_device
from lessonlib.pipeline.actions import placement_of
from lessonlib.pipeline.executor import PipelineExecutor
from lessonlib.pipeline.schedules import make
from lessonlib.pipeline.stages import stage_modules
from lessonlib.pipeline.recorder import StageRecorder
from lessonlib.pipeline.torch_ref import TorchPipeline


class InputLeaf(nn.Module):
    """Makes the first stage's input a leaf that needs its gradient, so the first stage's
    backward computes an input gradient (thrown away) like every later stage's."""

    def forward(self, x):
        return x.detach().requires_grad_()


def mse(out, target):
    return F.mse_loss(out, target)


def make_runner(engine, schedule, model, p, m, v, stage, loss_fn, shape):
    """(this stage's chunks, a runner with ``.step(inputs, targets)``) for one case. The
    chunks are moved to this rank's device (its GPU under NCCL); both runners move the
    batches they are given there too."""
    sched = make(schedule, p, m, v)
    chunks = [c.to(current_device())
              for c in stage_modules(model, p, v, stage, placement=placement_of(sched))]
    if engine == "lessonlib":
        return chunks, PipelineExecutor(sched, stage, chunks, loss_fn, shape,
                                        recorder=StageRecorder())
    if engine == "torch":
        return chunks, TorchPipeline(chunks, stage, p, m, schedule, loss_fn)
    raise ValueError(f"engine={engine!r} must be 'lessonlib' or 'torch'")
