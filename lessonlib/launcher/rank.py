"""The rank side of a launch: what each of the N processes does from birth to its result.

What it teaches: a rank is a plain process that (1) learns its rank and the world size,
(2) meets the others through a rendezvous store, (3) joins a process group, (4) runs the
same function as every other rank and (5) hands its result back. Here the store is a file
in the launch's private folder (``FileStore``): on one machine nothing needs to listen on
the network, and gloo's own sockets are kept on the loopback interface.

Laptop:  ``python -c "import lessonlib as L; print(L.launch(L.launcher.demo_rank_sum, 4))"``
GPU box: the same call uses NCCL when 4 GPUs are visible.
"""
from __future__ import annotations

import faulthandler
import os
import pickle
import shutil
import signal
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from lessonlib import comm, device, gloo_cuda
from lessonlib.instruments import placement
from lessonlib.instruments.breadcrumbs import PROGRESS_ENV, progress
from lessonlib.launcher import checks, forkserver, reaper
from lessonlib.launcher.errors import STACK_SIGNAL

phase_times: dict[str, float] = {}  # this rank's wall-clock milestones (labs/launch_overhead.py)


def _loopback_interface() -> str | None:
    """The loopback interface's name ('lo' on Linux, 'lo0' on macOS), if there is one."""
    names = [name for _, name in socket.if_nameindex()] if hasattr(socket, "if_nameindex") else []
    return next((n for n in names if n.startswith("lo")), None)


def to_cpu(value):
    """Results cross a process boundary by value; GPU tensors come back as CPU tensors."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return type(value)((k, to_cpu(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(to_cpu(v) for v in value)
    return value


def _end_everything() -> None:
    """This rank and every process it started end now: those below it (it is a subreaper,
    ``reaper``), and those in its process group (where there is no subreaper)."""
    reaper.end_descendants([os.getpid()])
    os.killpg(os.getpgid(0), signal.SIGKILL)


def _exit_with_caller(caller_pid: int, workdir: str) -> None:
    """Die when the caller dies: a killed kernel cannot clean up after itself, so the rank
    removes the launch's folder and ends with everything it started. The parent is the
    caller (spawn) or the fork server, which ends as soon as the caller is gone."""
    parent = os.getppid()
    while True:
        try:
            os.kill(caller_pid, 0)
            gone = os.getppid() != parent
        except ProcessLookupError:
            gone = True
        if gone:
            shutil.rmtree(workdir, ignore_errors=True)
            _end_everything()
        time.sleep(0.2)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):   # the function closed it: its output is in the log
            pass


def _write(path: Path, data: bytes) -> None:
    """Whole or not at all: the caller reads the file as soon as the rank has ended."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def main(rank, payload, world_size, backend, workdir, timeout, caller_pid, environ):
    phase_times["entered"] = time.time()
    os.setpgid(0, 0)    # its own process group: whatever it starts is stopped with it,
    reaper.become_subreaper()   # even what leaves that group: its orphans stay below the rank
    forkserver.drop_alive_pipe()
    log = os.open(Path(workdir) / f"rank{rank}.log", os.O_WRONLY | os.O_CREAT, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    # a launch that times out asks each rank still running for its stacks (``local._wait``)
    faulthandler.register(STACK_SIGNAL, file=2, all_threads=True)
    threading.Thread(target=_exit_with_caller, args=(caller_pid, workdir), daemon=True).start()
    # A forked rank carries the environment of the server's birth: take the caller's now.
    os.environ.clear()
    os.environ.update(environ)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(workdir) / "torch-compile-cache"))
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
                       "LOCAL_WORLD_SIZE": str(world_size), PROGRESS_ENV: workdir})
    if (loopback := _loopback_interface()) is not None:
        os.environ.update(GLOO_SOCKET_IFNAME=loopback, NCCL_SOCKET_IFNAME=loopback)
    try:
        fn, args, kwargs = pickle.loads(payload)  # imports the worker's module, fresh from disk
        if backend == "gloo":
            torch.set_num_threads(max(1, checks.cores() // world_size))
        device.bind_device(backend)
        store = dist.FileStore(str(Path(workdir) / "store"), world_size)
        # lazy mode on purpose: no device_id, so NCCL makes each communicator at its first
        # call (lessonlib.instruments.nccl_rules, rule 1); comm.barrier names the GPU instead
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=timeout))
        gloo_cuda.start_if_asked()      # before the audit, which then sees the rank's tensors
        placement.start_if_asked()
        phase_times["group_ready"] = time.time()
        progress("started")
        result = fn(*args, **kwargs)
        progress("returned")
        # A rank whose function sends nothing could otherwise leave while a slower peer is
        # still connecting to it (gloo then fails that peer with "closed by peer").
        if dist.is_initialized():  # unless the function ended the group itself
            dist.barrier()
            dist.destroy_process_group()
        # By value, as the function came: an instance of a class defined in a cell or script
        _write(Path(workdir, f"rank{rank}.result"), checks.dumps(to_cpu(result)))
    except BaseException:
        _write(Path(workdir, f"rank{rank}.error"),
               f"{time.time()}\n{traceback.format_exc()}".encode())
        code = 1
    else:
        code = 0
    reaper.end_descendants([os.getpid()])   # what it started ends with it, in any session
    # The result is safe on disk: skip the interpreter's slow teardown of torch (about a
    # second per rank on a small CPU), which would otherwise dominate short launches.
    _flush()
    os._exit(code)


@dataclass(frozen=True)
class RankSum:
    """What ``demo_rank_sum`` returns on one rank: who it is, of how many, the sum it got."""
    rank: int
    world_size: int
    sum: float


def demo_rank_sum() -> RankSum:
    """The smallest distributed program: every rank adds its rank into one all-reduce."""
    x = torch.tensor([float(dist.get_rank())], device=device.current_device())
    comm.all_reduce(x)
    return RankSum(dist.get_rank(), dist.get_world_size(), x.item())
