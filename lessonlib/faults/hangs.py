"""Three hangs planted in a synchronous step, each found from the flight recorder's dumps.

What it teaches: a distributed job hangs when its ranks stop agreeing on the sequence of
collectives. ``rank_steps`` is a data-parallel loop on 3 ranks: each step averages the loss
over the world (for the log), then the gradient over the gradient group. One setting
plants, on the last rank in the last step, one of the three hangs that PyTorch's Flight
Recorder analyzer is built to name:

- ``skipped``: the gradient all-reduce sits inside a rank-dependent ``if`` and one rank
  goes past it;
- ``reordered``: one rank averages the gradient before the loss: each side waits for the
  other in a different group;
- ``size``: one rank's gradient is a row short (a bucket cut at another boundary).

``diagnose`` launches the loop with a short timeout, takes every rank's ring from the
``LaunchTimeout`` and asks ``hang_analysis.analyze`` which collective is stuck, on which
group, and which ranks never came. ``HANGS`` records each in the bug zoo's terms
(``lessonlib.bug_switches.Bug``): what it is, where it is planted, the symptom, the check and the
test that names it.

Laptop:  ``python -c "from lessonlib.faults import hangs; print(hangs.diagnose('skipped').finding)"``
GPU box: the same call (not run on NCCL here: on a GPU a size mismatch may read garbage
         instead of hanging); there, read PyTorch's own dumps with ``analyze_torch``.
"""
from __future__ import annotations

import os
import pickle
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from lessonlib import comm
from lessonlib.bug_switches import Bug
from lessonlib.device import current_device
from lessonlib.faults.hang_analysis import Finding, analyze, analyze_torch
from lessonlib.launcher import LaunchTimeout, launch

PLANTS = ("skipped", "reordered", "size")
WORLD = 3

HANGS = {b.name: b for b in (
    Bug("skipped", "A collective inside a rank-dependent branch: one rank goes past the "
        "gradient all-reduce the others wait in.",
        "lessonlib.faults.hangs.rank_steps", "the job stops making progress; no error on any "
        "rank until the timeout", "flight records lined up by group and sequence number: "
        "the missing rank's last number on the group is lower and it waits in nothing",
        "tests/test_faults_hangs.py::test_each_planted_hang_is_named[skipped]"),
    Bug("reordered", "Two collectives posted in different orders on different ranks: the "
        "loss average (world) and the gradient average (its own group).",
        "lessonlib.faults.hangs.rank_steps", "the job stops; each side waits in a different "
        "group for the other", "flight records: the missing rank waits in a collective of "
        "another group that the waiting ranks have not posted",
        "tests/test_faults_hangs.py::test_each_planted_hang_is_named[reordered]"),
    Bug("size", "One rank posts the all-reduce with a shorter tensor than the others.",
        "lessonlib.faults.hangs.rank_steps", "the short rank finishes the call; the others "
        "wait for bytes that never come", "flight records: every member posted the call, "
        "with different shapes",
        "tests/test_faults_hangs.py::test_each_planted_hang_is_named[size]"),
)}


def rank_steps(plant: str | None = None, steps: int = 3, bad: int | None = None) -> float:
    """The loop; ``plant`` names the hang rank ``bad`` (default: the last) brings in at the
    last step."""
    rank, world = dist.get_rank(), dist.get_world_size()
    bad = world - 1 if bad is None else bad
    grads = comm.new_group(list(range(world)))     # the gradient group: "1" (the world is "0")
    dev = current_device()
    for step in range(steps):
        loss = torch.tensor([float(rank + step)], device=dev)
        grad = torch.full((4,), float(rank * step), device=dev)
        planted = plant if (rank == bad and step == steps - 1) else None
        if planted == "size":
            grad = grad[:3]                          # the hang: a row short
        if planted == "reordered":
            comm.all_reduce(grad, group=grads)       # the hang: gradient before loss
        comm.all_reduce(loss)
        if planted not in ("skipped", "reordered"):  # "skipped": the hang, going past it
            comm.all_reduce(grad, group=grads)
    return loss.item()


@dataclass(frozen=True)
class Diagnosis:
    """What one run shows: ``finding`` (None: it finished), each rank's ``last_steps`` from
    the breadcrumbs, and ``dumps``: each rank's flight record, as the analyzer read it."""
    plant: str | None
    finding: Finding | None
    last_steps: dict
    dumps: dict


def diagnose(plant: str | None, timeout: float = 3.0, bad: int | None = None,
             world: int = WORLD) -> Diagnosis:
    """Run ``rank_steps`` with ``plant`` on ``world`` ranks over gloo (rank ``bad`` plants
    it, default the last); when it hangs, name the stuck collective."""
    if plant is not None and plant not in PLANTS:
        raise ValueError(f"plant={plant!r} is not a planted hang; choose one of {PLANTS} or None")
    if bad is not None and bad not in range(world):
        raise ValueError(f"bad={bad} is not a rank of {world}; choose 0..{world - 1} or None")
    try:
        launch(rank_steps, world, plant, 3, bad, backend="gloo", timeout=timeout)
    except LaunchTimeout as hung:
        return Diagnosis(plant, analyze(hung.flight), hung.last_steps, hung.flight)
    return Diagnosis(plant, None, {}, {})


# ---------------------------------------------------------------- PyTorch's Flight Recorder
def rank_steps_torch_dump(plant: str | None, folder: str, after_s: float = 1.0) -> float:
    """``rank_steps`` with PyTorch's own Flight Recorder on (``TORCH_FR_BUFFER_SIZE`` in the
    caller's environment); a watchdog thread dumps its ring to ``folder/rank<r>`` after
    ``after_s`` seconds, as PyTorch's NCCL watchdog does on a timeout. gloo releases the
    interpreter while it waits, so the thread runs beside a rank stuck in a collective."""
    from torch._C._distributed_c10d import _dump_fr_trace

    def dump():
        time.sleep(after_s)
        blob = _dump_fr_trace(True, False, False)   # collectives, no stack traces
        Path(folder, f"rank{dist.get_rank()}").write_bytes(blob)

    threading.Thread(target=dump, daemon=True).start()
    return rank_steps(plant)


def diagnose_torch(plant: str, folder: Path, timeout: float = 3.0) -> Finding | None:
    """The same hang with PyTorch's Flight Recorder dumping into ``folder`` (which the
    caller owns and keeps), read back and analyzed like ours."""
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "64")
    try:
        launch(rank_steps_torch_dump, WORLD, plant, str(folder), timeout / 2, timeout=timeout)
    except LaunchTimeout:
        pass
    dumps = {int(p.name.removeprefix("rank")): pickle.loads(p.read_bytes())
             for p in sorted(Path(folder).glob("rank*"))}
    return analyze_torch(dumps)
