"""Sharded checkpoints that survive a kill and check themselves: every rank saves its own
shard, one manifest commits them, and loading proves each file is the one that was saved.

What it teaches: a run of hours will be killed (a preempted job, a node that fails, a wall
time reached), and the work since the last checkpoint is lost. Megatron-LM and
torch.distributed.checkpoint save the same way as this module, on a smaller scale:

* **every rank writes its own shard** (its pipeline stage's weights, split over its TP group,
  and the optimizer state of those weights): no rank gathers the model, so saving costs the
  same at 2 ranks as at 2,000, and the files sit on a file system all nodes share;
* **a checkpoint exists only once it is complete**: each shard is written to a temporary
  name and renamed (a rename is atomic); the ranks all-gather each shard's size and SHA-256
  (40 bytes per rank, and the barrier that says every shard is on disk); then rank 0 writes
  the manifest, with those sizes and hashes, and, last, points ``latest`` at it;
* **a checkpoint proves itself on load**: a truncated, empty, missing or overwritten shard,
  a manifest that is not valid JSON or lists no hash for a shard (unverified), or a shard
  it does not list, no longer matches; ``latest`` names the file and falls back to the
  newest verified checkpoint; pruning keeps the newest ``keep`` verified ones and never
  removes a folder without a manifest (``checkpoint_folder``: only the course's files);
* **resume continues the same run**: the step, the loss history and the RNG state travel with
  the weights and the optimizer state, and the data of step k depends only on k
  (``data.lm_batch``), so the resumed loss curve is the uninterrupted one.

A folder holds ``step_00000040/rank_00001.pt``, ``step_00000040/manifest.json`` and
``latest`` (the newest complete step's name, for people; ``latest()`` trusts only the
manifests). The manifest records what the shards only fit: world size, layout, model, batch,
optimizer. ``restart.check_resume`` compares it with the new run's settings before any
process starts and names every setting that differs.

Laptop:  ``python labs/train.py --world-size 2 --checkpoint-dir results/ckpt``; stop it
         (Ctrl-C or kill) and run the same command again: it resumes.
GPU box: ``torchrun --nproc-per-node 8 --max-restarts 3 labs/train.py --checkpoint-dir
         /shared/ckpt`` (torchrun restarts failed workers, which resume from ``latest``).
"""
from __future__ import annotations

import hashlib
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from lessonlib import comm, device
from lessonlib.long_run import checkpoint_manifest
# The folder's names, its check and its deletions live beside.
from lessonlib.long_run.checkpoint_folder import (LATEST, MANIFEST, held_shards, remove_step,
                                                  shard_path, step_dir, steps)


class CheckpointError(RuntimeError):
    """A shard that is not the file its manifest describes."""


class SaveFailed(RuntimeError):
    """A checkpoint could not be written (a full disk, say); the earlier ones are intact."""


def _record(data) -> dict:
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):   # 1 MiB at a time: shards are big
            digest.update(chunk)
    return digest.hexdigest()


def _atomic_write(path: Path, data) -> None:
    """Write ``data`` to a temporary sibling, flush it to disk, rename it into place. A write
    that fails removes its own temporary file (named by this process's id) and, if the file
    system refused it (a full disk), raises ``SaveFailed`` in one line."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise _not_written(path, exc) from None
        raise


def _not_written(path: Path, exc: OSError) -> SaveFailed:
    return SaveFailed(f"{path} could not be written ({exc.strerror or exc}); the checkpoints "
                      f"saved before it are intact. Free space there (or give the checkpoints "
                      f"another folder) and run the same command again: it resumes from the "
                      f"newest")


# ---------------------------------------------------------------- writing (rank side)
def write_shard(directory, step: int, rank: int, state: dict) -> dict:
    """Write this rank's ``state`` (tensors, numbers, lists, dicts) for ``step``; return
    the file's size and SHA-256, hashed from the bytes written (not read back)."""
    path = shard_path(directory, step, rank)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _not_written(path.parent, exc) from None
    buffer = io.BytesIO()
    torch.save(state, buffer)
    data = buffer.getbuffer()
    _atomic_write(path, data)
    return _record(data)


def _as_tensor(record: dict) -> torch.Tensor:
    raw = record["bytes"].to_bytes(8, "little") + bytes.fromhex(record["sha256"])
    return torch.tensor(list(raw), dtype=torch.uint8)                 # (40,)


def _as_record(tensor: torch.Tensor) -> dict:
    raw = bytes(tensor.cpu().tolist())
    return {"bytes": int.from_bytes(raw[:8], "little"), "sha256": raw[8:].hex()}


def commit(directory, step: int, world_size: int, meta: dict, keep: int = 2,
           shards: list[dict] | None = None) -> Path:
    """Rank 0, after every rank's ``write_shard``: write the manifest with each shard's size
    and hash (``shards``, one per rank; None: hash the files here, for one process), point
    ``latest`` at it, prune, and delete the temporary files of saves killed mid-write."""
    folder = step_dir(directory, step)
    paths = [shard_path(directory, step, r) for r in range(world_size)]
    missing = [r for r, path in enumerate(paths) if not path.exists()]
    if missing:
        raise RuntimeError(f"checkpoint {folder} lacks the shards of ranks {missing}: "
                           f"commit only after every rank's write_shard (a barrier)")
    if shards is None:
        shards = [_record(path.read_bytes()) for path in paths]
    manifest = {"step": step, "world_size": world_size, "meta": meta,
                "shards": {path.name: record for path, record in zip(paths, shards)}}
    _atomic_write(folder / MANIFEST, json.dumps(manifest, indent=1).encode())
    problem = verify(folder, hashes=False)[1]
    if problem:                       # never prune on the word of a checkpoint that is not there
        raise CheckpointError(f"the checkpoint just written does not match its manifest: {problem}")
    point_latest(directory, folder)
    _prune(directory, step, keep)
    return folder


def point_latest(directory, folder) -> None:
    """Write the step folder's name into ``latest`` (for people; ``latest()`` reads manifests)."""
    _atomic_write(Path(directory) / LATEST, Path(folder).name.encode())


def _prune(directory, step: int, keep: int) -> None:
    """Keep the newest ``keep`` verified checkpoints, ``step`` (just written) among them,
    removing only older ones: the checkpoints this run continues. A newer folder was written
    by another run (``restart.recover`` sets those aside before a run starts), and a folder
    without a manifest may hold the only copy of good shards: neither is ever removed. An older
    damaged or unverified one never counts, so it never pushes out a verified one."""
    older = []
    for s in steps(directory):
        folder = step_dir(directory, s)
        if s >= step or not (folder / MANIFEST).exists():
            continue
        if verify(folder, hashes=False)[0] is None:
            remove_step(folder)
        else:
            older.append(folder)
    for folder in older[:max(0, len(older) - (keep - 1))]:
        remove_step(folder)


def save(directory, step: int, state: dict, meta: dict, keep: int = 2) -> None:
    """Collective: every rank of the default group calls it with its own ``state``."""
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = _as_tensor(write_shard(directory, step, rank, state)).to(device.current_device())
    records = [torch.empty_like(mine) for _ in range(world)]
    comm.all_gather(records, mine)     # every shard is on disk before the manifest says so
    if rank == 0:
        commit(directory, step, world, meta, keep, [_as_record(r) for r in records])
    comm.barrier()                     # nobody runs ahead while rank 0 may still prune


# ---------------------------------------------------------------- reading
def verify(folder, hashes: bool = True, path=None) -> tuple[dict | None, str | None]:
    """``(manifest, None)`` if the checkpoint in ``folder`` is intact and verified, else
    ``(None, what is wrong)``: no manifest ("incomplete"), an unreadable or damaged one (a
    field of the wrong kind: ``checkpoint_manifest``), a shard without a hash or not listed,
    a shard not as listed. ``hashes=False``: sizes only; ``path``: verify against that
    manifest file (a temporary one) instead. Pure."""
    folder = Path(folder)
    path = folder / MANIFEST if path is None else Path(path)
    if not path.exists():
        held = held_shards(folder)
        if held:
            return None, (f"{folder} holds the shards of ranks 0-{held[-1]} but no {MANIFEST}: "
                          f"a save interrupted before its manifest, or the manifest lost "
                          f"(incomplete)")
        return None, f"{folder} has no {MANIFEST}: a save was interrupted (incomplete)"
    try:
        manifest = checkpoint_manifest.parse(folder, path)
    except ValueError as exc:
        return None, str(exc)
    shards, problem = checkpoint_manifest.records(manifest, path)
    if problem:
        return None, problem
    for name, want in shards.items():
        shard = folder / name
        try:
            size = shard.stat().st_size
        except OSError:
            return None, f"{shard} is missing (its manifest lists it)"
        if size != want["bytes"]:
            return None, (f"{shard} is damaged: {size:,} bytes, its manifest says "
                          f"{want['bytes']:,} (truncated or emptied)")
        if hashes and file_sha256(shard) != want["sha256"]:
            return None, (f"{shard} is damaged: its SHA-256 differs from its manifest's "
                          f"(bytes changed after it was saved)")
    return manifest, None


def scan(directory, check=None) -> tuple[dict | None, list[str]]:
    """The newest verified checkpoint's manifest (with its ``path``) or None, and what is
    wrong with each newer folder, newest first; ``check(manifest)`` may name more damage."""
    problems = []
    for s in reversed(steps(directory)):
        manifest, problem = verify(step_dir(directory, s))
        if manifest is not None:
            manifest = {**manifest, "path": str(step_dir(directory, s))}
            problem = check(manifest) if check is not None else None
            if problem is None:
                return manifest, problems
        problems.append(problem)
    return None, problems


@dataclass(frozen=True)
class Checkpoint:
    """The newest intact checkpoint: its step, folder, the run's settings its manifest
    records (``meta``), the newer folders skipped as damaged, and ``manifest``: the manifest
    as saved, with ``path`` and ``damaged`` added, what a run resumes from."""
    step: int
    path: str
    meta: dict
    damaged: list
    manifest: dict


def latest(directory) -> Checkpoint | None:
    """The newest intact checkpoint, or None. Pure, so the caller can decide before any
    process starts."""
    found, problems = scan(directory)
    if found is None:
        return None
    return Checkpoint(step=found["step"], path=found["path"], meta=found["meta"],
                      damaged=problems, manifest={**found, "damaged": problems})


def at_step(directory, step: int) -> dict:
    """The checkpoint of ``step``, checked (CheckpointError naming the damaged file if not)."""
    manifest, problem = verify(step_dir(directory, step))
    if manifest is None:
        raise CheckpointError(problem)
    return {**manifest, "path": str(step_dir(directory, step)), "damaged": []}


def load(folder, rank: int, map_location=None, manifest: dict | None = None) -> dict:
    """Rank side: rank ``rank``'s shard in a checkpoint folder (``latest(...).path``),
    checked against the manifest's size and hash, its tensors on ``map_location`` (default:
    this rank's ``device.current_device()``, not the GPU it was saved from)."""
    path = Path(folder) / f"rank_{rank:05d}.pt"
    if manifest is None:
        manifest = json.loads((Path(folder) / MANIFEST).read_text())
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CheckpointError(f"{path} is missing (its manifest lists it)") from None
    want = (manifest.get("shards") or {}).get(path.name)
    if want is None:
        raise CheckpointError(f"{Path(folder) / MANIFEST} lists no SHA-256 for {path.name}: "
                              f"unverified, so not loaded")
    if _record(data) != want:
        raise CheckpointError(f"{path} is damaged: {len(data):,} bytes and a SHA-256 that "
                              f"do not match its manifest's ({want['bytes']:,} bytes)")
    where = device.current_device() if map_location is None else map_location
    return torch.load(io.BytesIO(data), map_location=where, weights_only=True)


def rng_state() -> dict:
    """This process's random state, to save beside the weights (dropout and sampling would
    otherwise draw other numbers after a resume)."""
    return {"cpu": torch.get_rng_state(), "device": device.rng_state()}


def set_rng_state(state: dict) -> None:
    """Restore ``rng_state()``; both generators take their state as a CPU byte tensor, so it
    comes back from wherever ``load`` mapped it."""
    torch.set_rng_state(state["cpu"].cpu())
    device.set_rng_state(None if state["device"] is None else state["device"].cpu())
