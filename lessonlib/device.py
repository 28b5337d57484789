"""The one place that talks to CUDA: which backend, which device, how to wait for it.

Everything else in lessonlib asks this module, so the same code runs on CPU ranks (gloo)
and on one GPU per rank (NCCL). Nothing here initializes CUDA in the calling process:
counting GPUs goes through ``torch.cuda.device_count()``, which does not create a context.

One more mode, named and asked for, never picked by accident: **the shared GPU**
(``LESSONLIB_SHARED_GPU=1`` with ``backend='gloo'``): every rank computes on ``cuda:0``
and the ranks talk over gloo. NCCL refuses two ranks on one GPU; gloo does not, so one GPU
runs the device code of every multi-rank path (``labs/gpu_check.py`` does; which
collectives gloo runs on CUDA tensors, and the detour for the others: ``gloo_cuda``).

Laptop:  ``python -c "from lessonlib import device; print(device.resolve_backend('auto', 4))"``
GPU box: the same command prints ``nccl`` when at least 4 GPUs are visible.
"""
from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

BACKENDS = ("auto", "gloo", "nccl")
SHARED_GPU_ENV = "LESSONLIB_SHARED_GPU"   # "1": gloo ranks all compute on cuda:0


def gpu_count() -> int:
    """Visible GPUs, without initializing CUDA in this process."""
    return torch.cuda.device_count() if torch.backends.cuda.is_built() else 0


def shared_gpu(env=None) -> bool:
    """The shared-GPU mode was asked for (``LESSONLIB_SHARED_GPU=1``) and a GPU is visible."""
    env = os.environ if env is None else env
    return env.get(SHARED_GPU_ENV) == "1" and gpu_count() > 0


def resolve_backend(backend: str, world_size: int) -> str:
    """'auto' -> NCCL with one GPU per rank when enough GPUs are visible, else gloo (always
    gloo in the shared-GPU mode, whose ranks share one GPU)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not one of {BACKENDS}")
    if backend == "auto":
        return "nccl" if gpu_count() >= world_size and not shared_gpu() else "gloo"
    if backend == "nccl" and gpu_count() < world_size:
        raise ValueError(
            f"backend='nccl' needs one GPU per rank: world_size={world_size} but "
            f"{gpu_count()} GPU(s) are visible; use backend='gloo' (CPU ranks) or "
            f"world_size <= {gpu_count()}"
        )
    return backend


def local_rank(env=None) -> int:
    """This process's index on its node: LOCAL_RANK (torchrun, lessonlib.launch), else
    SLURM_LOCALID (a bare ``srun`` task), else the global rank."""
    env = os.environ if env is None else env
    for name in ("LOCAL_RANK", "SLURM_LOCALID"):
        if env.get(name, "").isdigit():
            return int(env[name])
    return dist.get_rank() if dist.is_initialized() else 0


def ranks_per_gpu_set(local_world_size: int, env=None) -> int:
    """How many ranks of this node see the same GPUs as this process.

    Under torchrun (or srun without GPU binding) every rank of a node sees all its GPUs, so
    they need ``local_world_size`` of them. With ``srun --gpus-per-task`` or ``--gpu-bind``
    SLURM shows each task only its own GPU(s) (CUDA_VISIBLE_DEVICES per task), so one
    visible GPU is enough: its own. So is a task that sees exactly one GPU whatever the
    variables say (a cluster that binds GPUs to tasks by cgroups sets neither variable);
    tasks that share a node's single GPU must ask for ``--backend gloo``, since NCCL
    refuses two ranks on one GPU."""
    env = os.environ if env is None else env
    bound = env.get("SLURM_GPUS_PER_TASK") or env.get("SLURM_GPU_BIND")
    if "SLURM_PROCID" in env and (bound or gpu_count() == 1):
        return 1
    return local_world_size


_CPU = torch.device("cpu")
STAND_IN = torch.device("cpu", 0)  # the rank's "GPU" in a CPU test of where tensors live
_stand_in: list = []               # [STAND_IN] while ``placement`` runs that test


def current_device() -> torch.device:
    """The device this rank computes on: its own GPU under NCCL, ``cuda:0`` for every rank
    in the shared-GPU mode, the CPU under gloo (or, inside ``placement``'s CPU test,
    ``STAND_IN``: still the CPU, but told apart)."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        # One visible GPU (a SLURM task bound to its own) is index 0 whatever the local rank
        return torch.device("cuda", local_rank() % gpu_count())
    if dist.is_initialized() and shared_gpu():
        return torch.device("cuda", 0)
    return _stand_in[0] if _stand_in else _CPU


def barrier_device_ids() -> list[int] | None:
    """[this rank's GPU index] for ``dist.barrier`` under NCCL; None elsewhere (gloo)."""
    dev = current_device()
    nccl = dist.is_initialized() and dist.get_backend() == "nccl"
    return [dev.index] if nccl and dev.type == "cuda" else None


def bind_device(backend: str) -> torch.device:
    """Pin this process to its GPU before the process group starts: its own under NCCL,
    ``cuda:0`` in the shared-GPU mode (gloo); nothing to pin for CPU ranks."""
    if backend == "nccl" or (backend == "gloo" and shared_gpu()):
        dev = torch.device("cuda", local_rank() % gpu_count() if backend == "nccl" else 0)
        torch.cuda.set_device(dev)
        return dev
    return torch.device("cpu")


def synchronize(device: torch.device | None = None) -> None:
    """Wait for queued GPU work, so that a wall-clock time measures the work itself."""
    device = device or current_device()
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timer(device: torch.device | None = None) -> float:
    """time.perf_counter() after the device has caught up."""
    synchronize(device)
    return time.perf_counter()


def mark(device: torch.device | None = None):
    """A point in this rank's work: a recorded CUDA event on a GPU (it costs the queue
    nothing), ``time.perf_counter()`` on a CPU. Two marks make a span (``elapsed``)."""
    device = device or current_device()
    if device.type == "cuda":
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event
    return time.perf_counter()


def elapsed(start, end) -> float:
    """Seconds between two ``mark``s. On a GPU it waits for ``end`` to happen, so read spans
    after the work is done (one ``synchronize``), not while it is being queued."""
    if isinstance(start, float):
        return end - start
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def on_clock(marks: list) -> list:
    """``time.perf_counter()`` readings for ``mark``s: CPU marks already are; CUDA events are
    placed before a fresh one, after a single synchronize (spans between them are exact)."""
    if all(isinstance(m, float) for m in marks):
        return list(marks)
    now = torch.cuda.Event(enable_timing=True)
    now.record()
    torch.cuda.synchronize()
    t = time.perf_counter()
    return [m if isinstance(m, float) else t - m.elapsed_time(now) / 1e3 for m in marks]


def peak_memory_bytes(device: torch.device | None = None) -> int | None:
    """Peak allocated GPU memory on this rank; None on CPU, where torch keeps no such count."""
    device = device or current_device()
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return None


def reset_peak_memory(device: torch.device | None = None) -> None:
    """Start ``peak_memory_bytes`` afresh, to measure one phase on its own (no-op on CPU)."""
    device = device or current_device()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def describe(device: torch.device | None = None) -> str:
    """A short name for result files: 'cpu' or the GPU's product name."""
    device = device or current_device()
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return "cpu"


def rng_state(device: torch.device | None = None) -> torch.Tensor | None:
    """This rank's GPU random state (for checkpoints); None on CPU."""
    device = device or current_device()
    return torch.cuda.get_rng_state(device) if device.type == "cuda" else None


def set_rng_state(state: torch.Tensor | None, device: torch.device | None = None) -> None:
    """Restore what ``rng_state`` returned (nothing to do on CPU)."""
    device = device or current_device()
    if state is not None and device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
