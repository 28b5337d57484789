"""Breadcrumbs: each rank says what it is doing now, so a hang can be named.

What it teaches: when N processes wait on each other, the question is never "is it slow?"
but "which rank is stuck, in which call?". ``progress(step)`` overwrites one small file per
rank with the step and the time; the launcher reads them when a launch times out, and every
``lessonlib.comm`` call leaves one automatically.

It sits on the ground floor: ``comm`` and the launcher both import it, it imports neither.

Laptop:  ``python -c "from lessonlib.instruments.breadcrumbs import progress; progress('hello')"``
         (does nothing outside a launch)
GPU box: the same.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import torch.distributed as dist

PROGRESS_ENV = "LESSONLIB_PROGRESS_DIR"
_progress_fd: int | None = None


def progress(step: str) -> None:
    """Report what this rank is doing now; a timeout error shows each rank's last step.

    Costs one small write; does nothing outside ``launch`` (under torchrun, say)."""
    global _progress_fd
    folder = os.environ.get(PROGRESS_ENV)
    if folder is None:
        return
    if _progress_fd is None:
        path = Path(folder) / f"rank{dist.get_rank() if dist.is_initialized() else 'x'}.step"
        _progress_fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    line = f"{time.time():.3f} {step}"[:500].encode()
    os.pwrite(_progress_fd, line.ljust(512), 0)


def read_steps(workdir: Path, world_size: int) -> dict[int, str]:
    """Each rank's last step and how long ago it was reported (the launcher's timeout message)."""
    steps, now = {}, time.time()
    for rank in range(world_size):
        path = workdir / f"rank{rank}.step"
        text = path.read_text().strip() if path.exists() else ""
        if not text:
            steps[rank] = "(reported nothing: still starting up?)"
            continue
        stamp, _, step = text.partition(" ")
        steps[rank] = f"{step!r}, {now - float(stamp):.1f} s ago"
    return steps
