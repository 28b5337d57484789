"""ZeRO stages 2 and 3 as FSDP does them: weights held as shards, gathered one unit at a time.

What it teaches: with the weights sharded too, a rank holds 1/d of everything at rest and
borrows one unit's full weights at a time. ``FullyShardedDataParallel`` has the semantics of
FSDP2's ``fully_shard`` (Zhao et al., VLDB 2023):

* every parameter is cut along dim 0 into d shards of ceil(rows/d) rows, zero-padded
  (``sharded.row_shard``), and the module's parameters *are* this rank's shards, so an
  optimizer built on ``.parameters()`` steps only the shard;
* a unit is a direct child of the module (a ``ModuleList`` or ``ModuleDict`` counts as its
  children). Just before a unit's forward, one all-gather rebuilds its full weights;
  parameters held directly by the module, or shared by two units (an embedding tied to the
  output head), form the root unit, gathered for the whole forward;
* ``reshard_after_forward=True`` (ZeRO-3): after its forward the unit's full weights are
  freed. Autograd would keep the ones backward needs alive, so a saved-tensor hook keeps a
  note instead, and the unit is gathered again when the gradient reaches its output.
  ``False`` (ZeRO-2): what backward needs stays alive, one gather per step;
* each unit's backward ends with one reduce-scatter of its gradients (asynchronous, waited
  for at the end of backward), so every rank keeps only its averaged gradient shard;
* ``prefetch``: while a unit computes, the next unit's gather is already on its way (the
  forward order of the last step; backward walks it in reverse), as FSDP2 does;
* ``compute_dtype=torch.bfloat16`` gathers, computes and reduces in bf16 (FSDP2's
  ``MixedPrecisionPolicy(param_dtype=torch.bfloat16)``); shards and optimizer stay fp32.

Per rank and step each all-gather and the reduce-scatter send (n-1)/n x S: 2(n-1)/n x S at
stage 2 (an all-reduce's), 3(n-1)/n x S at stage 3 (ZeRO §7.2.2: 1.5x).

Laptop:  ``python labs/zero.py --world-size 2``
GPU box: ``torchrun --nproc-per-node 8 labs/zero.py`` (NCCL)
"""
from __future__ import annotations

import functools
from contextlib import nullcontext

import torch
from torch import nn

from lessonlib import comm
from lessonlib.data_parallel.collectives import group_ranks
from lessonlib.data_parallel.fsdp_units import (GatherUnit, Note, Slot, Unit, check_arguments,
                                                places_of, tensors_in, unit_modules)
from lessonlib.data_parallel.ladder import queue_end_of_backward, replicate
from lessonlib.data_parallel.sharded import (optimizer_state_bytes, row_shard, shard_rows,
                                             tensor_bytes)

class FullyShardedDataParallel(nn.Module):
    """Shard ``module`` over ``group``: ZeRO-3 with ``reshard_after_forward=True``, ZeRO-2
    with False (see the module docstring). Call the wrapper, not ``.module``: the wrapper
    gathers the root unit and sets up ZeRO-3's saved-tensor hooks."""

    def __init__(self, module: nn.Module, reshard_after_forward: bool = True,
                 compute_dtype: torch.dtype | None = None, group=None, prefetch: bool = True):
        params = check_arguments(module, reshard_after_forward, compute_dtype)
        me, members = group_ranks(group)                   # raises before any message
        super().__init__()
        self.module = replicate(module, group)             # rank 0's weights everywhere
        self.group, self.rank, self.world_size = group, me, len(members)
        self.reshard_after_forward = reshard_after_forward
        self.compute_dtype = compute_dtype or params[0].dtype
        self.prefetch = prefetch
        self._notes: dict[int, list] = {}     # storage pointer -> the gathered weights in it
        self._order: list[Unit] = []          # the units in the order the last forward ran
        self._seen: list[Unit] = []
        self._finishing: list = []            # reduce-scatters to wait for at backward's end
        self._queued = False
        self.units, self.root = self._shard(module)
        self._hooks = []
        for unit, child in self.units:
            self._hooks.append(child.register_forward_pre_hook(functools.partial(self._pre, unit)))
            self._hooks.append(child.register_forward_hook(functools.partial(self._post, unit)))

    # ------------------------------------------------------------ sharding at wrap time
    @torch.no_grad()
    def _shard(self, module: nn.Module):
        places = places_of(module)
        units = [(Unit(name), child) for name, child in unit_modules(module)]
        inside = [{id(m) for m in child.modules()} for _, child in units]
        root = Unit("")
        owners: dict[int, Unit] = {}
        for p in module.parameters():
            holders = [i for i, ids in enumerate(inside)
                       if all(id(m) in ids for m, _, _ in places[id(p)])]
            owners[id(p)] = units[holders[0]][0] if len(holders) == 1 else root
        offsets: dict[int, list[int]] = {}
        for p in module.parameters():
            unit = owners[id(p)]
            offset, grad_offset = offsets.setdefault(id(unit), [0, 0])
            shard = nn.Parameter(row_shard(p.detach(), self.rank, self.world_size),
                                 requires_grad=p.requires_grad)          # (c, ...)
            held = places[id(p)]
            unit.slots.append(Slot(p.shape, shard_rows(p.shape, self.world_size), offset,
                                    grad_offset if p.requires_grad else None, shard,
                                    [(m, a) for m, a, _ in held], [n for _, _, n in held]))
            offsets[id(unit)] = [offset + shard.numel(),
                                 grad_offset + (shard.numel() if p.requires_grad else 0)]
        for unit in [root, *(u for u, _ in units)]:
            self._put(unit, [s.shard for s in unit.slots])
        return [(u, child) for u, child in units if u.slots], root

    @staticmethod
    def _put(unit: Unit, tensors) -> None:
        """Make the module hold ``tensors`` (full weights, or the shards) in every place."""
        for slot, t in zip(unit.slots, tensors):
            for m, attr in slot.places:
                m._parameters[attr] = t

    # ------------------------------------------------------------ the two collectives
    @torch.no_grad()
    def _launch_gather(self, unit: Unit, dtype: torch.dtype | None = None):
        """Start one unit's all-gather; returns what waits for it and cuts the weights out."""
        dtype = dtype or self.compute_dtype
        mine = unit.flat_shard(dtype)                                            # (S,)
        rows = mine.new_empty(self.world_size, mine.numel())                     # (d, S)
        work = None
        if self.world_size > 1:
            work = comm.all_gather_into_tensor(rows.view(-1), mine, group=self.group,
                                               async_op=True)
        else:
            rows[0] = mine

        def finish() -> list[torch.Tensor]:
            if work is not None:
                work.wait()
            return [slot.full_from(rows) for slot in unit.slots]
        return finish

    def _all_gather(self, unit: Unit) -> list[torch.Tensor]:
        """The unit's full weights: a prefetched gather if one is on its way, else one now."""
        pending, unit.pending = unit.pending, None
        return (pending or self._launch_gather(unit))()

    def _prefetch(self, unit: Unit, step: int) -> None:
        """Start the gather of the unit after ``unit`` (step 1: in forward order; -1: the
        one before it, which backward reaches next), so it travels while ``unit`` computes."""
        order = self._order
        if not self.prefetch or unit not in order:
            return
        i = order.index(unit) + step
        if 0 <= i < len(order) and order[i].pending is None and order[i].again is None:
            order[i].pending = self._launch_gather(order[i])

    @torch.no_grad()
    def _reduce_scatter(self, unit: Unit, grads) -> list[torch.Tensor | None]:
        unit.again = None                                  # ZeRO-3: backward is done with it
        d = self.world_size
        rows = unit.gradient_rows(grads, d, self.compute_dtype)                  # (d, S)
        if rows is None:                                   # a frozen unit
            return [None] * len(unit.slots)
        mine = rows.new_empty(rows.shape[1])                                      # (S,)
        work = None
        if d > 1:       # asynchronous: backward goes on with the units before this one
            work = comm.reduce_scatter_tensor(mine, rows.view(-1), group=self.group,
                                              async_op=True)
        else:
            mine.copy_(rows[0])

        def finish() -> None:
            if work is not None:
                work.wait()
            unit.add_gradient_shard(mine, d)
        self._queue_end_of_backward()
        self._finishing.append(finish)
        return [None] * len(unit.slots)      # the shards' gradients arrive in ``finish``

    def _queue_end_of_backward(self) -> None:
        if not self._queued:
            self._queued = True
            queue_end_of_backward(self._end_of_backward)

    def _drop_unused_gathers(self) -> None:
        """A prefetch the run did not use (a unit skipped) must not serve the next step's
        weights: every rank launched it, so wait for it, then drop it."""
        for unit in self._all_units():
            if unit.pending is not None:
                unit.pending()
            unit.pending = unit.again = None

    def _end_of_backward(self) -> None:
        """Wait for every reduce-scatter, drop gathers backward did not use."""
        for finish in self._finishing:
            finish()
        self._drop_unused_gathers()
        self._finishing, self._queued = [], False

    # ------------------------------------------------------------ around each unit
    def _gather_for_forward(self, unit: Unit) -> None:
        full = GatherUnit.apply(self, unit, *(s.shard for s in unit.slots))
        self._prefetch(unit, 1)
        self._seen.append(unit)
        unit.live = [full] if isinstance(full, torch.Tensor) else list(full)
        if self.reshard_after_forward:
            for i, t in enumerate(unit.live):       # one storage may hold several (d = 1)
                self._notes.setdefault(t.untyped_storage().data_ptr(), []).append(
                    (unit, i, t.storage_offset(), t.numel()))
        self._put(unit, unit.live)

    def _release_after_forward(self, unit: Unit, output) -> None:
        for t in unit.live or []:
            self._notes.pop(t.untyped_storage().data_ptr(), None)
        self._put(unit, [s.shard for s in unit.slots])
        unit.live = None       # ZeRO-3: freed; ZeRO-2: autograd keeps what backward needs
        if self.reshard_after_forward and torch.is_grad_enabled():
            # The gradient reaching the unit's output is the moment its backward starts.
            for t in tensors_in(output):
                if t.requires_grad:
                    t.register_hook(functools.partial(self._pre_backward, unit))

    def _pre_backward(self, unit: Unit, grad):
        if unit.again is None:
            self._queue_end_of_backward()
            unit.again = self._all_gather(unit)
            self._prefetch(unit, -1)
        return grad

    def _cast(self, args):
        return tuple(a.to(self.compute_dtype) if torch.is_tensor(a) and a.is_floating_point()
                     else a for a in args)

    def _pre(self, unit, _module, args):
        self._gather_for_forward(unit)
        return self._cast(args)

    def _post(self, unit, _module, _args, output):
        self._release_after_forward(unit, output)

    def _pack(self, t: torch.Tensor):
        start = t.storage_offset()
        for unit, i, first, numel in self._notes.get(t.untyped_storage().data_ptr(), []):
            if first <= start < first + numel:
                return Note(unit, i, t.shape, t.stride(), start - first)
        return t

    def _unpack(self, saved):
        if not isinstance(saved, Note):
            return saved
        self._pre_backward(saved.unit, None)               # gathered already, as a rule
        base = saved.unit.again[saved.index]
        return base.as_strided(saved.shape, saved.stride, base.storage_offset() + saved.offset)

    def forward(self, *args, **kwargs):
        self._seen = []
        if self.root.slots:
            self._gather_for_forward(self.root)
        hooks = (torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
                 if self.reshard_after_forward else nullcontext())
        output = None
        try:
            with hooks:
                output = self.module(*self._cast(args), **kwargs)
        finally:
            if self.root.slots:
                self._release_after_forward(self.root, output)
            self._order = self._seen       # the next forward prefetches in this order
            self._drop_unused_gathers()
        return output

    # ------------------------------------------------------------ what a rank holds
    def _all_units(self) -> list[Unit]:
        return [self.root, *(u for u, _ in self.units)]

    @torch.no_grad()
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The whole model's weights under the module's own names (a tied weight under each
        of its names, as ``state_dict()`` lists it), gathered on every rank."""
        out = {}
        for unit in self._all_units():
            if unit.slots:
                weights = self._launch_gather(unit, unit.slots[0].shard.dtype)()
                for slot, full in zip(unit.slots, weights):
                    out.update({name: full.clone() for name in slot.names})
        out.update({name: b.clone() for name, b in self.module.named_buffers()})
        order = list(self.module.state_dict(keep_vars=True))
        return {k: out[k] for k in order if k in out}

    def memory_bytes(self, optimizer=None) -> dict[str, int]:
        """Bytes this rank holds: ``weights`` (its shards), ``gathered`` (ZeRO-2: every
        full weight, in the compute dtype, kept from forward to backward; ZeRO-3: the
        largest unit, gathered one at a time), ``gradients`` (its gradient shards) and,
        given the optimizer, ``optimizer`` (its state for the shards)."""
        slots = [s for u in self._all_units() for s in u.slots]
        width = torch.empty(0, dtype=self.compute_dtype).element_size()
        per_unit = [sum(s.shape.numel() for s in u.slots) * width for u in self._all_units()]
        held = {"weights": tensor_bytes(s.shard for s in slots),
                "gathered": (sum(per_unit) if not self.reshard_after_forward
                             else per_unit[0] + max(per_unit[1:], default=0)),
                "gradients": tensor_bytes(s.shard.grad for s in slots),
                "optimizer": (optimizer_state_bytes(optimizer, [s.shard for s in slots])
                              if optimizer is not None else 0)}
        return {**held, "total": sum(held.values())}
