"""What the checkpoint tests share: rank functions they spawn (which must live in an
importable module) and the damage they do to a shard."""
from pathlib import Path

import torch
import torch.distributed as dist

from lessonlib import checkpoint, long_run, reshard
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


def damage_inside_a_tensor(path: Path) -> None:
    """Overwrite 32 bytes in the middle of the shard's largest weight with 0xFF (a float32
    NaN), as a bad disk or a stray write would: the file keeps its size and still loads."""
    weights = torch.load(path, weights_only=True)["model"].values()
    raw = max(weights, key=torch.Tensor.numel).contiguous().numpy().tobytes()
    data = bytearray(path.read_bytes())
    at = data.find(raw) + len(raw) // 2
    assert at > len(raw) // 2 and len(raw) >= 64, "the tensor's bytes are not in the file"
    data[at:at + 32] = b"\xff" * 32
    path.write_bytes(bytes(data))


def agreed_steps(folder: str, cases: list) -> list:
    """Per case, each rank's own choice of checkpoint step (None: a fresh start) in, the
    step ``long_run`` resumes from out: rank 0's, on every rank."""
    agreed = []
    for steps in cases:
        mine = steps[dist.get_rank()]
        resume = None if mine is None else checkpoint.at_step(folder, mine)
        got = long_run._agreed_resume({"checkpoint_dir": folder}, resume)
        agreed.append(None if got is None else got["step"])
    return agreed
