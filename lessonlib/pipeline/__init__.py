"""Pipeline parallelism: schedules as data, a validator, an executor, PyTorch's for comparison.

One idea per module:

* ``actions``: the language (``Kind``: F, B, W, SEND_F, RECV_F, SEND_B, RECV_B; ``Action``,
  an F marked ``overlap`` sharing one F&B slot with the B after it; where chunks sit;
  ``add_communication``);
* ``schedules``: ``gpipe(p, m)``, ``one_f_one_b(p, m)``, ``interleaved_one_f_one_b(p, m, v)``
  and ``make(name, p, m, v)`` return, per stage, the ordered actions; ``zero_bubble``:
  ``zero_bubble_h1(p, m)`` and ``zbv(p, m)``, B and W split; ``dualpipe``: ``dualpipev(p, m)``,
  DeepSeek's V with F&B slots, and its README's ``bubble_formula``; all pure Python;
* ``validate``: the validator, pure Python, one schedule read once: ``check`` (the static
  rules), ``simulate`` (deadlocks, bubble, peak stash per stage; ``replay`` on measured
  times), the executor's transfers grouped in rounds of one ``batch_isend_irecv`` each
  (``lockstep``) and ``check_batches``, which proves such blocking batches never hang;
  ``validate``, the one call before running;
* ``split_backward`` (B and W on autograd); ``recorder``: the executor's recorder (``StageRecorder``; ``no_record``, the default);
* ``stages``: the chunks each device holds, over ``lessonlib.layer_split``'s cut into p
  (or p*v) balanced stages; ``lessonlib.instruments.activations`` measures what a stage
  keeps for backward;
* ``executor``: ``PipelineExecutor`` runs a schedule on real ranks (gloo or NCCL) and
  records a timeline per rank;
* ``torch_ref``: the same stages under ``torch.distributed.pipelining``;
* ``runner``: one case's chunks and the engine that steps them (the executor or PyTorch's);
* ``schedule_runs``: the lesson's measurements (what the notebook, the lab and the tests launch);
  ``dualpipe_runs``: DualPipeV's (simulated bubble against the formula, parity).

The pure names are importable from here without torch; the others load on first use.

Laptop:  ``python -m lessonlib.pipeline.validate``
GPU box: the same; ``labs/pp.py`` under torchrun runs the executor on GPUs.
"""
import importlib

from lessonlib.pipeline.actions import Action
from lessonlib.pipeline.dualpipe import dualpipev
from lessonlib.pipeline.schedules import gpipe, interleaved_one_f_one_b, make, one_f_one_b
from lessonlib.pipeline.validate import ScheduleError, check, simulate, validate
from lessonlib.pipeline.zero_bubble import zbv, zero_bubble_h1

_LAZY = {"PipelineExecutor": "executor", "StepResult": "executor", "TorchPipeline": "torch_ref",
         "stage_modules": "stages"}

__all__ = ["Action", "gpipe", "one_f_one_b", "interleaved_one_f_one_b", "make",
           "zero_bubble_h1", "zbv", "dualpipev",
           "ScheduleError", "check", "simulate", "validate", *_LAZY]


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(f"lessonlib.pipeline.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'lessonlib.pipeline' has no attribute {name!r}")
