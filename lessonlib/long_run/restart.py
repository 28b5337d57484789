"""What a run started in a used checkpoint folder does first: finish or set aside what an
interrupted run left, then choose the checkpoint to resume from and compare its settings.

What it teaches: "kill the run at any moment, run the same command again: it resumes" must
hold for every moment, also between a save's last shard and its manifest. A save writes its
manifest to a temporary name and renames it; killed in between, the folder holds every shard
and a ``.manifest.json.tmp<pid>`` that lists them. ``recover`` renames that manifest into
place when every shard has the size and hash it lists (the save is then exactly what it
would have been), and otherwise sets the step folder aside (renamed, never deleted), with
every folder after the newest verified checkpoint, never an earlier one. ``check_resume``
then names every setting that differs from the checkpoint's, before any process starts.

Both run on the caller's side, before the launch, while the run holds the folder
(``folder_lock``): nothing else writes in it meanwhile.

Laptop:  ``python labs/train.py --world-size 2 --checkpoint-dir results/ckpt``, killed with
         ``kill -9`` at any moment, then the same command again
GPU box: ``torchrun --max-restarts 3 ... labs/train.py`` (rank 0 recovers, every restart)
"""
from __future__ import annotations

import os
from pathlib import Path

from lessonlib.long_run import checkpoint
from lessonlib.long_run.checkpoint_folder import (MANIFEST, held_ahead, held_shards, set_aside,
                                                  step_dir, steps)


def _complete(folder: Path) -> str | None:
    """A save interrupted between its last shard and its manifest: rename its temporary
    manifest into place if that one lists every shard with the size and hash it has; what
    was done, or None."""
    for tmp in sorted(folder.glob(f".{MANIFEST}.tmp*")):
        if checkpoint.verify(folder, path=tmp)[0] is not None:
            os.replace(tmp, folder / MANIFEST)
            return (f"completed the interrupted save of {folder.name} (its temporary "
                    f"manifest lists every shard, each with its size and SHA-256)")
    return None


def recover(directory, check=None) -> list[str]:
    """Caller side, before a run starts, holding the folder (``folder_lock``): finish what an
    interrupted run left, and say what was done (one line each). A save interrupted between
    its last shard and its manifest is completed when its temporary manifest matches every
    shard (``_complete``); then every step folder after the newest verified checkpoint (an
    interrupted save, shards without a manifest, a damaged checkpoint) is set aside as
    ``step_*.unverified``: renamed, never deleted, never an earlier step. If no checkpoint
    is verified and one is damaged, nothing is set aside (``check_resume`` refuses, naming
    it). ``check`` as for ``checkpoint.scan``."""
    notes = []
    for s in steps(directory):
        folder = step_dir(directory, s)
        if not (folder / MANIFEST).exists():
            notes += [note for note in [_complete(folder)] if note]
    found, problems = checkpoint.scan(directory, check)
    if found is None and any("(incomplete)" not in p for p in problems):
        return notes
    after = found["step"] if found else -1
    newer = [step_dir(directory, s) for s in reversed(steps(directory)) if s > after]
    for folder, problem in zip(newer, problems):
        moved = set_aside(folder)
        notes.append(f"skipping a newer checkpoint: {problem}; its folder is set aside as "
                     f"{moved.name} (nothing deleted)")
    if found is not None and notes:
        checkpoint.point_latest(directory, found["path"])
    return notes


def _differences(saved: dict, wanted: dict, may_differ: tuple[str, ...], flags: dict) -> list:
    """One line per setting that differs: both values ("not set" for one this run lacks), and
    with ``flags`` ({setting: its flag}) the flag that would match the checkpoint."""
    lines = []
    for k in sorted(set(saved) | set(wanted)):
        if saved.get(k) == wanted.get(k) or k in may_differ:
            continue
        mine = "not set" if k not in wanted else repr(wanted[k])
        line = f"{k}: checkpoint {saved.get(k)!r}, this run {mine}"
        if k in flags and k in saved:
            value = saved[k]
            line += (f" (pass {flags[k]})" if value is True else
                     f" (leave out {flags[k]})" if value is False else
                     f" (pass {flags[k]} {value})")
        lines.append(line)
    return lines


def check_resume(directory, world_size: int, meta: dict, may_differ: tuple[str, ...] = (),
                 check=None, flags: dict | None = None) -> dict | None:
    """Caller side, before launching: the checkpoint a run with these settings would resume
    from, or None for a fresh start. Raise ValueError naming every setting that differs
    (except those in ``may_differ``), or if no checkpoint in the folder is verified (only
    interrupted saves: a fresh start). ``check`` as for ``checkpoint.scan``; ``flags`` as for
    ``_differences`` (a lab's names for the settings). A newer step folder that
    holds a whole world's shards without a manifest (``held_shards``) is refused too: the
    run would write that step again over shards that may be the only copy."""
    found, problems = checkpoint.scan(directory, check)
    ahead = held_ahead(directory, world_size, found)
    if ahead:
        folder = ahead[0]
        raise ValueError(
            f"{folder} holds the shards of ranks 0-{held_shards(folder)[-1]} but no "
            f"{MANIFEST}, so they cannot be verified, and this run would write that step "
            f"over them; nothing was changed. Move that folder away, or set it aside "
            f"(labs/train.py --set-aside renames it to {folder.name}.unverified; nothing "
            f"is deleted)")
    if found is None:
        damaged = [p for p in problems if "(incomplete)" not in p]
        if damaged:
            raise ValueError(f"no intact checkpoint in {directory} to resume from: "
                             + "; ".join(damaged) + "; move the folder away to start afresh")
        return None
    wanted = {"world_size": world_size, **meta}
    saved = {"world_size": found["world_size"], **found["meta"]}
    differ = _differences(saved, wanted, may_differ, flags or {})
    if differ:
        raise ValueError(
            f"the checkpoint in {found['path']} (step {found['step']}) was written by a run "
            f"with other settings; its shards only fit that run:\n  " + "\n  ".join(differ)
            + f"\nresume with the checkpoint's settings, or start afresh in a new folder "
              f"(or delete {directory})")
    return {**found, "damaged": problems}
