"""Three hangs planted in a synchronous step, each found from the flight recorder's dumps.

What it teaches: a distributed job hangs when its ranks stop agreeing on the sequence of
collectives. ``rank_steps`` is a data-parallel loop on 3 ranks: each step averages the loss
over the world (for the log), then the gradient over the gradient group. Three switches of
the bug zoo (``lessonlib.bug_switches``) plant, on the last rank in the last step, one of the three
hangs that PyTorch's Flight Recorder analyzer is built to name:

- ``skipped`` (``hang_skipped_collective``): the gradient all-reduce sits inside a
  rank-dependent ``if`` and one rank goes past it;
- ``reordered`` (``hang_reordered_collectives``): one rank averages the gradient before the
  loss: each side waits for the other in a different group;
- ``size`` (``hang_mismatched_size``): one rank's gradient is a row short (a bucket cut at
  another boundary).

``diagnose`` switches one on, launches the loop with a short timeout, takes every rank's
ring from the ``LaunchTimeout`` and asks ``hang_analysis.analyze`` which collective is
stuck, on which group, and which ranks never came. ``HANGS`` maps each plant to its bug in
``lessonlib.bug_switches.BUGS`` (what it is, the symptom, the check and the test that names
it); ``lessonlib.bug_checks.check`` runs the same loop as the zoo's check of each.

Laptop:  ``python -c "from lessonlib.faults import hangs; print(hangs.diagnose('skipped').finding)"``
GPU box: the same call (not run on NCCL here: on a GPU a size mismatch may read garbage
         instead of hanging); there, read PyTorch's own dumps with ``analyze_torch``.
"""
from __future__ import annotations

import os
import pickle
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from lessonlib import bug_switches, comm
from lessonlib.device import current_device
from lessonlib.faults.hang_analysis import Finding, analyze, analyze_torch
from lessonlib.launcher import LaunchTimeout, launch

WORLD = 3
TIMEOUT_S = 2.0   # how long a hang is waited for before the dumps are read (the loop: ~0.2 s)
HANGS = {"skipped": "hang_skipped_collective",        # plant: its switch in the bug zoo
         "reordered": "hang_reordered_collectives",
         "size": "hang_mismatched_size"}
PLANTS = tuple(HANGS)


def rank_steps(steps: int = 3, bad: int | None = None) -> float:
    """The loop; a hang switched on in the bug zoo (``lessonlib.bug_switches``) strikes on rank
    ``bad`` (default: the last) at the last step."""
    rank, world = dist.get_rank(), dist.get_world_size()
    bad = world - 1 if bad is None else bad
    grads = comm.new_group(list(range(world)))     # the gradient group: "1" (the world is "0")
    dev = current_device()
    for step in range(steps):
        loss = torch.tensor([float(rank + step)], device=dev)
        grad = torch.full((4,), float(rank * step), device=dev)
        strikes = rank == bad and step == steps - 1
        if strikes and bug_switches.active("hang_mismatched_size"):
            grad = grad[:3]                          # BUG: a row short (a bucket cut elsewhere)
        if strikes and bug_switches.active("hang_reordered_collectives"):
            comm.all_reduce(grad, group=grads)       # BUG: the gradient before the loss
            comm.all_reduce(loss)
            continue
        comm.all_reduce(loss)
        if not (strikes and bug_switches.active("hang_skipped_collective")):  # BUG: goes past it
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


def planted(plant: str | None):
    """A block in which hang ``plant``'s switch is on (None: as the switches are now)."""
    return bug_switches.enabled(HANGS[plant]) if plant is not None else nullcontext()


def diagnose(plant: str | None, timeout: float = TIMEOUT_S, bad: int | None = None,
             world: int = WORLD) -> Diagnosis:
    """Run ``rank_steps`` on ``world`` ranks over gloo with hang ``plant`` switched on (rank
    ``bad`` brings it in, default the last); when it hangs, name the stuck collective."""
    if plant is not None and plant not in PLANTS:
        raise ValueError(f"plant={plant!r} is not a planted hang; choose one of {PLANTS} or None")
    if bad is not None and bad not in range(world):
        raise ValueError(f"bad={bad} is not a rank of {world}; choose 0..{world - 1} or None")
    try:
        with planted(plant):
            launch(rank_steps, world, 3, bad, backend="gloo", timeout=timeout)
    except LaunchTimeout as hung:
        return Diagnosis(plant, analyze(hung.flight), hung.last_steps, hung.flight)
    return Diagnosis(plant, None, {}, {})


# ---------------------------------------------------------------- PyTorch's Flight Recorder
def rank_steps_torch_dump(folder: str, after_s: float = 1.0) -> float:
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
    return rank_steps()


def diagnose_torch(plant: str, folder: Path, timeout: float = TIMEOUT_S) -> Finding | None:
    """The same hang with PyTorch's Flight Recorder dumping into ``folder`` (which the
    caller owns and keeps), read back and analyzed like ours."""
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "64")
    try:
        with planted(plant):
            launch(rank_steps_torch_dump, WORLD, str(folder), timeout / 2, timeout=timeout)
    except LaunchTimeout:
        pass
    dumps = {int(p.name.removeprefix("rank")): pickle.loads(p.read_bytes())
             for p in sorted(Path(folder).glob("rank*"))}
    return analyze_torch(dumps)
