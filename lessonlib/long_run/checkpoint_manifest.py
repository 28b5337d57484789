"""A checkpoint's manifest, read as a validated record before anything trusts a field of it.

What it teaches: a file on disk is input like any command-line flag. A manifest may be cut
short by a full disk, edited by hand, or written by another version of the code, and every
field the resume reads (the step to resume at, the world size whose shards it loads) decides
what happens next: a ``world_size`` of 0 or 10^12, a ``step`` of -5, or ``"2"`` where 2 was
meant must not reach the code that builds shard names or restores step counters. So
``parse`` checks each field's type and range, in one place, and names the field and the
file in one line; the checkpoint is then skipped like any damaged one.

    step         a whole number >= 0, equal to its folder's (step_00000020 holds step 20)
    world_size   a whole number >= 1, no more than the shards it lists or the folder holds
    meta         an object (the run's settings, compared by ``check_resume``)
    shards       an object: {"rank_00000.pt": {"bytes": int, "sha256": str}, ...}, one
                 entry per rank of ``world_size`` and no shard in the folder left out
                 (else the checkpoint is unverified, and not trusted)

Laptop:  ``python labs/train.py --world-size 2 --checkpoint-dir results/ckpt``, then edit
         ``results/ckpt/step_*/manifest.json`` and run it again: that step is named, skipped.
GPU box: the same under torchrun; every rank reads the manifest rank 0 chose.
"""
from __future__ import annotations

import json
from pathlib import Path

from lessonlib.long_run.checkpoint_folder import MANIFEST


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse(folder, path=None) -> dict:
    """The manifest of the step folder ``folder`` (or the file ``path`` in it: a temporary
    manifest), every field checked; ValueError naming the file and the field (one line) if
    it cannot be read or a field is of the wrong kind."""
    folder = Path(folder)
    path = folder / MANIFEST if path is None else Path(path)
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path} is damaged (unreadable: {exc})") from None
    if not isinstance(manifest, dict):
        raise ValueError(f"{path} is damaged: it holds a JSON {type(manifest).__name__}, "
                         f"not an object")
    step, world = manifest.get("step"), manifest.get("world_size")
    if not _whole(step) or step < 0:
        raise ValueError(f"{path} is damaged: its step is {step!r}, not a whole number >= 0")
    if step != int(folder.name[5:]):
        raise ValueError(f"{path} is damaged: its step is {step}, but it lies in the folder "
                         f"of step {int(folder.name[5:])}")
    if not _whole(world) or world < 1:
        raise ValueError(f"{path} is damaged: its world_size is {world!r}, not a whole "
                         f"number >= 1")
    shards = manifest.get("shards")
    present = len(list(folder.glob("rank_*.pt")))
    most = max(present, len(shards) if isinstance(shards, dict) else 0)
    if world > most:
        raise ValueError(f"{path} is damaged: its world_size is {world}, but it lists "
                         f"{len(shards) if isinstance(shards, dict) else 0} shards and the "
                         f"folder holds {present}")
    if not isinstance(manifest.get("meta"), dict):
        raise ValueError(f"{path} is damaged: its meta is {manifest.get('meta')!r}, not an "
                         f"object of the run's settings")
    return manifest


def records(manifest: dict, path: Path) -> tuple[dict | None, str | None]:
    """The parsed manifest's ``{shard name: {"bytes", "sha256"}}``, or what makes it
    unverifiable: no hashes, a shard in the folder it does not list, or not its world's."""
    names = [f"rank_{r:05d}.pt" for r in range(manifest["world_size"])]
    shards = manifest.get("shards")
    if not isinstance(shards, dict) or not shards:
        return None, f"{path} lists no SHA-256 for its shards: unverified, so not trusted"
    stray = sorted(p.name for p in path.parent.glob("rank_*.pt") if p.name not in shards)
    if stray:
        return None, f"{path.parent / stray[0]} is not listed in {path}: unverified, so not trusted"
    if sorted(shards) != names:
        return None, (f"{path} is damaged: it lists the shards {sorted(shards)}, but a world "
                      f"of {len(names)} ranks writes {names[0]} to {names[-1]}")
    for name, want in shards.items():
        if not (isinstance(want, dict) and _whole(want.get("bytes"))
                and isinstance(want.get("sha256"), str)):
            return None, (f"{path} lists no size and SHA-256 for {name}: unverified, so "
                          f"not trusted")
    return shards, None
