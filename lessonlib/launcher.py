"""Run one function on N ranks, safely, from a notebook cell, a script or torchrun.

What it teaches: a distributed program is N copies of the same function, told apart only
by their rank. ``launch`` starts those copies as CPU ranks (gloo) or one per GPU (NCCL),
joins them in a process group, and hands their return values back in rank order.

It is built on ``torch.multiprocessing.start_processes`` (spawn) and keeps the traps of
Jupyter + multiprocessing away from the student:

- the worker must live in an importable module (a notebook cell's function cannot reach a
  spawned child), and a clear error says so before any process starts;
- the rendezvous store is opened by the caller on 127.0.0.1 with a port the OS picks, so
  launches in a row or from two notebooks at once never collide;
- an exception in a rank is raised here, naming the rank, with its traceback; the other
  ranks are stopped and no child outlives the call (interrupting the kernel included);
- a hang ends at ``timeout`` with the last step each rank reported through ``progress``;
- each rank's prints go to a log, not the notebook; return values come back by value.

Laptop:  ``python -c "import lessonlib as L; print(L.launch(L.launcher.demo_rank_sum, 4))"``
GPU box: the same call uses NCCL when 4 GPUs are visible; under torchrun use ``run``.
"""
from __future__ import annotations

import os
import pickle
import sys
import tempfile
import threading
import traceback
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lessonlib import comm, device, placement
from lessonlib.breadcrumbs import PROGRESS_ENV, progress, read_steps

DEFAULT_TIMEOUT_S = 120.0
phase_times: dict[str, float] = {}  # this rank's wall-clock milestones (labs/launch_overhead.py)
_STARTUP_HINT = ("(nothing: it died while starting. From a script, call launch under "
                 "`if __name__ == '__main__':`, since each rank re-imports the script.)")


class RankError(RuntimeError):
    """A rank raised, crashed or was killed; ``rank`` says which."""

    def __init__(self, message: str, rank: int):
        super().__init__(message)
        self.rank = rank


class LaunchTimeout(TimeoutError):
    """The ranks did not finish in time; ``last_steps`` maps rank -> last reported step."""

    def __init__(self, message: str, last_steps: dict[int, str]):
        super().__init__(message)
        self.last_steps = last_steps


# ---------------------------------------------------------------- checks
def _check_world_size(world_size) -> None:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(
            f"world_size must be a positive integer (the number of ranks, e.g. 2 or 4); "
            f"got {world_size!r}"
        )


def _check_importable(fn, args, kwargs) -> None:
    main = sys.modules.get("__main__")
    interactive = not getattr(main, "__file__", None)
    name = getattr(fn, "__qualname__", repr(fn))
    if getattr(fn, "__module__", None) == "__main__" and interactive:
        raise ValueError(
            f"{name} is defined in the notebook (or an interactive session), so the ranks "
            f"cannot import it: each rank is a fresh Python process. Move it into a .py "
            f"module next to the notebook (or use a lessonlib function) and import it from there."
        )
    if "<locals>" in name or "<lambda>" in name:
        raise ValueError(
            f"{name} is a lambda or a function defined inside another function; ranks can "
            f"only run module-level functions. Define it at the top level of a .py module."
        )
    try:
        pickle.dumps((fn, args, kwargs))
    except Exception as exc:  # pickling errors come in many types
        raise ValueError(f"the function or its arguments cannot be sent to the ranks: {exc}") from exc


# ---------------------------------------------------------------- the rank side
def _to_cpu(value):
    """Results cross a process boundary by value; GPU tensors come back as CPU tensors."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return type(value)((k, _to_cpu(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_to_cpu(v) for v in value)
    return value


def _exit_with_parent(parent_pid: int) -> None:
    """Die when the caller dies (a killed kernel cannot clean up after itself)."""
    while True:
        if os.getppid() != parent_pid:
            os._exit(1)
        time.sleep(0.5)


def _rank_main(rank, fn, args, kwargs, world_size, backend, port, workdir, timeout, parent_pid):
    phase_times["entered"] = time.time()
    log = os.open(Path(workdir) / f"rank{rank}.log", os.O_WRONLY | os.O_CREAT, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    threading.Thread(target=_exit_with_parent, args=(parent_pid,), daemon=True).start()
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
                       "LOCAL_WORLD_SIZE": str(world_size), PROGRESS_ENV: workdir})
    if backend == "gloo":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    device.bind_device(backend)
    store = dist.TCPStore("127.0.0.1", port, world_size + 1, is_master=False,
                          timeout=timedelta(seconds=timeout))
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=timeout))
    placement.start_if_asked()
    phase_times["group_ready"] = time.time()
    try:
        progress("started")
        result = fn(*args, **kwargs)
        progress("returned")
    except BaseException:
        Path(workdir, f"rank{rank}.error").write_text(f"{time.time()}\n{traceback.format_exc()}")
        raise
    finally:
        dist.destroy_process_group()
    Path(workdir, f"rank{rank}.result").write_bytes(pickle.dumps(_to_cpu(result)))
    # The result is safe on disk: skip the interpreter's slow teardown of torch (about a
    # second per rank on a small CPU), which would otherwise dominate short launches.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# ---------------------------------------------------------------- the caller side
def _stop_all(processes) -> None:
    for p in processes:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 2.0
    for p in processes:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()


def _log_tail(workdir: Path, rank: int, lines: int = 15) -> str:
    path = workdir / f"rank{rank}.log"
    text = path.read_text(errors="replace").strip() if path.exists() else ""
    return "\n".join(text.splitlines()[-lines:])


def launch(fn, world_size: int, *args, backend: str = "auto",
           timeout: float = DEFAULT_TIMEOUT_S, **kwargs) -> list:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` ranks; return their results in rank order.

    Inside ``fn`` the process group is ready: use ``dist.get_rank()``, ``dist.get_world_size()``
    and ``lessonlib.device.current_device()``, exactly as under torchrun.
    """
    _check_world_size(world_size)
    if not (isinstance(timeout, (int, float)) and timeout > 0):
        raise ValueError(f"timeout must be a positive number of seconds; got {timeout!r}")
    _check_importable(fn, args, kwargs)
    backend = device.resolve_backend(backend, world_size)
    store = dist.TCPStore("127.0.0.1", 0, world_size + 1, is_master=True,
                          wait_for_workers=False, timeout=timedelta(seconds=timeout))
    with tempfile.TemporaryDirectory(prefix="lessonlib-") as tmp:
        workdir = Path(tmp)
        ctx = mp.start_processes(
            _rank_main, nprocs=world_size, join=False, start_method="spawn",
            args=(fn, args, kwargs, world_size, backend, store.port, tmp, timeout, os.getpid()))
        try:
            _wait(ctx, workdir, world_size, backend, timeout)
        finally:
            _stop_all(ctx.processes)
            del store
        return [pickle.loads((workdir / f"rank{r}.result").read_bytes())
                for r in range(world_size)]


def _wait(ctx, workdir: Path, world_size: int, backend: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    try:
        while not ctx.join(timeout=0.05, grace_period=1.0):
            if time.monotonic() > deadline:
                steps = read_steps(workdir, world_size)
                listing = "\n".join(f"  rank {r}: {s}" for r, s in steps.items())
                raise LaunchTimeout(
                    f"{world_size} {backend} ranks did not finish within timeout={timeout} s; "
                    f"all ranks were stopped. Last step each rank reported:\n{listing}\n"
                    f"A rank that never joins a collective leaves the others waiting; "
                    f"raise timeout= if the work is only slow.", steps)
    except mp.ProcessRaisedException as exc:
        raise _first_failure(workdir, world_size, exc) from None
    except mp.ProcessExitedException as exc:
        rank = exc.error_index
        how = f"signal {exc.signal_name}" if exc.signal_name else f"exit code {exc.exit_code}"
        raise RankError(f"rank {rank} of {world_size} died ({how}) without a Python traceback; "
                        f"the other ranks were stopped. Last lines it printed:\n"
                        f"{_log_tail(workdir, rank) or _STARTUP_HINT}", rank) from None


def _first_failure(workdir: Path, world_size: int, exc) -> RankError:
    """The rank that raised first is the cause; the others usually failed because it left."""
    errors = {exc.error_index: (float("inf"), exc.msg)}  # failed before reaching fn
    for rank in range(world_size):
        path = workdir / f"rank{rank}.error"
        if path.exists():
            stamp, _, text = path.read_text().partition("\n")
            errors[rank] = (float(stamp), text)
    rank = min(errors, key=lambda r: errors[r][0])
    others = sorted(set(errors) - {rank})
    after = (f" Rank(s) {others} failed after it, most likely because rank {rank} stopped."
             if others else "")
    return RankError(f"rank {rank} of {world_size} raised an exception; the other ranks were "
                     f"stopped.{after} Traceback from rank {rank}:\n{errors[rank][1]}", rank)


# ---------------------------------------------------------------- one entry for scripts
def under_torchrun() -> bool:
    """True when torchrun (or SLURM with a torchrun-like env) started this process."""
    return "TORCHELASTIC_RUN_ID" in os.environ or (
        "RANK" in os.environ and "WORLD_SIZE" in os.environ and PROGRESS_ENV not in os.environ)


def run(fn, world_size: int, *args, backend: str = "auto", **kwargs) -> list:
    """The labs' entry point: under torchrun, run ``fn`` on this rank and all-gather every
    rank's result; otherwise ``launch`` ``world_size`` local ranks. Same return either way."""
    if not under_torchrun():
        return launch(fn, world_size, *args, backend=backend, **kwargs)
    kwargs.pop("timeout", None)
    sharing = device.ranks_per_gpu_set(int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    backend = device.resolve_backend(backend, sharing)
    device.bind_device(backend)
    dist.init_process_group(backend)
    placement.start_if_asked()
    try:
        result = _to_cpu(fn(*args, **kwargs))
        gathered = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, result)
    finally:
        dist.destroy_process_group()
    return gathered


def is_main_process() -> bool:
    """Rank 0 under torchrun, or the single caller of ``launch``: the one that prints."""
    return int(os.environ.get("RANK", "0")) == 0 or not under_torchrun()


def demo_rank_sum() -> dict:
    """The smallest distributed program: every rank adds its rank into one all-reduce."""

    x = torch.tensor([float(dist.get_rank())], device=device.current_device())
    comm.all_reduce(x)
    return {"rank": dist.get_rank(), "world_size": dist.get_world_size(), "sum": x.item()}

