"""What a checkpoint folder holds, by name, and how to delete only that.

What it teaches: a program that deletes files must delete only the files it wrote. A
checkpoint folder is often a folder a person also uses (a results folder, the working
directory), so the course recognises its own files by their exact names and deletes
nothing else:

    step_00000040/rank_00001.pt    one rank's shard
    step_00000040/manifest.json    the checkpoint's commit record
    step_00000040/.rank_00001.pt.tmp1234, .latest.tmp1234   a save killed mid-write
    latest                         the name of the newest complete step
    run.lock                       the process id of the run that holds the folder
    step_00000040.unverified/      shards without a manifest, set aside (never deleted)

``clear`` (what ``labs/train.py --fresh`` does) refuses a folder that holds anything else,
naming one foreign file, so that ``--checkpoint-dir .`` or a folder with a user's notes in
it is never emptied; pruning removes a step folder's own files and the folder only when
nothing foreign is left in it.

A step folder whose shards are all there (``rank_00000.pt`` on, no save in progress) but
whose manifest is not may hold the only copy of good weights: the manifest was lost, or the
save was killed between the last shard and the manifest. Nothing proves those shards good,
and nothing proves them bad, so they are never deleted, overwritten or pruned: ``set_aside``
renames the folder to ``step_00000040.unverified`` (the next run does so by itself, see
``restart.recover``), and ``clear`` does the same instead of deleting it. A run deletes
only what it wrote: its own temporary file of a write that failed, and the checkpoints older
than the one it just saved (``folder_lock`` makes it the folder's only writer).

Laptop:  ``python labs/train.py --world-size 2 --checkpoint-dir results/ckpt --fresh``
GPU box: the same under torchrun; rank 0 alone deletes.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from lessonlib import writable

LATEST = "latest"
LOCK = "run.lock"
MANIFEST = "manifest.json"
_STEP = re.compile(r"step_\d{8}")
_IN_STEP = re.compile(r"rank_\d{5}\.pt|manifest\.json|\.(rank_\d{5}\.pt|manifest\.json)\.tmp\d+")
_TOP = re.compile(r"latest|\.latest\.tmp\d+|run\.lock")
_SET_ASIDE = re.compile(r"step_\d{8}\.unverified\d*")
_SHARD = re.compile(r"rank_(\d{5})\.pt")


def check_directory(directory, setting: str = "checkpoint_dir") -> None:
    """Before any process starts: ValueError naming ``setting`` unless ``directory`` is a
    folder this process can write in, or can be created (not a file, nor inside one, nor on
    a kernel file system such as ``/proc``)."""
    path = Path(directory).absolute()
    try:
        path.exists()
    except OSError as exc:            # a name too long for the file system, say
        raise ValueError(f"{setting}={str(directory)[:60]!r}... cannot be a folder here "
                         f"({exc.strerror or exc}); give a shorter folder path") from None
    if path.exists() and not path.is_dir():
        raise ValueError(f"{setting}={str(directory)!r} is a file, not a folder; give a folder "
                         f"for the checkpoints (it is created if it does not exist)")
    parent = next(q for q in (path, *path.parents) if q.exists())
    if not parent.is_dir():
        raise ValueError(f"{setting}={str(directory)!r} lies inside the file {parent}; give "
                         f"a folder path")
    kernel = writable.kernel_filesystem(parent)
    if kernel:            # to root, os.access says yes, then the first save fails
        raise ValueError(f"{setting}={str(directory)!r}: {parent} is on the kernel's {kernel} "
                         f"file system, where no checkpoint can be kept; give a folder on a disk")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{setting}={str(directory)!r}: {parent} is not writable by this "
                         f"user; give a folder you can write in")


def step_dir(directory, step: int) -> Path:
    return Path(directory) / f"step_{step:08d}"


def shard_path(directory, step: int, rank: int) -> Path:
    return step_dir(directory, step) / f"rank_{rank:05d}.pt"


def steps(directory) -> list[int]:
    """The steps that have a folder in ``directory``, oldest first."""
    folder = Path(directory)
    if not folder.is_dir():
        return []
    return sorted(int(p.name[5:]) for p in folder.iterdir()
                  if _STEP.fullmatch(p.name) and p.is_dir())


def _ours_in_step(path: Path) -> bool:
    return path.is_file() and not path.is_symlink() and bool(_IN_STEP.fullmatch(path.name))


def foreign(directory) -> Path | None:
    """One file or folder in ``directory`` that the course did not write, or None."""
    folder = Path(directory)
    if not folder.is_dir():
        return None
    for entry in sorted(folder.iterdir()):
        if _TOP.fullmatch(entry.name) and entry.is_file() and not entry.is_symlink():
            continue
        ours = _STEP.fullmatch(entry.name) or _SET_ASIDE.fullmatch(entry.name)
        if not (ours and entry.is_dir() and not entry.is_symlink()):
            return entry
        stranger = next((p for p in sorted(entry.iterdir()) if not _ours_in_step(p)), None)
        if stranger is not None:
            return stranger
    return None


def held_shards(folder, world_size: int = 1) -> list[int]:
    """The ranks of the shards in a step folder that has no manifest, when they look like a
    whole checkpoint whose manifest is gone: ``rank_00000.pt`` to ``rank_<k-1>.pt``, k at
    least ``world_size``, and no shard still being written. [] for a folder with a manifest,
    and for an interrupted save (a shard's temporary file, a gap, fewer than
    ``world_size``), which the next save of that step may overwrite."""
    folder = Path(folder)
    if not folder.is_dir() or (folder / MANIFEST).exists():
        return []
    names = [p.name for p in folder.iterdir()]
    ranks = sorted(int(m.group(1)) for m in map(_SHARD.fullmatch, names) if m)
    writing = any(name.startswith(".rank_") for name in names)
    if writing or len(ranks) < max(1, world_size) or ranks != list(range(len(ranks))):
        return []
    return ranks


def held_ahead(directory, world_size: int, found: dict | None) -> list[Path]:
    """The step folders after checkpoint ``found`` (all, if None) that hold a whole world's
    shards without a manifest (``held_shards``): a run resumed from ``found`` would write
    those steps again, over shards that may be the only copy of good weights."""
    after = found["step"] if found else -1
    return [step_dir(directory, s) for s in steps(directory)
            if s > after and held_shards(step_dir(directory, s), world_size)]


def set_aside(folder) -> Path:
    """Rename a step folder to ``<name>.unverified`` (``.unverified2``... if taken): out of
    the way of the run, which would write that step again, and never deleted."""
    folder = Path(folder)
    for n in range(1, 1000):
        target = folder.with_name(f"{folder.name}.unverified{n if n > 1 else ''}")
        if not target.exists():
            folder.rename(target)
            return target
    raise ValueError(f"{folder}: 999 folders are already set aside beside it; move them away")


def remove_step(folder, temporaries: bool = False) -> None:
    """Delete a step folder's shards and manifest (with ``temporaries``, its temporary files
    too), and the folder once nothing else is left in it."""
    folder = Path(folder)
    if not folder.is_dir() or folder.is_symlink():
        return
    for path in folder.iterdir():
        if _ours_in_step(path) and (temporaries or not path.name.startswith(".")):
            path.unlink(missing_ok=True)
    try:
        folder.rmdir()
    except OSError:         # a file the course did not write is still in it: keep both
        pass


def clear(directory, setting: str = "checkpoint_dir") -> None:
    """Delete every checkpoint in ``directory`` and its ``latest`` marker, and set aside
    (never delete) the folders of shards without a manifest (``held_shards``); ValueError
    naming ``setting`` and one foreign file if the folder holds anything the course did not
    write (then nothing is deleted)."""
    folder = Path(directory)
    if not folder.exists():
        return
    stranger = foreign(folder)
    if stranger is not None:
        raise ValueError(
            f"{setting}={str(directory)!r} holds {stranger.relative_to(folder)}, which is not a checkpoint file; "
            f"nothing was deleted. Only a folder that holds nothing but checkpoints is cleared: "
            f"give a folder of its own to the checkpoints, or move that file away")
    for step in steps(folder):
        if held_shards(step_dir(folder, step)):
            set_aside(step_dir(folder, step))
        else:
            remove_step(step_dir(folder, step), temporaries=True)
    for path in folder.iterdir():
        if _TOP.fullmatch(path.name) and path.name != LOCK:    # the lock stays its holder's
            path.unlink(missing_ok=True)
