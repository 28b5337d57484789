"""Activation memory measured, not estimated: the bytes autograd keeps for the backward pass.

What it teaches: a layer's "activations" are exactly the tensors autograd saves during the
forward pass so that the backward pass can run. PyTorch lets us see each of them as it is
saved (``torch.autograd.graph.saved_tensors_hooks``) and, by wrapping it, when autograd lets
go of it after the backward. ``ActivationMeter`` counts them both ways, on CPU and GPU alike:
``bytes``, all a forward left for its backward (recomputation and sequence parallelism are
judged by this number, on the axes of Korthikanti et al. 2022's Table 2), and ``live_bytes``
over time, with the number of forward blocks (micro-batches) still held: what separates a
pipeline's GPipe (all m held) from its 1F1B (min(p - stage, m)).

One rule for what a saved tensor costs: the elements of its storage it reaches, each byte
once. The input and a view of all of it (reshaped, transposed) cost the input once; q, k and
v cut from one projection cost that projection once; a micro-batch cut from the batch costs
its own rows, not the batch. Per storage: the bytes of each distinct view, and never more
than the byte range those views span together. The weights are left out (``exclude``): they
are memory of another kind.

Recomputation hides what it keeps from these hooks: ``torch.utils.checkpoint`` holds its
inputs itself (to run the function again in backward) and saves nothing inside. The course's
``checkpoint`` saves its inputs once more, through the hooks, so a meter counts exactly what
a checkpointed layer keeps (its input) and sees it let go in the backward.

Laptop:  ``python -m lessonlib.instruments.activations`` (three micro-batches of a Linear)
GPU box: the same; the meter only reads sizes and addresses, it moves nothing.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.utils.checkpoint
from torch import nn


@dataclass(frozen=True)
class _View:
    """The elements of a storage one saved tensor reaches: ``key`` names the set (a tensor,
    its transpose and its reshapes name the same one), ``bytes`` its size, ``span`` the byte
    range [first, end) it lies in."""
    storage: tuple
    key: tuple
    bytes: int
    span: tuple


def _view(t: torch.Tensor) -> _View:
    if hasattr(t, "to_local"):          # a DTensor: this rank's shard is what it keeps
        with torch.no_grad():
            t = t.to_local()
    size, first = t.element_size(), t.storage_offset() * t.element_size()
    storage = (t.device.type, t.device.index, t.untyped_storage().data_ptr())
    if t.numel() == 0:
        return _View(storage, (first, ()), 0, (first, first))
    dims = []                           # (stride, size), outermost first, contiguous runs merged
    for step, n in sorted(((st, n) for n, st in zip(t.shape, t.stride()) if n > 1 and st > 0),
                          reverse=True):
        if dims and dims[-1][0] == n * step:
            dims[-1] = (step, dims[-1][1] * n)
        else:
            dims.append((step, n))
    last = sum((n - 1) * step for step, n in dims)        # elements past the first
    return _View(storage, (first, tuple(dims)), math.prod(n for _, n in dims) * size,
                 (first, first + (last + 1) * size))


def _covered(spans) -> int:
    """Bytes the ``spans`` cover together, each byte once."""
    total = reached = 0
    for first, end in sorted(spans):
        total += max(0, end - max(first, reached))
        reached = max(reached, end)
    return total


@dataclass
class _Storage:
    """One storage seen saved: the first tensor saved from it, the views of it autograd still
    holds (key -> [references, view]), and the bytes they reach now and reached before."""
    shape: tuple                    # a DTensor: its global shape
    dtype: torch.dtype
    views: dict = field(default_factory=dict)
    held: int = 0
    freed: int = 0

    def reach(self) -> int:
        """Each distinct view's bytes, never more than the span the views cover together."""
        views = [view for _, view in self.views.values()]
        return min(sum(v.bytes for v in views), _covered(v.span for v in views))


class _Saved:
    """A saved tensor as autograd holds it; un-counted when autograd lets go of it."""

    __slots__ = ("tensor", "view", "group", "meter")

    def __init__(self, tensor, view, group, meter):
        self.tensor, self.view, self.group, self.meter = tensor, view, group, meter

    def __del__(self):
        self.meter._release(self)


class ActivationMeter:
    """What autograd saved for backward inside ``forward()`` blocks, weights left out:
    ``bytes`` in all (with ``tensors``, the storages in the order first saved), and
    ``live_bytes`` / ``live_groups`` still held now, with their peaks (since ``reset()``)."""

    def __init__(self, exclude=()):
        self.skip = {_view(p).storage for p in exclude}
        self.storages: dict[tuple, _Storage] = {}     # held now, by storage
        self.seen: list[_Storage] = []                # every storage, in the order first saved
        self.groups: dict[int, int] = {}              # forward block -> saved references held
        self.live_bytes = self.peak_bytes = self.peak_groups = self.freed = 0
        self._next = 0

    @property
    def bytes(self) -> int:
        """All bytes saved for backward, held now or let go since."""
        return self.live_bytes + self.freed

    @property
    def tensors(self) -> list[tuple]:
        """(shape, dtype, bytes) of each storage saved, in the order first saved."""
        return [(s.shape, s.dtype, s.held + s.freed) for s in self.seen]

    @property
    def live_groups(self) -> int:
        """Forward blocks (micro-batch chunks) whose saved tensors are still held."""
        return len(self.groups)

    def reset(self) -> None:
        """Count from now on (each step of a long run): what is held now is what was saved."""
        self.peak_bytes, self.peak_groups = self.live_bytes, self.live_groups
        self.seen, self.freed = list(self.storages.values()), 0
        for storage in self.seen:
            storage.freed = 0

    @contextmanager
    def forward(self):
        """Count what autograd saves inside this block as one group (one micro-batch)."""
        group, self._next = self._next, self._next + 1
        with torch.autograd.graph.saved_tensors_hooks(lambda t: self._pack(t, group),
                                                      _unpack):
            yield self

    def _pack(self, t: torch.Tensor, group: int):
        view = _view(t)
        if view.storage in self.skip:
            return t
        if view.storage not in self.storages:
            self.storages[view.storage] = _Storage(tuple(t.shape), t.dtype)
            self.seen.append(self.storages[view.storage])
        storage = self.storages[view.storage]
        storage.views.setdefault(view.key, [0, view])[0] += 1
        self._update(storage)
        self.groups[group] = self.groups.get(group, 0) + 1
        self.peak_groups = max(self.peak_groups, self.live_groups)
        return _Saved(t, view, group, self)

    def _release(self, saved: _Saved) -> None:
        view, storage = saved.view, self.storages[saved.view.storage]
        storage.views[view.key][0] -= 1
        if storage.views[view.key][0] == 0:
            del storage.views[view.key]
        self._update(storage)
        if not storage.views:           # its address may hold another storage next
            del self.storages[view.storage]
        self.groups[saved.group] -= 1
        if self.groups[saved.group] == 0:
            del self.groups[saved.group]

    def _update(self, storage: _Storage) -> None:
        held = storage.reach()
        storage.freed += max(0, storage.held - held)
        self.freed += max(0, storage.held - held)
        self.live_bytes += held - storage.held
        storage.held = held
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)


def _unpack(saved):
    return saved.tensor if isinstance(saved, _Saved) else saved


@contextmanager
def saved_bytes(exclude=()):
    """Count what autograd saves inside the ``with`` block (``.bytes``, ``.tensors``);
    ``exclude`` the weights (e.g. ``model.parameters()``), whose storages are not
    activations."""
    meter = ActivationMeter(exclude)
    with meter.forward():
        yield meter


class _Keep(torch.autograd.Function):
    """``out`` unchanged, with ``kept`` saved for backward where the hooks see them."""

    @staticmethod
    def forward(ctx, out, *kept):
        ctx.save_for_backward(*kept)
        ctx.kept = len(kept)
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad):
        return (grad,) + (None,) * ctx.kept


def checkpoint(fn, *args):
    """``torch.utils.checkpoint.checkpoint`` (non-reentrant): keep only ``args`` for backward
    and run ``fn`` again there; a running meter counts ``args`` as saved."""
    out = torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False)
    if not torch.is_grad_enabled():
        return out
    return _Keep.apply(out, *(a for a in args if isinstance(a, torch.Tensor)))


class Metered(nn.Module):
    """``module`` with every forward's saved activations counted by ``meter`` as one
    group (one micro-batch)."""

    def __init__(self, module: nn.Module, meter: ActivationMeter | None = None):
        super().__init__()
        self.module = module
        self.meter = meter or ActivationMeter(module.parameters())

    def forward(self, *args, **kwargs):
        with self.meter.forward():
            return self.module(*args, **kwargs)


if __name__ == "__main__":
    layer = nn.Linear(256, 256)
    meter = ActivationMeter(layer.parameters())
    outs = []
    for _ in range(3):
        with meter.forward():
            outs.append(layer(torch.randn(64, 256)).relu())
    print(f"held: {meter.live_groups} micro-batches, {meter.live_bytes:,} bytes")
    for out in outs:
        out.sum().backward()
    print(f"after the backwards: {meter.live_groups} held; peak {meter.peak_groups}, "
          f"{meter.peak_bytes:,} bytes; {meter.bytes:,} saved in all")
