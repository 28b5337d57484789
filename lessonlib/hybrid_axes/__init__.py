"""Every hybrid layout, one code path: TP/SP, CP, PP, then DP/ZeRO/FSDP (and EP inside d) on one grid.

``build``: the checks and the builder (``build_stage``: the pipeline's cut, then
``apply_tp``, ``apply_ep``, ``apply_cp``, ``apply_dp``); ``trainer``: ``HybridTrainer``, one
rank's step; ``runs``: the runs on the ranks and their proof against one process. Lesson
05's (dp, pp, tp) grid is the case c = e = 1 (``lessonlib.hybrid``).

Laptop:  ``python -c "from lessonlib import hybrid_axes as H; print(H.parity(H.run(tp=2,
         cp=2, pp=2)))"``
GPU box: ``torchrun --nproc-per-node 8 labs/hybrid.py --cp 2 --layouts t2p2d1`` (NCCL).
"""
from lessonlib.hybrid_axes.build import (SHARDS, build_stage, check_axes, check_3d_layout,
                                         make_model, stage_counts)
from lessonlib.hybrid_axes.runs import parity, reference, run, step_losses, train
from lessonlib.hybrid_axes.trainer import HybridTrainer

__all__ = ["SHARDS", "build_stage", "check_axes", "check_3d_layout", "make_model", "stage_counts",
           "HybridTrainer", "parity", "reference", "run", "step_losses", "train"]
