"""Several ranks on one GPU over gloo: which collectives gloo runs on CUDA tensors, and the
CPU detour for the ones it does not.

What it teaches: NCCL refuses two ranks on one GPU, but gloo does not care where a tensor
lives for most collectives: it copies a CUDA tensor to pinned host memory, runs the
algorithm on the CPU and copies the result back (PyTorch's
``torch/csrc/distributed/c10d/ProcessGroupGloo.cpp``, its ``Async*CUDAWork`` classes, and
``ProcessGroupGlooCuda.cpp`` for the all-reduce; ``reduce_scatter_tensor`` is an all-reduce
of the whole input there, since torch 2.3). So in the shared-GPU mode
(``device.SHARED_GPU_ENV``) every rank computes on ``cuda:0`` and the collectives in
``ON_CUDA`` take its CUDA tensors as they are (the same classes are in torch 2.13's library).

Point-to-point is the exception: gloo's ``send`` and ``recv`` hand the tensor's address to
an unbound buffer of its TCP transport, with no CUDA path ("Gloo supports send/recv CPU
tensors only", a PyTorch maintainer on the PyTorch forums, June 2021; the same code in 2.13),
so a CUDA tensor there is read or written as if it were host memory. ``start_if_asked``
therefore routes ``CPU_DETOUR`` through the CPU on every rank of the shared-GPU mode: a
send copies its tensor to the CPU when it is posted, a receive lands in a CPU buffer that
``wait()`` copies onto the rank's tensor. ``batch_isend_irecv`` posts its ops through these
same ``isend``/``irecv``, so it goes the same way. The coalesced forms
(``all_gather_into_tensor_coalesced``) have no CUDA path either (pytorch/pytorch#152645);
lessonlib does not call them.

Laptop:  ``LESSONLIB_SHARED_GPU=1 LESSONLIB_STAND_IN_GPU=1 python labs/pp.py --world-size 2
         --backend gloo`` (the detour runs; the CPU is the stand-in GPU)
GPU box: ``LESSONLIB_SHARED_GPU=1 python labs/pp.py --world-size 4 --backend gloo``
"""
from __future__ import annotations

import functools
import os

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from lessonlib.device import SHARED_GPU_ENV

ON_CUDA = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor",
           "reduce_scatter_tensor", "all_to_all_single", "gather", "scatter", "reduce",
           "barrier")
CPU_DETOUR = ("send", "recv", "isend", "irecv")
NOTE = ("gloo runs all_reduce, broadcast, all_gather(_into_tensor), reduce_scatter_tensor "
        "(as an all-reduce), all_to_all_single, gather, scatter and reduce on CUDA tensors; "
        "send, recv, isend and irecv (so batch_isend_irecv) have no CUDA path in gloo "
        "(ProcessGroupGloo.cpp hands the tensor's address to its TCP transport), so in the "
        "shared-GPU mode they go through a CPU copy (lessonlib.gloo_cuda)")
_started: list = []


class _CopiedBack:
    """A receive's work whose ``wait()`` also copies the CPU buffer onto the rank's tensor."""

    def __init__(self, work, buffer: torch.Tensor, tensor: torch.Tensor):
        self.work, self.buffer, self.tensor = work, buffer, tensor

    def wait(self, *args, **kwargs):
        done = self.work.wait(*args, **kwargs)
        _land(self.tensor, self.buffer)
        return done

    def __getattr__(self, name):
        return getattr(self.work, name)


def _land(tensor: torch.Tensor, buffer: torch.Tensor) -> None:
    """Write what arrived into the rank's tensor as gloo itself would: bytes, not an op that
    autograd records (a pipeline stage receives into a leaf that requires grad)."""
    with torch.no_grad():
        tensor.copy_(buffer)


def _via_cpu(fn, name: str):
    receives = name in ("recv", "irecv")

    @functools.wraps(fn)
    def call(tensor, *args, **kwargs):
        # a send's copy is taken now, as it is posted; a receive's buffer is filled by gloo
        buffer = (torch.empty_like(tensor, device="cpu") if receives else
                  tensor.to("cpu", copy=True))
        out = fn(buffer, *args, **kwargs)
        if not receives:
            return out
        if name == "recv":
            _land(tensor, buffer)
            return out
        return None if out is None else _CopiedBack(out, buffer, tensor)
    return call


def start_if_asked() -> bool:
    """In the shared-GPU mode on gloo, send point-to-point through the CPU (see above). Runs
    before ``placement.start_if_asked``, whose checks then see the rank's own tensors."""
    if _started or os.environ.get(SHARED_GPU_ENV) != "1" or dist.get_backend() != "gloo":
        return bool(_started)
    for name in CPU_DETOUR:     # both namespaces: P2POp and batch_isend_irecv look in c10d
        detour = _via_cpu(getattr(c10d, name), name)
        setattr(c10d, name, detour)
        setattr(dist, name, detour)
    _started.append(True)
    return True
