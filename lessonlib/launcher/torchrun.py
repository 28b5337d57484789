"""One entry for scripts: the same lab runs under ``python`` (local ranks) and torchrun/srun.

What it teaches: under torchrun every process already is a rank, started by torchrun's
elastic agent on each node; the script only joins the group and runs its share. The results
are gathered to rank 0, the only rank that prints: sending every rank's full result to every
rank would cost world_size times the traffic for nothing. The other ranks leave as soon as
their result is sent, so the code after ``run`` is rank 0's.

Laptop:  ``python labs/allreduce.py --world-size 4``
GPU box: ``torchrun --nproc-per-node 4 labs/allreduce.py``
"""
from __future__ import annotations

import faulthandler
import ipaddress
import os
import socket
import sys
from datetime import timedelta

import torch.distributed as dist

from lessonlib import device, gloo_cuda
from lessonlib.instruments import placement
from lessonlib.instruments.breadcrumbs import PROGRESS_ENV
from lessonlib.launcher import checks, local, rank


def under_torchrun() -> bool:
    """True when torchrun started this process (``TORCHELASTIC_RUN_ID``), or a launcher that
    sets ``LOCAL_RANK`` (or srun's ``SLURM_PROCID``) along with ``RANK`` and ``WORLD_SIZE``;
    never inside one of ``launch``'s own ranks."""
    env = os.environ
    if PROGRESS_ENV in env:
        return False
    return "TORCHELASTIC_RUN_ID" in env or (
        "RANK" in env and "WORLD_SIZE" in env and ("LOCAL_RANK" in env or "SLURM_PROCID" in env))


def loopback_store(timeout: float):
    """The rendezvous store when ``MASTER_ADDR`` is a loopback address and no torchrun agent
    hosts one: rank 0 hosts it, listening on loopback only (torch's own would listen on
    every interface), the other ranks connect to it. Else None: torch makes the store from
    the environment (torchrun's agent's, or one that other machines must reach)."""
    env = os.environ
    if env.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        return None
    host, port = env.get("MASTER_ADDR", ""), env.get("MASTER_PORT", "")
    try:
        address = socket.gethostbyname(host)
        if not ipaddress.ip_address(address).is_loopback or not port.isdigit():
            return None
    except (OSError, ValueError):
        return None
    world, wait = int(env["WORLD_SIZE"]), timedelta(seconds=timeout)
    if int(env["RANK"]) != 0:
        return dist.TCPStore(address, int(port), world, False, timeout=wait)
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((address, int(port)))
    listener.listen()
    return dist.TCPStore(address, int(port), world, True, timeout=wait,
                         master_listen_fd=listener.detach())


def run(fn, world_size: int, *args, backend: str = "auto", **kwargs) -> list:
    """The labs' entry point: under torchrun, run ``fn`` on this rank and gather every
    rank's result to rank 0, which gets the list in rank order while the other ranks leave;
    otherwise ``launch`` ``world_size`` local ranks. Rank 0 sees the same list either way.

    Under torchrun, let rank 0's script end the way the labs do (``labkit.emit``: flush,
    then ``os._exit``): Python's own teardown after ``destroy_process_group`` can abort the
    rank ("terminate called without an active exception") on a loaded machine."""
    if not under_torchrun():
        return local.launch(fn, world_size, *args, backend=backend, **kwargs)
    timeout = kwargs.pop("timeout", local.DEFAULT_TIMEOUT_S)
    checks.check_backend(backend)
    checks.check_launcher_env()
    # past the timeout, every thread's stack goes to stderr (the rank's log) and the rank ends
    faulthandler.dump_traceback_later(timeout, exit=True)
    sharing = device.ranks_per_gpu_set(int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    backend = device.resolve_backend(backend, sharing)
    device.bind_device(backend)
    # lazy mode on purpose: no device_id, so NCCL makes each communicator at its first
    # call (lessonlib.instruments.nccl_rules, rule 1); comm.barrier names the GPU instead
    store = loopback_store(timeout)
    joined = {"store": store, "rank": int(os.environ["RANK"]),
              "world_size": int(os.environ["WORLD_SIZE"])} if store else {}
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout), **joined)
    gloo_cuda.start_if_asked()
    placement.start_if_asked()
    try:
        result = rank.to_cpu(fn(*args, **kwargs))
        main = dist.get_rank() == 0
        gathered = [None] * dist.get_world_size() if main else None
        dist.gather_object(result, gathered, dst=0)
    finally:
        dist.destroy_process_group()
        faulthandler.cancel_dump_traceback_later()
    if not main:
        # Nothing left for this rank to do (only rank 0 prints); leave at once, as
        # labkit.emit does, rather than run the caller's code on a result it does not have.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return gathered


def is_main_process() -> bool:
    """Rank 0 under torchrun, or the single caller of ``launch``: the one that prints."""
    return not under_torchrun() or int(os.environ["RANK"]) == 0
