"""ZeRO stages 2 and 3 as FSDP does them: weights held as shards, gathered one unit at a time.

One job: one unit's life in a step (gather, compute, free, gather again, reduce-scatter) and
the wrapper that drives it; how the module is cut into units is ``fsdp_units``.

What it teaches: with the weights sharded too, a rank holds 1/d of everything at rest and
borrows one unit's full weights at a time. ``FullyShardedDataParallel`` has the semantics of
FSDP2's ``fully_shard`` (Zhao et al., VLDB 2023). Every parameter is cut along dim 0 into d
row shards, and the module's parameters *are* this rank's shards, so an optimizer built on
``.parameters()`` steps only the shard. A unit is a direct child of the module (how the
module is cut, and where each parameter lives: ``fsdp_units``). Each unit, each step:

1. **gather** (just before its forward): one all-gather rebuilds its full weights;
2. **compute** its forward with them;
3. **free** them (``reshard_after_forward=True``, ZeRO-3) as its forward ends; with False
   (ZeRO-2) what backward needs stays alive, one gather per step;
4. ZeRO-3: **gather again** when the gradient reaches the unit's output (its backward starts);
5. **reduce-scatter** its gradients as its backward ends (asynchronous, waited for at the
   end of backward), so every rank keeps only its averaged gradient shard.

``GatherUnit`` is steps 1 and 5 as autograd sees them: forward = all-gather, backward =
reduce-scatter. Parameters held by the module itself, or shared by two units (an embedding
tied to the output head), form the root unit, gathered for the whole forward. ``prefetch``:
while a unit computes, the next unit's gather is already on its way (the forward order of
the last step; backward walks it in reverse). ``overlap=False`` waits on every gather and
reduce-scatter at once (no prefetch): for a module whose compute runs collectives of its own
(TP, ring attention), so that no rank has NCCL work in flight on two communicators at once
(``lessonlib.instruments.nccl_inflight``). ``compute_dtype=torch.bfloat16`` gathers,
computes and reduces in bf16 (FSDP2's ``MixedPrecisionPolicy(param_dtype=torch.bfloat16)``).

Why a gathered weight must be found again in backward (ZeRO-3): to compute the gradient of
``x @ W.T``, autograd *saves* W (or a view of it, such as ``W.T``) during forward. A saved
tensor stays alive, so freeing the unit after its forward would free nothing. So, inside the
forward, a saved-tensor hook looks at every tensor autograd saves: if it lies in the memory
of a gathered weight (same storage; a view differs in shape, stride or start, so it is found
by its storage), the hook keeps a ``SavedWeight`` ticket instead (which unit, which weight,
and where in it). In backward, when autograd asks for the tensor back, the unit is gathered
again and the ticket is turned back into the same view of the fresh copy.

Per rank and step each all-gather and the reduce-scatter send (n-1)/n x S: 2(n-1)/n x S at
stage 2 (an all-reduce's), 3(n-1)/n x S at stage 3 (ZeRO §7.2.2: 1.5x).

Laptop:  ``python labs/zero.py --world-size 2``
GPU box: ``torchrun --nproc-per-node 8 labs/zero.py`` (NCCL)
"""
from __future__ import annotations

import functools
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import nn

from lessonlib import comm
from lessonlib.data_parallel.collectives import group_ranks
from lessonlib.data_parallel.fsdp_units import Unit, held_bytes, post_gather, shard_units
from lessonlib.data_parallel.ladder import queue_end_of_backward, replicate

__all__ = ["FullyShardedDataParallel", "GatherUnit", "SavedWeight"]


COMPUTE_DTYPES = (None, torch.float32, torch.bfloat16, torch.float16)


def check_arguments(module, reshard_after_forward, compute_dtype) -> list[nn.Parameter]:
    """Refuse what cannot be sharded, before any message; the module's parameters."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"FullyShardedDataParallel wraps an nn.Module; got {type(module)}")
    params = list(module.parameters())
    if not params:
        raise ValueError(f"FullyShardedDataParallel: the {type(module).__name__} to wrap "
                         f"has no parameters, so there is nothing to shard")
    if not isinstance(reshard_after_forward, bool):
        raise ValueError(f"reshard_after_forward must be True (ZeRO-3) or False (ZeRO-2); "
                         f"got {reshard_after_forward!r}")
    if compute_dtype not in COMPUTE_DTYPES:
        raise ValueError(f"compute_dtype={compute_dtype!r}: use one of {COMPUTE_DTYPES}")
    dtypes = {p.dtype for p in params}
    if len(dtypes) > 1 or not params[0].is_floating_point():
        raise ValueError(f"FullyShardedDataParallel needs one floating dtype for all "
                         f"parameters (a unit is gathered as one buffer); got {dtypes}")
    return params


def tensors_in(output) -> list[torch.Tensor]:
    """The tensors in a unit's output (a tensor, or a tuple, list or dict of them)."""
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, (tuple, list)):
        return [t for o in output for t in tensors_in(o)]
    if isinstance(output, dict):
        return [t for o in output.values() for t in tensors_in(o)]
    return []


class GatherUnit(torch.autograd.Function):
    """A unit's weights as autograd sees them. Forward: shards -> full weights (``fsdp``'s
    all-gather). Backward: full gradients -> gradient shards (``fsdp``'s reduce-scatter)."""

    @staticmethod
    def forward(ctx, fsdp, unit, *shards):
        ctx.fsdp, ctx.unit = fsdp, unit
        ctx.set_materialize_grads(False)
        return tuple(fsdp.all_gather(unit))

    @staticmethod
    def backward(ctx, *grads):
        return (None, None, *ctx.fsdp.reduce_scatter(ctx.unit, grads))


@dataclass(frozen=True)
class SavedWeight:
    """What the saved-tensor hook keeps instead of a gathered weight (ZeRO-3): a ticket."""
    unit: Unit
    index: int                    # which of the unit's weights
    shape: torch.Size
    stride: tuple
    offset: int                   # from the start of the weight, in its storage


class FullyShardedDataParallel(nn.Module):
    """Shard ``module`` over ``group``: ZeRO-3 with ``reshard_after_forward=True``, ZeRO-2
    with False (see the module docstring). Call the wrapper, not ``.module``: the wrapper
    gathers the root unit and sets up ZeRO-3's saved-tensor hooks."""

    def __init__(self, module: nn.Module, reshard_after_forward: bool = True,
                 compute_dtype: torch.dtype | None = None, group=None, prefetch: bool = True,
                 overlap: bool = True):
        params = check_arguments(module, reshard_after_forward, compute_dtype)
        me, members = group_ranks(group)                   # raises before any message
        super().__init__()
        self.module = replicate(module, group)             # rank 0's weights everywhere
        self.group, self.rank, self.world_size = group, me, len(members)
        self.reshard_after_forward = reshard_after_forward
        self.compute_dtype = compute_dtype or params[0].dtype
        self.prefetch, self.overlap = prefetch and overlap, overlap
        self._weights_in: dict[int, list] = {}  # storage address -> the gathered weights in it
        self._order: list[Unit] = []            # the units in the order the last forward ran
        self._seen: list[Unit] = []
        self._reduce_scatters: list = []        # to wait for at backward's end
        self._end_queued = False
        self.units, self.root = shard_units(module, self.rank, self.world_size)
        self._hooks = []
        for unit, child in self.units:
            self._hooks += [
                child.register_forward_pre_hook(functools.partial(self._before_forward, unit)),
                child.register_forward_hook(functools.partial(self._after_forward, unit))]

    # ------------------------------------------------------------ the two collectives
    @torch.no_grad()
    def _launch_gather(self, unit: Unit, dtype: torch.dtype | None = None):
        """Start one unit's all-gather; returns what waits for it and cuts the weights out."""
        mine = unit.flat_shard(dtype or self.compute_dtype)                      # (S,)
        rows, work = post_gather(mine, self.group, self.world_size)              # (d, S)

        def finish() -> list[torch.Tensor]:
            if work is not None:
                work.wait()
            return [slot.full_from(rows) for slot in unit.slots]
        return finish

    def all_gather(self, unit: Unit) -> list[torch.Tensor]:
        """The unit's full weights: a prefetched gather if one is on its way, else one now."""
        prefetched, unit.prefetched = unit.prefetched, None
        return (prefetched or self._launch_gather(unit))()

    def _prefetch(self, unit: Unit, step: int) -> None:
        """Start the gather of the unit after ``unit`` (step 1: in forward order; -1: the
        one before it, which backward reaches next), so it travels while ``unit`` computes."""
        order = self._order
        if not self.prefetch or unit not in order:
            return
        i = order.index(unit) + step
        if 0 <= i < len(order) and order[i].prefetched is None and order[i].regathered is None:
            order[i].prefetched = self._launch_gather(order[i])

    @torch.no_grad()
    def reduce_scatter(self, unit: Unit, grads) -> list[None]:
        """Start the unit's reduce-scatter (waited for at the end of backward, when each
        shard's ``.grad`` gets its averaged share); autograd gets no gradient from here."""
        unit.regathered = None                             # ZeRO-3: backward is done with it
        d = self.world_size
        rows = unit.gradient_rows(grads, d, self.compute_dtype)                  # (d, S)
        if rows is not None:                               # None: a frozen unit
            mine = rows.new_empty(rows.shape[1])                                  # (S,)
            work = None
            if d > 1:   # asynchronous: backward goes on with the units before this one
                work = comm.reduce_scatter_tensor(mine, rows.view(-1), group=self.group,
                                                  async_op=True)
                if not self.overlap:
                    work.wait()
            else:
                mine.copy_(rows[0])

            def finish() -> None:
                if work is not None:
                    work.wait()
                unit.add_gradient_shard(mine, d)
            self._queue_end_of_backward()
            self._reduce_scatters.append(finish)
        return [None] * len(unit.slots)

    # ------------------------------------------------------------ one unit's step
    def _gather_for_forward(self, unit: Unit) -> None:
        """1. gather: the module holds the full weights while the unit computes."""
        full = GatherUnit.apply(self, unit, *(s.shard for s in unit.slots))
        self._prefetch(unit, 1)
        self._seen.append(unit)
        unit.gathered = [full] if isinstance(full, torch.Tensor) else list(full)
        if self.reshard_after_forward:
            for i, t in enumerate(unit.gathered):   # one storage may hold several (d = 1)
                self._weights_in.setdefault(t.untyped_storage().data_ptr(), []).append(
                    (unit, i, t.storage_offset(), t.numel()))
        unit.hold(unit.gathered)

    def _free_after_forward(self, unit: Unit, output) -> None:
        """3. free: the module holds the shards again; ZeRO-3 arms step 4."""
        for t in unit.gathered or []:
            self._weights_in.pop(t.untyped_storage().data_ptr(), None)
        unit.hold_shards()
        unit.gathered = None   # ZeRO-3: freed; ZeRO-2: autograd keeps what backward needs
        if self.reshard_after_forward and torch.is_grad_enabled():
            # The gradient reaching the unit's output is the moment its backward starts.
            for t in tensors_in(output):
                if t.requires_grad:
                    t.register_hook(functools.partial(self._gather_for_backward, unit))

    def _gather_for_backward(self, unit: Unit, grad):
        """4. gather again (ZeRO-3), once per backward, and prefetch the unit before it."""
        if unit.regathered is None:
            self._queue_end_of_backward()
            unit.regathered = self.all_gather(unit)
            self._prefetch(unit, -1)
        return grad

    def _before_forward(self, unit, _module, args):
        self._gather_for_forward(unit)
        return self._cast(args)

    def _after_forward(self, unit, _module, _args, output):
        self._free_after_forward(unit, output)

    def _cast(self, args):
        return tuple(a.to(self.compute_dtype) if torch.is_tensor(a) and a.is_floating_point()
                     else a for a in args)

    # ------------------------------------------------------------ the saved-tensor hooks
    def _pack(self, t: torch.Tensor):
        """A tensor autograd saves: a ticket if it lies in a gathered weight, else itself."""
        start = t.storage_offset()
        for unit, i, first, numel in self._weights_in.get(t.untyped_storage().data_ptr(), []):
            if first <= start < first + numel:
                return SavedWeight(unit, i, t.shape, t.stride(), start - first)
        return t

    def _unpack(self, saved):
        """Backward asks for a saved tensor: a ticket becomes the view of the re-gathered weight."""
        if not isinstance(saved, SavedWeight):
            return saved
        self._gather_for_backward(saved.unit, None)        # gathered already, as a rule
        base = saved.unit.regathered[saved.index]
        return base.as_strided(saved.shape, saved.stride, base.storage_offset() + saved.offset)

    # ------------------------------------------------------------ the end of backward
    def _queue_end_of_backward(self) -> None:
        if not self._end_queued:
            self._end_queued = True
            queue_end_of_backward(self._end_of_backward)

    def _drop_unused_gathers(self) -> None:
        """A prefetch the run did not use (a unit skipped) must not serve the next step's
        weights: every rank launched it, so wait for it, then drop it."""
        for unit in self._all_units():
            if unit.prefetched is not None:
                unit.prefetched()
            unit.prefetched = unit.regathered = None

    def _end_of_backward(self) -> None:
        """Wait for every reduce-scatter, drop gathers backward did not use."""
        for finish in self._reduce_scatters:
            finish()
        self._drop_unused_gathers()
        self._reduce_scatters, self._end_queued = [], False

    # ------------------------------------------------------------ the whole forward
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
                self._free_after_forward(self.root, output)
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
        return held_bytes(self._all_units(), self.compute_dtype, self.reshard_after_forward,
                          optimizer)
