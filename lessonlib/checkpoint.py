"""Sharded checkpoints that survive a kill: every rank saves its own shard, one manifest commits.

What it teaches: a run of hours will be killed (a preempted job, a node that fails, a wall
time reached), and the work since the last checkpoint is lost. Megatron-LM and
torch.distributed.checkpoint save the same way as this module, on a smaller scale:

* **every rank writes its own shard** (its pipeline stage's weights, split over its TP group,
  and the optimizer state of those weights): no rank gathers the model, so saving costs the
  same at 2 ranks as at 2,000, and the files sit on a file system all nodes share;
* **a checkpoint exists only once it is complete**: each shard is written to a temporary
  name and renamed (a rename is atomic), all ranks meet at a barrier, then rank 0 writes the
  manifest and, last, points ``latest`` at it. A rank killed mid-write leaves a folder
  without a manifest, which ``latest()`` never picks;
* **resume continues the same run**: the step, the loss history and the RNG state travel with
  the weights and the optimizer state, and the data of step k depends only on k
  (``data.lm_batch``), so the resumed loss curve is the uninterrupted one.

A folder holds ``step_00000040/rank_00001.pt``, ``step_00000040/manifest.json`` and
``latest`` (the name of the newest complete step). The manifest records what the shards
only fit: world size, layout, model, batch, optimizer. ``check_resume`` compares it with the
new run's settings before any process starts and names every setting that differs.

Laptop:  ``python labs/train.py --world-size 2 --checkpoint-dir results/ckpt``; stop it
         (Ctrl-C or kill) and run the same command again: it resumes.
GPU box: ``torchrun --nproc-per-node 8 --max-restarts 3 labs/train.py --checkpoint-dir
         /shared/ckpt`` (torchrun restarts failed workers, which resume from ``latest``).
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

LATEST = "latest"
MANIFEST = "manifest.json"


def step_dir(directory, step: int) -> Path:
    return Path(directory) / f"step_{step:08d}"


def shard_path(directory, step: int, rank: int) -> Path:
    return step_dir(directory, step) / f"rank_{rank:05d}.pt"


def _atomic_write(path: Path, write) -> None:
    """``write(file)`` into a temporary sibling, flush it to disk, rename it into place."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# ---------------------------------------------------------------- writing (rank side)
def write_shard(directory, step: int, rank: int, state: dict) -> Path:
    """Write this rank's ``state`` (tensors, numbers, lists, dicts) for ``step``."""
    path = shard_path(directory, step, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    _atomic_write(path, lambda f: torch.save(state, f))
    return path


def commit(directory, step: int, world_size: int, meta: dict, keep: int = 2) -> Path:
    """Rank 0, after every rank's ``write_shard``: write the manifest, point ``latest`` at
    it, and delete all but the newest ``keep`` complete checkpoints (and any incomplete
    folder older than this one, left by a killed run)."""
    folder = step_dir(directory, step)
    missing = [r for r in range(world_size) if not shard_path(directory, step, r).exists()]
    if missing:
        raise RuntimeError(f"checkpoint {folder} lacks the shards of ranks {missing}: "
                           f"commit only after every rank's write_shard (a barrier)")
    manifest = {"step": step, "world_size": world_size, "meta": meta}
    _atomic_write(folder / MANIFEST, lambda f: f.write(json.dumps(manifest, indent=1).encode()))
    _atomic_write(Path(directory) / LATEST, lambda f: f.write(folder.name.encode()))
    complete = [s for s in _steps(directory) if (step_dir(directory, s) / MANIFEST).exists()]
    for old in _steps(directory):
        if old < step and (old not in complete or old in complete[:-keep]):
            shutil.rmtree(step_dir(directory, old), ignore_errors=True)
    return folder


def save(directory, step: int, state: dict, meta: dict, keep: int = 2) -> None:
    """Collective: every rank of the default group calls it with its own ``state``."""
    import torch.distributed as dist

    from lessonlib import comm

    rank, world = dist.get_rank(), dist.get_world_size()
    write_shard(directory, step, rank, state)
    comm.barrier()          # every shard is on disk before the manifest says so
    if rank == 0:
        commit(directory, step, world, meta, keep)
    comm.barrier()          # nobody runs ahead while rank 0 may still prune


# ---------------------------------------------------------------- reading
def _steps(directory) -> list[int]:
    folder = Path(directory)
    if not folder.is_dir():
        return []
    return sorted(int(p.name[5:]) for p in folder.glob("step_*") if p.name[5:].isdigit())


def latest(directory) -> dict | None:
    """The newest complete checkpoint's manifest (with its ``path``), or None. Pure: reads
    files only, so the caller can decide before any process starts."""
    directory = Path(directory)
    pointer = directory / LATEST
    candidates = [directory / pointer.read_text().strip()] if pointer.exists() else []
    # If the pointer is missing or stale, fall back to the newest folder with a manifest.
    candidates += [step_dir(directory, s) for s in reversed(_steps(directory))]
    for folder in candidates:
        if (folder / MANIFEST).exists():
            manifest = json.loads((folder / MANIFEST).read_text())
            return {**manifest, "path": str(folder)}
    return None


def check_resume(directory, world_size: int, meta: dict) -> dict | None:
    """Caller side, before launching: the checkpoint a run with these settings would resume
    from, or None for a fresh start. Raise ValueError naming every setting that differs."""
    found = latest(directory)
    if found is None:
        return None
    wanted = {"world_size": world_size, **meta}
    saved = {"world_size": found["world_size"], **found["meta"]}
    differ = [f"{k}: checkpoint {saved.get(k)!r}, this run {wanted.get(k)!r}"
              for k in sorted(set(saved) | set(wanted)) if saved.get(k) != wanted.get(k)]
    if differ:
        raise ValueError(
            f"the checkpoint in {found['path']} (step {found['step']}) was written by a run "
            f"with other settings; its shards only fit that run:\n  " + "\n  ".join(differ)
            + f"\nresume with the checkpoint's settings, or start afresh in a new folder "
              f"(or delete {directory})")
    return found


def load(folder, rank: int) -> dict:
    """Rank side: this rank's shard in a checkpoint folder (``latest(...)["path"]``)."""
    return torch.load(Path(folder) / f"rank_{rank:05d}.pt", weights_only=True)


def rng_state() -> dict:
    """This process's random state, to save beside the weights (dropout and sampling would
    otherwise draw other numbers after a resume)."""
    from lessonlib import device

    return {"cpu": torch.get_rng_state(), "device": device.rng_state()}


def set_rng_state(state: dict) -> None:
    from lessonlib import device

    torch.set_rng_state(state["cpu"])
    device.set_rng_state(state["device"])
