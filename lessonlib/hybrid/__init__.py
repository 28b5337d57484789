"""Hybrid parallelism: every layout, from lesson 05's three axes to five, in one package.

Read in this order, each file one idea:

* ``checks``: every refusal of a layout, once (``check_layout``: one line naming the
  setting, before any process);
* ``build``: ``build_stage`` orders the rooms: the pipeline's cut, then each strategy's own
  ``apply_*`` (``tensor_parallel.apply_tp``, ``expert_parallel.apply_ep``,
  ``context_parallel.apply_cp``, ``data_parallel.apply_dp``);
* ``trainer``: ``HybridTrainer``, one rank's step (its instruments handed in), and
  ``train``, the one step loop every hybrid run goes through with its own per-step hook;
* ``recorder``: ``StepRecorder``, what the runs measure of a step (the ranks lined up, the
  step timed, one ledger per phase), handed to the trainer from outside;
* ``layout_runs``: the runs on the ranks (``train_layout``), the launch (``run``), one
  process (``reference``) and the proof (``compare_parity``), lesson 05's run being
  c = e = 1 in float32;
* ``traffic``: lesson 05's counts, the parameters and messages each rank should have.

    from lessonlib import hybrid
    hybrid.compare_parity(hybrid.run(dp=2, pp=2, tp=2))

Laptop:  ``python -c "from lessonlib import hybrid as H; print(H.compare_parity(H.run(tp=2, cp=2,
         pp=2, dtype='float64')))"``
GPU box: ``torchrun --nproc-per-node 8 labs/hybrid.py --cp 2 --layouts t2p2d1`` (NCCL).
"""
from lessonlib.hybrid.build import build_stage, make_model, stage_counts
from lessonlib.hybrid.checks import check_layout
from lessonlib.hybrid.layout_runs import (Parity, RankRun, compare_parity, reference, run,
                                          step_losses, train_layout, train_layouts)
from lessonlib.hybrid.recorder import StepRecorder, StepTraffic
from lessonlib.hybrid.traffic import expected_param_count, expected_traffic, measured_traffic
from lessonlib.hybrid.trainer import HybridTrainer, StepResult, train

__all__ = ["build_stage", "make_model", "stage_counts", "check_layout", "Parity", "RankRun",
           "compare_parity", "reference", "run", "step_losses", "train_layout", "train_layouts",
           "expected_param_count", "expected_traffic", "measured_traffic", "HybridTrainer",
           "StepRecorder", "StepResult", "StepTraffic", "train"]
