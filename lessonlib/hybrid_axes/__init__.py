"""Beyond three axes: TP/SP, CP, PP, then DP/ZeRO/FSDP (and EP inside d) on one grid.

``build``: the rooms applied in one documented order (torchtitan's ``parallelize_llama``
order) and the gradient sync; ``runs``: the trainer, the 8-rank runs and their proof against
one process (float64).

Laptop:  ``python -c "from lessonlib import hybrid_axes as H; print(H.parity(H.run(tp=2,
         cp=2, pp=2)))"``
GPU box: ``torchrun --nproc-per-node 8 labs/hybrid.py --cp 2 --layouts t2p2d1`` (NCCL).
"""
from lessonlib.hybrid_axes.build import (SHARDS, build_stage, check_axes, make_model,
                                         sync_gradients, tensor_parallel_block)
from lessonlib.hybrid_axes.runs import AxesTrainer, parity, reference, run, train

__all__ = ["SHARDS", "build_stage", "check_axes", "make_model", "sync_gradients",
           "tensor_parallel_block", "AxesTrainer", "parity", "reference", "run", "train"]
