"""The same pipeline stages run by PyTorch's own ``torch.distributed.pipelining``.

What it teaches: lessonlib's executor is a teaching copy of what PyTorch ships. Here the
very same stage modules are wrapped in ``PipelineStage`` and driven by ``ScheduleGPipe``,
``Schedule1F1B`` or, for the zero-bubble schedules, ``ScheduleInterleavedZeroBubble``
(one stage per rank, against lessonlib's ZB-H1; it needs m a multiple of p) and
``ScheduleZBVZeroBubble`` (two stages per rank in a V, against ZBV), and
``ScheduleDualPipeV`` (the same V, against DualPipeV; it needs m >= 2p), so tests can check
that both compute the same losses and gradients and the lab can compare their speed. Three
facts about torch 2.13 worth knowing:

* ``Schedule1F1B`` refuses m < p; it runs min(m, p - stage) forwards before its first
  backward and fuses each send with the next receive into one batched exchange;
* its loss is not scaled: with ``scale_grads=True`` (the default) it divides the
  gradients by m after the last backward, which for a mean loss gives the same gradients
  as lessonlib's loss / m;
* ``ScheduleDualPipeV`` runs an OVERLAP_F_B action's forward and backward one after the
  other in one thread (its runtime loops over the two sub-actions): the overlap is in the
  order, what a model's own overlapped forward-backward would exploit.

To measure PyTorch's run the same way as lessonlib's, the stage module is wrapped in a
``lessonlib.instruments.activations.Metered`` (saved activations, count and bytes) and the stage's
``forward_one_chunk`` / ``backward_one_chunk`` / ``backward_weight_one_chunk`` are timed
into the same kind of timeline, with the same clock: marks (CUDA events on a GPU) read
after one synchronize per step.

Laptop:  ``python -c "import lessonlib as L; from lessonlib.pipeline import schedule_runs;
         print(L.launch(schedule_runs.demo, 2, engine='torch'))"``
GPU box: the same call runs on NCCL with one GPU per stage.
"""
from __future__ import annotations

from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleDualPipeV,
                                          ScheduleGPipe, ScheduleInterleavedZeroBubble,
                                          ScheduleZBVZeroBubble)

from lessonlib import comm
from lessonlib.device import current_device, elapsed, mark, synchronize
from lessonlib.instruments.activations import ActivationMeter, Metered
from lessonlib.instruments.spans import Span
from lessonlib.pipeline.executor import StepResult

TORCH_SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B,
                   "zb-h1": ScheduleInterleavedZeroBubble, "zbv": ScheduleZBVZeroBubble,
                   "dualpipev": ScheduleDualPipeV}
V_SHAPED = ("zbv", "dualpipev")


def torch_can_run(schedule: str, p: int, m: int) -> bool:
    """Whether PyTorch 2.13's schedule accepts p stages and m micro-batches: Schedule1F1B
    needs m >= p, ScheduleInterleavedZeroBubble m a multiple of p, ScheduleDualPipeV
    m >= 2p."""
    return schedule in TORCH_SCHEDULES and not (
        (schedule == "1f1b" and m < p) or (schedule == "zb-h1" and m % p)
        or (schedule == "dualpipev" and m < 2 * p))


class TorchPipeline:
    """One stage of a p-stage pipeline under PyTorch's schedule ``schedule`` (a key of
    ``TORCH_SCHEDULES``), with m micro-batches; ``step`` returns a lessonlib ``StepResult``.

    ``group`` holds the pipeline's ranks in stage order (default: the world, stage s =
    rank s)."""

    def __init__(self, module, stage: int, p: int, m: int, schedule: str, loss_fn,
                 group=None, device=None):
        if schedule not in TORCH_SCHEDULES:
            raise ValueError(f"schedule={schedule!r}: PyTorch's reference here is one of "
                             f"{', '.join(TORCH_SCHEDULES)}")
        if not torch_can_run(schedule, p, m):
            raise ValueError(f"PyTorch's {TORCH_SCHEDULES[schedule].__name__} cannot run m={m} "
                             f"on p={p} stages (1F1B needs m >= p, its zero-bubble schedule m a "
                             f"multiple of p, DualPipeV m >= 2p)")
        self.stage, self.p, self.m = stage, p, m
        self.group = group
        modules = list(module) if isinstance(module, (list, tuple)) else [module]
        self.meter = ActivationMeter(q for mod in modules for q in mod.parameters())
        index = [stage] if schedule not in V_SHAPED else [stage, 2 * p - 1 - stage]
        self.stages = [PipelineStage(Metered(mod, self.meter), k, p * len(modules),
                                     device or current_device(), group=group)
                       for mod, k in zip(modules, index)]
        self.pipe_stage = self.stages[0]
        self.last_rank = 0 if schedule in V_SHAPED else p - 1
        first = self.stages if schedule in ("zb-h1", *V_SHAPED) else self.pipe_stage
        self.schedule = TORCH_SCHEDULES[schedule](first, n_microbatches=m, loss_fn=loss_fn,
                                                  scale_grads=True)
        self._spans: list[tuple] = []      # (kind, chunk, start mark, end mark)
        for c, pipe_stage in enumerate(self.stages):
            for kind, name in (("F", "forward_one_chunk"), ("B", "backward_one_chunk"),
                               ("W", "backward_weight_one_chunk")):
                method = getattr(pipe_stage, name)
                setattr(pipe_stage, name, self._timed(kind, c, method))

    def _timed(self, kind, chunk, method):
        def timed(mb, *args, **kwargs):
            start = mark()
            out = method(mb, *args, **kwargs)
            self._spans.append((kind, mb, chunk, start, mark()))
            return out
        return timed

    def step(self, inputs=None, targets=None, align: bool = True) -> StepResult:
        """One training step; gradients land in the module's ``.grad`` (divided by m)."""
        first, last = self.stage == 0, self.stage == self.last_rank
        dev = self.pipe_stage.device
        inputs, targets = (t.to(dev) if t is not None else None for t in (inputs, targets))
        args = (inputs,) if first else ()
        kwargs = {"target": targets, "losses": []} if last else {}
        if align:
            comm.barrier(self.group)
        self._spans = []
        self.meter.reset()
        t0 = mark()
        self.schedule.step(*args, return_outputs=False, **kwargs)
        end = mark()
        synchronize()
        spans = [Span(k, mb, c, elapsed(t0, a), elapsed(t0, b))
                 for k, mb, c, a, b in self._spans]
        losses = [float(x) for x in kwargs.get("losses", [])]
        return StepResult(self.stage, losses, spans, elapsed(t0, end), self.meter.peak_groups,
                          self.meter.peak_groups, self.meter.peak_bytes)

