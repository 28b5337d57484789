"""The one place that talks to CUDA: which backend, which device, how to wait for it.

Everything else in lessonlib asks this module, so the same code runs on CPU ranks (gloo)
and on one GPU per rank (NCCL). Nothing here initializes CUDA in the calling process:
counting GPUs goes through ``torch.cuda.device_count()``, which does not create a context.

Laptop:  ``python -c "from lessonlib import device; print(device.resolve_backend('auto', 4))"``
GPU box: the same command prints ``nccl`` when at least 4 GPUs are visible.
"""
from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

BACKENDS = ("auto", "gloo", "nccl")


def gpu_count() -> int:
    """Visible GPUs, without initializing CUDA in this process."""
    return torch.cuda.device_count() if torch.backends.cuda.is_built() else 0


def resolve_backend(backend: str, world_size: int) -> str:
    """'auto' -> NCCL with one GPU per rank when enough GPUs are visible, else gloo."""
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not one of {BACKENDS}")
    if backend == "auto":
        return "nccl" if gpu_count() >= world_size else "gloo"
    if backend == "nccl" and gpu_count() < world_size:
        raise ValueError(
            f"backend='nccl' needs one GPU per rank: world_size={world_size} but "
            f"{gpu_count()} GPU(s) are visible; use backend='gloo' (CPU ranks) or "
            f"world_size <= {gpu_count()}"
        )
    return backend


def local_rank() -> int:
    """This process's index on its node (torchrun and lessonlib.launch both set LOCAL_RANK)."""
    return int(os.environ.get("LOCAL_RANK", dist.get_rank() if dist.is_initialized() else 0))


def current_device() -> torch.device:
    """The device this rank computes on: its own GPU under NCCL, the CPU under gloo."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", local_rank() % gpu_count())
    return torch.device("cpu")


def bind_device(backend: str) -> torch.device:
    """Pin this process to its GPU before the process group starts (NCCL only)."""
    if backend == "nccl":
        dev = torch.device("cuda", local_rank() % gpu_count())
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
