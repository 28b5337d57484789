"""How ``FullyShardedDataParallel`` sees a module: units, and where each parameter lives.

What it teaches: FSDP gathers weights one *unit* at a time, so sharding a model starts with
cutting it into units (here the direct children, a ``ModuleList``'s children standing in for
it) and remembering every place that holds a parameter: a tied weight is held in two places
(an embedding and the output head) but sharded, gathered and stepped once. ``shard_units``
does the cut at wrap time; what happens to a unit during a step (gather, compute, free,
reduce-scatter) is in ``fsdp.py``, and ``post_gather`` posts the all-gather of the units'
flat shards that it and the FP8 gather (``precision.fsdp_float8``) share.

Laptop:  ``python labs/zero.py --world-size 2``
GPU box: ``torchrun --nproc-per-node 8 labs/zero.py`` (NCCL)
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from lessonlib import comm
from lessonlib.data_parallel.sharded import (optimizer_state_bytes, row_shard, shard_rows,
                                             tensor_bytes)


@dataclass
class Slot:
    """One distinct parameter of a unit: its shard and every place the module holds it."""
    shape: torch.Size
    rows: int                     # c = ceil(dim0 / d): rows of every shard
    offset: int                   # where its shard starts in the unit's flat shard
    grad_offset: int | None       # ... and in the unit's flat gradient shard (None: frozen)
    shard: nn.Parameter           # (c, *shape[1:])
    places: list[tuple[nn.Module, str]]
    names: list[str]

    @property
    def shard_numel(self) -> int:
        return self.shard.numel()

    def full_from(self, rows: torch.Tensor) -> torch.Tensor:
        """The parameter from the gathered (d, S) buffer's columns of this slot."""
        cols = rows[:, self.offset:self.offset + self.shard_numel]             # (d, c*row)
        shape = self.shape if len(self.shape) else torch.Size([1])
        return cols.reshape(-1, *shape[1:])[:shape[0]].view(self.shape)


@dataclass
class Unit:
    """What FSDP gathers, frees and reduce-scatters as one: a child module's parameters."""
    name: str
    slots: list[Slot] = field(default_factory=list)
    gathered: list[torch.Tensor] | None = None     # full weights, held during its forward
    regathered: list[torch.Tensor] | None = None   # gathered again for backward (ZeRO-3)
    prefetched: object = None                      # a gather on its way: call it to wait

    def hold(self, tensors) -> None:
        """Make the module hold ``tensors`` (full weights, or the shards) in every place."""
        for slot, t in zip(self.slots, tensors):
            for m, attr in slot.places:
                m._parameters[attr] = t

    def hold_shards(self) -> None:
        self.hold([s.shard for s in self.slots])

    def flat_shard(self, dtype: torch.dtype) -> torch.Tensor:
        """This rank's shards of the unit, one after another: what it sends to a gather."""
        return torch.cat([s.shard.detach().reshape(-1).to(dtype) for s in self.slots])

    def gradient_rows(self, grads, d: int, dtype: torch.dtype) -> torch.Tensor | None:
        """The reduce-scatter's input: row r holds the gradient rows shard r owns, for the
        trainable parameters (None if the unit has none). (d, S)"""
        trainable = [(s, g) for s, g in zip(self.slots, grads) if s.grad_offset is not None]
        if not trainable:
            return None
        size = sum(s.shard_numel for s, _ in trainable)
        rows = torch.zeros(d, size, dtype=dtype, device=trainable[0][0].shard.device)
        for s, g in trainable:
            if g is None:                                  # unused in this forward: zeros
                continue
            padded = g.new_zeros(d * s.shard_numel)
            padded[:g.numel()] = g.reshape(-1)
            rows[:, s.grad_offset:s.grad_offset + s.shard_numel] = padded.view(d, -1)
        return rows

    @torch.no_grad()
    def add_gradient_shard(self, summed: torch.Tensor, d: int) -> None:
        """Average the reduce-scatter's output over d and add it to the shards' gradients
        (adding is what lets gradients accumulate over several backwards)."""
        for s in self.slots:
            if s.grad_offset is None:
                continue
            g = summed[s.grad_offset:s.grad_offset + s.shard_numel].view_as(s.shard)
            g = g.to(s.shard.dtype) / d
            if s.shard.grad is None:
                s.shard.grad = g
            else:
                s.shard.grad.add_(g)


def unit_modules(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """The units: direct children, a ModuleList's or ModuleDict's children standing in for
    the container (it is never called, so it has no forward to hook)."""
    out = []
    for name, child in module.named_children():
        if isinstance(child, (nn.ModuleList, nn.ModuleDict)):
            out += [(f"{name}.{n}", c) for n, c in child.named_children()]
        else:
            out.append((name, child))
    return out


def places_of(module: nn.Module) -> dict[int, list[tuple[nn.Module, str, str]]]:
    """id(parameter) -> every (module, attribute, qualified name) that holds it."""
    places: dict[int, list] = {}
    for prefix, m in module.named_modules(remove_duplicate=False):
        for attr, p in m._parameters.items():
            if p is not None:
                name = f"{prefix}.{attr}" if prefix else attr
                if all(pm is not m or pa != attr for pm, pa, _ in places.get(id(p), [])):
                    places.setdefault(id(p), []).append((m, attr, name))
    return places


@torch.no_grad()
def shard_units(module: nn.Module, rank: int, d: int) -> tuple[list[tuple[Unit, nn.Module]], Unit]:
    """Cut ``module`` into units and swap every parameter for this rank's row shard: (the
    units that hold parameters, with their child modules; the root unit). A parameter
    belongs to the one unit holding all its places, else (tied across units) to the root."""
    places = places_of(module)
    units = [(Unit(name), child) for name, child in unit_modules(module)]
    inside = [{id(m) for m in child.modules()} for _, child in units]
    root, offsets = Unit(""), {}
    for p in module.parameters():
        holders = [i for i, ids in enumerate(inside)
                   if all(id(m) in ids for m, _, _ in places[id(p)])]
        unit = units[holders[0]][0] if len(holders) == 1 else root
        offset, grad_offset = offsets.setdefault(id(unit), [0, 0])
        shard = nn.Parameter(row_shard(p.detach(), rank, d), requires_grad=p.requires_grad)
        held = places[id(p)]                                                  # (c, ...)
        unit.slots.append(Slot(p.shape, shard_rows(p.shape, d), offset,
                               grad_offset if p.requires_grad else None, shard,
                               [(m, a) for m, a, _ in held], [n for _, _, n in held]))
        offsets[id(unit)] = [offset + shard.numel(),
                             grad_offset + (shard.numel() if p.requires_grad else 0)]
    for unit in [root, *(u for u, _ in units)]:
        unit.hold_shards()
    return [(u, child) for u, child in units if u.slots], root


def held_bytes(units: list[Unit], compute_dtype, reshard_after_forward: bool,
               optimizer=None) -> dict[str, int]:
    """Bytes a rank holds, ``units[0]`` being the root: see ``memory_bytes``."""
    slots = [s for u in units for s in u.slots]
    width = torch.empty(0, dtype=compute_dtype).element_size()
    per_unit = [sum(s.shape.numel() for s in u.slots) * width for u in units]
    held = {"weights": tensor_bytes(s.shard for s in slots),
            "gathered": (sum(per_unit) if not reshard_after_forward
                         else per_unit[0] + max(per_unit[1:], default=0)),
            "gradients": tensor_bytes(s.shard.grad for s in slots),
            "optimizer": (optimizer_state_bytes(optimizer, [s.shard for s in slots])
                          if optimizer is not None else 0)}
    return {**held, "total": sum(held.values())}


def post_gather(mine: torch.Tensor, group, world_size: int):
    """Post the all-gather of every rank's flat shard ``mine`` (S,) into rows (d, S):
    (rows, the handle to wait on, or None with one rank)."""
    rows = mine.new_empty(world_size, mine.numel())                               # (d, S)
    if world_size == 1:
        rows[0] = mine
        return rows, None
    return rows, comm.all_gather_into_tensor(rows.view(-1), mine, group=group, async_op=True)
