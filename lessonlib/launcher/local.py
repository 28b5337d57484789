"""``launch(fn, n)``: run one function on n local ranks and get their results in rank order.

What it teaches: a distributed program is N copies of the same function, told apart only by
their rank. The caller checks everything it can first, sends the function by value, starts
the ranks, then only watches: for a result from every rank, for the first rank that fails
(it is named, with its traceback), or for the timeout (each rank's last step is named).
Whatever happens, every rank and every process a rank started (in any session or process
group: ``reaper``) is stopped, and the launch's folder removed, before it returns.

Laptop:  ``python -c "import lessonlib as L; print(L.launch(L.launcher.demo_rank_sum, 4))"``
GPU box: the same call uses NCCL when 4 GPUs are visible; under torchrun use ``run``.
"""
from __future__ import annotations

import os
import pickle
import signal
import threading
import time
from pathlib import Path

from lessonlib import device
from lessonlib.launcher import checks, errors, folders, rank, reaper, starter

DEFAULT_TIMEOUT_S = 120.0
_POLL_S = 0.005  # a warm launch lasts about 0.1 s: look often, the check is a few syscalls
# The ranks of the launches running in this process (a notebook may launch from two threads):
# every other child of the fork server is an orphan it adopted from a rank.
_running: set[int] = set()
_starting = threading.Lock()


def launch(fn, world_size: int, *args, backend: str = "auto", timeout: float = DEFAULT_TIMEOUT_S,
           warm: bool = True, oversubscribe: bool = False, **kwargs) -> list:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` ranks; return their results in rank order.

    Inside ``fn`` the process group is ready: use ``dist.get_rank()``, ``dist.get_world_size()``
    and ``lessonlib.device.current_device()``, exactly as under torchrun. ``fn`` may be
    defined in a notebook cell: it travels by value with the globals it uses.
    ``warm=False`` spawns fresh interpreters instead of forking from the preloaded server;
    ``oversubscribe=True`` allows more than 8 ranks per CPU core.
    """
    world_size, timeout = checks.check_launch(world_size, timeout, backend, oversubscribe)
    checks.check_main_script()
    backend = device.resolve_backend(backend, world_size)
    payload = checks.pack(fn, args, kwargs)
    ctx = starter.context(warm)
    workdir = folders.new()
    processes = []
    try:
        for r in range(world_size):
            p = ctx.Process(target=rank.main, name=f"lessonlib-rank{r}",
                            args=(r, payload, world_size, backend, str(workdir), timeout,
                                  os.getpid(), dict(os.environ)))
            with _starting:         # counted before anyone looks for orphans
                p.start()
                _running.add(p.pid)
            processes.append(p)
        _wait(processes, workdir, backend, timeout)
        return [pickle.loads((workdir / f"rank{r}.result").read_bytes())
                for r in range(world_size)]
    finally:
        _stop_all(processes, workdir)
        folders.remove(workdir)
        folders.sweep()     # what a launch nested in a stopped rank left, say


def _wait(processes, workdir: Path, backend: str, timeout: float) -> None:
    """Return when every rank has left its result; raise at the first failure or timeout."""
    world_size, deadline = len(processes), time.monotonic() + timeout
    while True:
        codes = [p.exitcode for p in processes]
        # A rank that left its result has done its work, whatever its exit code says
        failed = {r: (time.time(), c) for r, c in enumerate(codes)
                  if c is not None and not (workdir / f"rank{r}.result").exists()}
        if failed:
            # The others are most likely failing because of it: give them a moment to say so.
            grace = time.monotonic() + 1.0
            while time.monotonic() < grace and any(p.exitcode is None for p in processes):
                time.sleep(0.02)
            for r, p in enumerate(processes):
                if r not in failed and p.exitcode not in (None, 0):
                    failed[r] = (time.time(), p.exitcode)
            raise errors.first_failure(workdir, world_size, failed)
        if all(c is not None for c in codes):
            return
        if time.monotonic() > deadline:
            _ask_for_stacks(processes, workdir)
            raise errors.timed_out(workdir, world_size, backend, timeout)
        time.sleep(_POLL_S)


def _ask_for_stacks(processes, workdir: Path, wait_s: float = 2.0) -> None:
    """Each rank still running writes its Python stacks into its log (``rank.main``
    registered ``faulthandler`` for ``errors.STACK_SIGNAL``); wait until all have, or
    ``wait_s``."""
    asked = []
    for r, p in enumerate(processes):
        if p.exitcode is None:
            try:
                os.kill(p.pid, errors.STACK_SIGNAL)
                asked.append(r)
            except ProcessLookupError:
                pass
    until = time.monotonic() + wait_s
    while time.monotonic() < until and not all(errors.dumped(workdir, r) for r in asked):
        time.sleep(0.02)


def _stop_all(processes, workdir: Path) -> None:
    """Stop every rank, then every process a rank started. A rank still running is frozen
    (it starts nothing more), what is below it ended (``reaper``), then it. A rank that ended
    without its result may have left orphans to the fork server: they end too. Each rank also
    leads its own process group (``rank.main``): where there is no subreaper, that is all."""
    live = [p for p in processes if p.exitcode is None]
    for p in live:
        try:
            os.kill(p.pid, signal.SIGSTOP)
        except ProcessLookupError:
            pass
    roots = [p.pid for p in live]
    if starter.server_pid() is not None and not all(
            (workdir / f"rank{r}.result").exists() for r in range(len(processes))):
        roots.append(starter.server_pid())
    ours = {p.pid for p in processes}
    with _starting:
        reaper.end_descendants(roots, spare=frozenset(_running - ours))
        _running.difference_update(ours)
    for p in live:
        p.kill()
    for p in processes:
        p.join()
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):   # no process left in it
            pass
