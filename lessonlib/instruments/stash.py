"""Measure what a pipeline stage keeps for its backward pass: the activation stash.

What it teaches: between the forward and the backward of a micro-batch, a stage must keep
the tensors autograd saved (each Linear's input, each GeLU's input, ...). How many
micro-batches are "in flight" at once is what separates GPipe (all m) from 1F1B
(min(p - stage, m)). This meter counts it by measurement, not by bookkeeping: inside
``meter.forward()`` every tensor autograd saves is registered (through
``torch.autograd.graph.saved_tensors_hooks``) and unregistered when autograd frees it after
the backward. Parameters (which every stage holds anyway) are not counted, a tensor saved
twice counts once, and a micro-batch that is a view of the batch counts its own bytes. The
same meter wraps lessonlib's executor and PyTorch's ``PipelineStage``, so the two are
measured the same way, on CPU and on GPU alike.

Laptop:  ``python -m lessonlib.instruments.stash`` stashes three micro-batches of a Linear.
GPU box: the same.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn


class _Saved:
    """A saved tensor as autograd stores it; un-counted when autograd lets go of it."""

    __slots__ = ("tensor", "key", "group", "meter")

    def __init__(self, tensor, key, group, meter):
        self.tensor, self.key, self.group, self.meter = tensor, key, group, meter

    def __del__(self):
        self.meter._release(self.key, self.group)


class StashMeter:
    """Live and peak bytes and micro-batches of saved activations on this stage."""

    def __init__(self, params=()):
        self.skip = {p.untyped_storage().data_ptr() for p in params}
        self.refs: dict[tuple, int] = {}      # (address, bytes) -> saved references
        self.sizes: dict[tuple, int] = {}     # (address, bytes) -> bytes
        self.groups: dict[int, int] = {}      # forward call -> live saved references
        self.bytes = self.peak_bytes = 0
        self.peak_groups = 0
        self._next = 0

    def reset_peaks(self) -> None:
        self.peak_bytes, self.peak_groups = self.bytes, self.live

    @property
    def live(self) -> int:
        """Forward calls (micro-batch chunks) whose activations are still held."""
        return sum(1 for n in self.groups.values() if n > 0)

    @contextmanager
    def forward(self):
        """Count what autograd saves inside this block as one micro-batch's stash."""
        group, self._next = self._next, self._next + 1
        self.groups[group] = 0

        def pack(t):
            if t.untyped_storage().data_ptr() in self.skip:
                return t
            key = (t.data_ptr(), t.numel() * t.element_size())
            if self.refs.get(key, 0) == 0:
                self.sizes[key] = key[1]
                self.bytes += key[1]
                self.peak_bytes = max(self.peak_bytes, self.bytes)
            self.refs[key] = self.refs.get(key, 0) + 1
            self.groups[group] += 1
            self.peak_groups = max(self.peak_groups, self.live)
            return _Saved(t, key, group, self)

        def unpack(x):
            return x.tensor if isinstance(x, _Saved) else x

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            yield
        if self.groups[group] == 0:
            del self.groups[group]

    def _release(self, key, group):
        self.refs[key] -= 1
        if self.refs[key] == 0:
            self.bytes -= self.sizes.pop(key)
            del self.refs[key]
        self.groups[group] -= 1
        if self.groups[group] == 0:
            del self.groups[group]


class Metered(nn.Module):
    """``module`` with every forward's saved activations counted by ``meter``."""

    def __init__(self, module: nn.Module, meter: StashMeter | None = None):
        super().__init__()
        self.module = module
        self.meter = meter or StashMeter(module.parameters())

    def forward(self, *args, **kwargs):
        with self.meter.forward():
            return self.module(*args, **kwargs)


if __name__ == "__main__":
    layer = nn.Linear(256, 256)
    meter = StashMeter(layer.parameters())
    outs = []
    for _ in range(3):
        with meter.forward():
            outs.append(layer(torch.randn(64, 256)).relu())
    print(f"held: {meter.live} micro-batches, {meter.bytes:,} bytes")
    for out in outs:
        out.sum().backward()
    print(f"after the backwards: {meter.live} held; peak {meter.peak_groups}, "
          f"{meter.peak_bytes:,} bytes")
