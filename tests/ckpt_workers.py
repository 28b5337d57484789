"""What the checkpoint tests share: rank functions they spawn (which must live in an
importable module) and the damage they do to a shard."""
import errno
import os
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist

from lessonlib.grid import ParallelContext
from lessonlib.hybrid.build import make_model
from lessonlib.hybrid.trainer import HybridTrainer
from lessonlib.long_run import checkpoint, reshard, shard_map, training
from lessonlib.models import GPTConfig, TinyGPT


def stage_against_placement(cfg: dict, dp: int, pp: int, tp: int) -> dict:
    """This rank's stage as ``HybridTrainer`` builds it, against the full model cut by
    ``shard_map.placement``: the same names in the same order, and tensors equal bit for bit?"""
    cfg = GPTConfig(**cfg)
    ctx = ParallelContext.build(dp, pp, tp)
    model = TinyGPT(cfg, seed=3)
    stage = HybridTrainer(model, ctx, m=1, global_batch=dp).stage.state_dict()
    full = dict(model.named_parameters())
    wanted = shard_map.placement(cfg, tp, pp, ctx.axis("pp").rank, ctx.axis("tp").rank)
    return {"rank": dist.get_rank(), "same_names": list(stage) == list(wanted),   # in order
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
        got = training._agreed_resume(SimpleNamespace(checkpoint_dir=folder), resume)
        agreed.append(None if got is None else got["step"])
    return agreed


def held_from_full(full: dict, held) -> torch.Tensor:
    """What a rank storing ``held`` (a ``shard_map.Held``) holds of the full tensors ``full``:
    each box copied in, the padding zero."""
    out = torch.zeros(held.shape, dtype=next(iter(full.values())).dtype)
    for seg in held.segments:
        shard_map.box_view(out, seg, seg.box).copy_(full[seg.name][tuple(slice(a, b)
                                                                         for a, b in seg.box)])
    return out


def axes_against_map(cfg: dict, cases: list) -> list[bool]:
    """Per five-axis case (t, c, p, d, e, shard, sp, moe): does ``HybridTrainer`` hold what
    ``shard_map.held`` says, bit for bit (its weights), and, after one AdamW step, optimizer
    state of the shapes it says (under ZeRO-1, this rank's range only)?"""
    cfg, out = GPTConfig(**cfg), []
    for t, c, p, d, e, shard, sp, moe in cases:
        ctx = ParallelContext.build(d, p, t, cp=c, ep=e)
        model = make_model(cfg, moe, seed=3)
        full = {name: q.detach().clone() for name, q in model.named_parameters()}
        trainer = HybridTrainer(model, ctx, 2, 8, 1e-3, shard, sp, "adamw")
        where = shard_map.held(shard_map.Layout(t, c, p, d, e, shard, moe), cfg,
                               ctx.rank)
        same = all(torch.equal(q.detach(), held_from_full(full, h))
                   for q, h in zip(trainer.params, where["model"], strict=True))
        torch.manual_seed(0)
        x = torch.randint(0, cfg.vocab, (8, cfg.seq))
        trainer.step(x, x)
        state = training._optimizer(trainer).state_dict()["state"]
        shapes = [tuple(state[i]["exp_avg"].shape) for i in range(len(state))]
        out.append(same and shapes == [tuple(h.shape) for h in where["moments"]])
        ctx.destroy()
    return out


def train_on_a_full_disk(settings: dict, resume, fail_at=None, full_at_call: int = 5):
    """``long_run.train`` on a disk that fills up: from rank 0's ``full_at_call``-th
    ``fsync`` on, every flush to disk fails with ENOSPC, as a full disk's does (rank 0 syncs
    its shard, the manifest and ``latest`` per save: 5 is the second save's manifest)."""
    if dist.get_rank() == 0:
        calls, real = [0], os.fsync

        def fsync(fd):
            calls[0] += 1
            if calls[0] >= full_at_call:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            real(fd)

        os.fsync = fsync
    return training.train(settings, resume, fail_at)
