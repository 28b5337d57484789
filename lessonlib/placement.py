"""Does a GPU run really compute on the GPU? An audit of where torch's compute happens.

What it teaches: a run can "work" on a GPU machine while part of it silently computes on
the CPU (a stage never moved, a batch left behind); nothing fails, it is only slow, and the
record still says GPU. With ``LESSONLIB_DEVICE_AUDIT=<folder>`` in the environment, every
rank that computes on a GPU (NCCL) watches torch's compute functions (``F.linear``,
``matmul``, ``embedding``, losses, ...) and, the first time one of them gets a tensor that
is not on the rank's ``current_device()``, writes one line naming the function and the
device into ``<folder>/<script>-rank<r>-<pid>.txt`` (``<script>``: the lab, e.g. ``pp``).
No file for a run means every compute call saw only the rank's own GPU.
``labs/gpu_check.py`` runs every lab this way.

Laptop:  nothing to see (CPU ranks compute on the CPU, their own device)
GPU box: ``LESSONLIB_DEVICE_AUDIT=/tmp/audit python labs/pp.py --world-size 1``, then
         ``ls /tmp/audit`` (empty: all on the GPU)
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode

from lessonlib.device import current_device

AUDIT_ENV = "LESSONLIB_DEVICE_AUDIT"
COMPUTE = {"linear", "embedding", "layer_norm", "matmul", "mm", "bmm", "addmm", "conv1d",
           "conv2d", "scaled_dot_product_attention", "cross_entropy", "mse_loss", "gelu",
           "softmax", "__matmul__"}
_started: list = []


class _OffDevice(TorchFunctionMode):
    def __init__(self, folder: Path):
        super().__init__()
        self.folder, self.reported = folder, False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.reported and getattr(func, "__name__", "") in COMPUTE and dist.is_initialized():
            here = current_device()
            if here.type == "cuda":
                for t in [*args, *kwargs.values()]:
                    if isinstance(t, torch.Tensor) and t.device != here:
                        self.report(f"{func.__name__} got a tensor on {t.device}, not {here}")
                        break
        return func(*args, **kwargs)

    def report(self, line: str) -> None:
        self.reported = True         # once per process: the first one says enough
        self.folder.mkdir(parents=True, exist_ok=True)
        script = Path(sys.argv[0]).stem or "python"     # spawned ranks keep the parent's argv
        name = f"{script}-rank{os.environ.get('RANK', '?')}-{os.getpid()}.txt"
        (self.folder / name).write_text(line + "\n")


def start_if_asked() -> bool:
    """Start the audit in this process when ``LESSONLIB_DEVICE_AUDIT`` names a folder."""
    folder = os.environ.get(AUDIT_ENV)
    if folder and not _started:
        mode = _OffDevice(Path(folder))
        mode.__enter__()             # for the rest of the process: it ends with the rank
        _started.append(mode)
    return bool(_started)


def findings(folder: Path, script: str = "*") -> list[str]:
    """What the ranks of ``script``'s runs reported into ``folder`` (empty: all on-device)."""
    return sorted(f"{p.stem}: {p.read_text().strip()}"
                  for p in Path(folder).glob(f"{script}-rank*.txt"))
