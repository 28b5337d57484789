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

import os
import sys

import torch.distributed as dist

from lessonlib import device, gloo_cuda
from lessonlib.instruments import placement
from lessonlib.instruments.breadcrumbs import PROGRESS_ENV
from lessonlib.launcher import checks, local, rank


def under_torchrun() -> bool:
    """True when torchrun (or SLURM with a torchrun-like env) started this process."""
    return "TORCHELASTIC_RUN_ID" in os.environ or (
        "RANK" in os.environ and "WORLD_SIZE" in os.environ and PROGRESS_ENV not in os.environ)


def run(fn, world_size: int, *args, backend: str = "auto", **kwargs) -> list:
    """The labs' entry point: under torchrun, run ``fn`` on this rank and gather every
    rank's result to rank 0, which gets the list in rank order while the other ranks leave;
    otherwise ``launch`` ``world_size`` local ranks. Rank 0 sees the same list either way.

    Under torchrun, let rank 0's script end the way the labs do (``labkit.emit``: flush,
    then ``os._exit``): Python's own teardown after ``destroy_process_group`` can abort the
    rank ("terminate called without an active exception") on a loaded machine."""
    if not under_torchrun():
        return local.launch(fn, world_size, *args, backend=backend, **kwargs)
    kwargs.pop("timeout", None)
    checks.check_backend(backend)
    sharing = device.ranks_per_gpu_set(int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    backend = device.resolve_backend(backend, sharing)
    device.bind_device(backend)
    # lazy mode on purpose: no device_id, so NCCL makes each communicator at its first
    # call (lessonlib.instruments.nccl_rules, rule 1); comm.barrier names the GPU instead
    dist.init_process_group(backend)
    gloo_cuda.start_if_asked()
    placement.start_if_asked()
    try:
        result = rank.to_cpu(fn(*args, **kwargs))
        main = dist.get_rank() == 0
        gathered = [None] * dist.get_world_size() if main else None
        dist.gather_object(result, gathered, dst=0)
    finally:
        dist.destroy_process_group()
    if not main:
        # Nothing left for this rank to do (only rank 0 prints); leave at once, as
        # labkit.emit does, rather than run the caller's code on a result it does not have.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return gathered


def is_main_process() -> bool:
    """Rank 0 under torchrun, or the single caller of ``launch``: the one that prints."""
    return int(os.environ.get("RANK", "0")) == 0 or not under_torchrun()
