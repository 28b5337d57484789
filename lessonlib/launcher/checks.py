"""Everything a launch can refuse, refused before any process starts, in one line each.

What it teaches: the ranks are separate processes, so a function reaches them *by value*:
``cloudpickle`` (the pickler Dask, Ray and PySpark use for interactively defined functions)
sends a function written in a notebook cell together with the globals it uses. What only
makes sense inside this process (an open file, a lock, a tensor in this process's GPU
memory) cannot travel; the error names the culprit and what to pass instead.

Laptop:  ``python -c "import lessonlib as L; L.launch(print, 100000)"``  (refused: cores)
GPU box: the same.
"""
from __future__ import annotations

import io
import math
import os
import pickle
import sys
from pathlib import Path

import cloudpickle
import torch

from lessonlib import device
from lessonlib.argcheck import positive_int, positive_number

RANKS_PER_CORE = 8  # beyond this a CPU box only thrashes; each rank is an interpreter + torch
# gloo counts a timeout in nanoseconds in 64 bits (292 years); 10 million seconds (116 days)
# is far beyond any lesson and far inside every limit.
MAX_TIMEOUT_S = 1e7
CGROUP = Path("/sys/fs/cgroup")   # where Linux mounts the cgroup hierarchy


def cores(cgroup: Path | None = None) -> int:
    """CPU cores this process may use: those it may run on (a taskset or a container's cpuset
    may allow fewer than exist), and no more than a container's CPU quota, rounded down, at
    least 1. Docker's ``--cpus=2`` or a Kubernetes limit of 2 CPUs leaves every host core in
    the affinity mask and sets a quota instead: without it, 2 CPUs of time would be shared by
    as many threads as the host has cores."""
    allowed = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    allowed = allowed or os.cpu_count() or 1
    quota = cpu_quota(CGROUP if cgroup is None else cgroup)
    return max(1, min(allowed, math.floor(quota))) if quota is not None else allowed


def cpu_quota(cgroup: Path) -> float | None:
    """CPUs of time a container's cgroup allows per period, or None when it sets no quota:
    cgroup v2's ``cpu.max`` ("200000 100000" is 2 CPUs, "max 100000" none), or v1's
    ``cpu.cfs_quota_us`` over ``cpu.cfs_period_us`` (-1: none). ``cgroup`` is where the
    hierarchy is mounted (``CGROUP``); inside a container it is the container's own."""
    v2 = cgroup / "cpu.max"
    v1 = [cgroup / name for name in ("cpu", "cpu,cpuacct", "cpuacct,cpu")]
    try:
        if v2.is_file():
            quota, period = v2.read_text().split()[:2]
        else:
            folder = next((f for f in v1 if (f / "cpu.cfs_quota_us").is_file()), None)
            if folder is None:
                return None
            quota = (folder / "cpu.cfs_quota_us").read_text().strip()
            period = (folder / "cpu.cfs_period_us").read_text().strip()
        if quota in ("max", "-1") or int(period) <= 0:
            return None
        return int(quota) / int(period)
    except (OSError, ValueError):      # unreadable or unexpected: no quota known
        return None


def check_launch(world_size, timeout, backend: str, oversubscribe: bool,
                   names: tuple[str, str] = ("world_size", "timeout")) -> tuple[int, float]:
    """``(world_size, timeout)`` as int and float, or a ValueError naming the setting (under
    ``names``: a lab passes its flags' names)."""
    world_size = positive_int(names[0], world_size, what="the number of ranks")
    timeout = positive_number(names[1], timeout, most=MAX_TIMEOUT_S, example="600 (seconds)")
    limit = RANKS_PER_CORE * cores()
    if world_size > limit and not oversubscribe:
        raise ValueError(
            f"world_size={world_size} would start {world_size} processes on {cores()} CPU "
            f"core(s), more than {RANKS_PER_CORE} per core; use {names[0]} <= {limit}, or "
            f"pass oversubscribe=True if you really mean it")
    check_backend(backend)
    return world_size, timeout


def check_backend(backend: str) -> None:
    """NCCL without any GPU gets its own sentence (the general rule names a world size)."""
    if backend == "nccl" and device.gpu_count() == 0:
        raise ValueError("backend='nccl' needs GPUs, but no GPU is visible to torch here; "
                         "use backend='gloo' (CPU ranks) or backend='auto'")


def check_main_script() -> None:
    """A script read from standard input cannot launch: multiprocessing has every rank, cold
    or warm, re-import the caller's script from its file (``__main__.__file__``), and
    standard input has none, so each rank would die while starting."""
    if getattr(sys.modules.get("__main__"), "__file__", None) == "<stdin>":
        raise ValueError(
            "launch was called from a script read from standard input (python - or python < "
            "script.py): each rank, warm or cold, re-imports the caller's script from its "
            "file, and standard input has none; save the script to a file and run python "
            "script.py (or pass it with python -c)")


class _Pickler(cloudpickle.Pickler):
    """cloudpickle, refusing what belongs to this process: tensors on its device, and open
    files (cloudpickle would send a read-mode file's text as a copy, not the file)."""

    def reducer_override(self, obj):
        if isinstance(obj, io.IOBase):
            raise TypeError(f"an open file ({getattr(obj, 'name', type(obj).__name__)!r}) belongs "
                            f"to this process; pass its path and open it inside the function")
        if isinstance(obj, torch.Tensor) and obj.device.type != "cpu":
            raise TypeError(
                f"a tensor on {obj.device} (shape {tuple(obj.shape)}) belongs to this process; "
                f"pass it with .cpu() or build it inside the function")
        return super().reducer_override(obj)


def dumps(obj) -> bytes:
    """``obj`` by value (cloudpickle), as the ranks receive functions and return results."""
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buffer.getvalue()


def _parts(fn, args, kwargs):
    """(name, value) for what travels with ``fn``: its arguments, and the globals and closure
    cells it uses when it is sent by value (defined in a cell, a lambda, a nested function)."""
    for i, value in enumerate(args):
        yield f"argument {i + 1} ({type(value).__name__})", value
    for key, value in kwargs.items():
        yield f"keyword argument {key}= ({type(value).__name__})", value
    code = getattr(fn, "__code__", None)
    if code is None:
        return
    module_globals = getattr(fn, "__globals__", {})
    for name in code.co_names:
        if name in module_globals:
            value = module_globals[name]
            yield f"the global {name!r} ({type(value).__name__}) that it uses", value
    for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
        yield f"the variable {name!r} it closes over", cell.cell_contents


def pack(fn, args, kwargs) -> bytes:
    """``(fn, args, kwargs)`` as bytes the ranks can load, or a ValueError naming what cannot
    travel. Functions of importable modules travel by name, and each rank imports them."""
    if not callable(fn):
        raise ValueError(f"launch needs a function to run on each rank; got {fn!r}")
    try:
        return dumps((fn, args, kwargs))
    except Exception as exc:  # noqa: BLE001  (pickling errors come in many types)
        failure = exc
    name = getattr(fn, "__qualname__", repr(fn))
    culprit = "something it uses"
    for what, value in _parts(fn, args, kwargs):
        try:
            dumps(value)
        except Exception as inner:  # noqa: BLE001  (looking for the part that fails)
            culprit, failure = what, inner
            break
    # Chained to the pickler's own error: its traceback shows what failed to travel, and how
    raise ValueError(
        f"{name} cannot be sent to the ranks: {culprit} cannot be pickled ({failure}). Each "
        f"rank is a separate process: pass what it needs as plain values it can rebuild "
        f"from (a path, not an open file; CPU tensors, not GPU ones; no locks)") from failure
