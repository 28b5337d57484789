"""Rank functions the checkpoint tests spawn (they must live in an importable module)."""
import torch
import torch.distributed as dist

from lessonlib import reshard
from lessonlib.grid import ParallelContext
from lessonlib.hybrid import HybridTrainer
from lessonlib.models import GPTConfig, TinyGPT


def stage_against_placement(cfg: dict, dp: int, pp: int, tp: int) -> dict:
    """This rank's stage as ``HybridTrainer`` builds it, against the full model cut by
    ``reshard.placement``: the same names, and tensors equal bit for bit?"""
    cfg = GPTConfig(**cfg)
    ctx = ParallelContext.build(dp, pp, tp)
    model = TinyGPT(cfg, seed=3)
    stage = HybridTrainer(model, ctx, m=1, global_batch=dp).stage.state_dict()
    full = dict(model.named_parameters())
    wanted = reshard.placement(cfg, tp, pp, ctx.pp_rank, ctx.tp_rank)
    return {"rank": dist.get_rank(), "same_names": sorted(stage) == sorted(wanted),
            "equal": all(torch.equal(stage[name], reshard.cut(full, pieces).detach())
                         for name, pieces in wanted.items() if name in stage)}
