"""Activation memory measured, not estimated: the bytes autograd keeps for the backward pass.

What it teaches: a layer's "activations" are exactly the tensors autograd saves during the
forward pass so that the backward pass can run. PyTorch lets us see each of them as it is
saved (``torch.autograd.graph.saved_tensors_hooks``); this meter adds up their bytes, each
storage once (a tensor and its views share one block of memory), and leaves out the weights,
which are memory of another kind. Recomputation and sequence parallelism are judged by this
number, on the same axes as the formulas of Korthikanti et al. 2022 (Table 2).

Recomputation hides what it keeps from these hooks: ``torch.utils.checkpoint`` holds its
inputs itself (to run the function again in backward) and saves nothing inside. The course's
``checkpoint`` tells every running meter about those inputs, so a checkpointed layer counts
exactly what it keeps: its input, each storage once.

Laptop:  ``python -c "import torch; from lessonlib.instruments.activations import saved_bytes; \\
          x = torch.randn(4, 8, requires_grad=True); \\
          m = saved_bytes().__enter__(); (x.sin() * 2).sum(); print(m.bytes)"``
GPU box: the same on a CUDA tensor; the meter only reads sizes, it moves nothing.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.utils.checkpoint

_METERS: list = []      # the meters running now, innermost last


def _storage_key(t: torch.Tensor) -> tuple:
    if hasattr(t, "to_local"):          # a DTensor: this rank's shard is what it keeps
        with torch.no_grad():
            t = t.to_local()
    storage = t.untyped_storage()
    return (t.device.type, t.device.index, storage.data_ptr(), storage.nbytes())


@dataclass
class SavedBytes:
    """What one forward pass left for its backward: ``bytes`` in all, and ``tensors`` as
    (shape, dtype, bytes of its storage) for each storage the first time it was saved."""
    skip: set = field(default_factory=set)
    seen: dict = field(default_factory=dict)
    tensors: list = field(default_factory=list)

    @property
    def bytes(self) -> int:
        return sum(self.seen.values())

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        key = _storage_key(t)
        if key not in self.skip and key not in self.seen:
            self.seen[key] = key[3]
            self.tensors.append((tuple(t.shape), t.dtype, key[3]))    # a DTensor: global shape
        return t

    def keep(self, tensors) -> None:
        """Count ``tensors`` as kept for backward (what a checkpoint holds as its input)."""
        for t in tensors:
            if isinstance(t, torch.Tensor):
                self.pack(t)


def checkpoint(fn, *args):
    """``torch.utils.checkpoint.checkpoint`` (non-reentrant): keep only ``args`` for backward
    and run ``fn`` again there; every running meter counts ``args`` as kept."""
    if torch.is_grad_enabled():
        for meter in _METERS:
            meter.keep(args)
    return torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False)


@contextmanager
def saved_bytes(exclude=()):
    """Count the bytes autograd saves inside the ``with`` block; ``exclude`` the weights
    (e.g. ``model.parameters()``), whose storages are not activations."""
    meter = SavedBytes(skip={_storage_key(p) for p in exclude})
    _METERS.append(meter)
    try:
        with torch.autograd.graph.saved_tensors_hooks(meter.pack, lambda t: t):
            yield meter
    finally:
        _METERS.remove(meter)
