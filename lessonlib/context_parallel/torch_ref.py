"""PyTorch's own context parallelism on the same inputs: the reference ours is measured against.

What it teaches: PyTorch ships context parallelism as
``torch.distributed.tensor.experimental.context_parallel(mesh, buffers=..., buffer_seq_dims=...)``:
inside the ``with`` block the buffers are sharded along the sequence (its own load-balanced
split under a causal mask) and ``scaled_dot_product_attention`` is dispatched to its CP
attention over the mesh, which all-gathers K and V by default (``_attention.py``:
``rotate_method: _RotateMethod = _RotateMethod.ALL_GATHER``; ``set_rotate_method("alltoall")``
rotates them rank to rank, as a ring does). It implements CP attention for the flash,
memory-efficient and cuDNN attention kernels only. On CPU ranks SDPA picks the CPU flash
kernel, for which no sharding rule is registered, so it stops with ``NotImplementedError``
(torch 2.13); ``torch_ring_attention`` reports that error in words instead of raising, and
the one-process SDPA stays the reference.

Laptop:  ``python -c "import lessonlib as L; from lessonlib.context_parallel import torch_ref; \\
          print(L.launch(torch_ref.demo, 2)[0])"``
GPU box: the same script on one GPU per rank runs PyTorch's CP attention (NCCL).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from lessonlib import device


@dataclass
class TorchRingAttention:
    """PyTorch's context-parallel attention: the full output, or, where it refused, why."""
    output: torch.Tensor | None = None
    error: str | None = None


def torch_ring_attention(q, k, v, causal: bool = True) -> TorchRingAttention:
    """Full (b, heads, s, head_dim) q, k, v, the same on every rank, attended with PyTorch's
    context parallelism over the whole world: the full output, or the error in words."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import context_parallel_unshard

    mesh = init_device_mesh(device.current_device().type, (dist.get_world_size(),))
    buffers = [t.clone() for t in (q, k, v)]
    try:
        with context_parallel(mesh, buffers=buffers, buffer_seq_dims=[2, 2, 2]):
            out = F.scaled_dot_product_attention(*buffers, is_causal=causal)
            (full,) = context_parallel_unshard(mesh, [out], [2])
        return TorchRingAttention(output=full.detach())
    except (NotImplementedError, RuntimeError) as exc:
        return TorchRingAttention(error=f"{type(exc).__name__}: {str(exc).splitlines()[0]}")


def demo() -> dict:
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 4, generator=gen).to(device.current_device()) for _ in "qkv")
    result = torch_ring_attention(q, k, v)
    if result.output is not None:
        reference = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return {"max_abs_error": (result.output - reference).abs().max().item()}
    return {"error": result.error}
