"""Resume on another layout: cut a checkpoint saved at one (t, c, p, d, e) into the shards of
another, one old shard and one slice at a time.

What it teaches: an allocation changes (8 GPUs this week, 2 the next), and a checkpoint is
only as useful as the layouts it can be loaded on. Every number a rank holds is an element
of one tensor of the full model, at a place the layout decides; ``shard_map`` writes that
down as boxes (a pure function of the layout and the rank), e.g. on t=2 rank 1 of a block

    "1.attn.qkv.weight" -> [("blocks.0.attn.q.weight", 0, 16, 32),
                            ("blocks.0.attn.k.weight", 0, 16, 32), (... v ...)]

and under FSDP or ZeRO-1 a range of rows or of flattened elements of those. Resharding is
then copies and no arithmetic: a new rank allocates its own tensors (weights, and each
optimizer state shaped like them: AdamW's two moments), then opens the old shards one after
another, skips those that hold nothing it still lacks, and copies each box where an old
box meets one of its own, slice into slice. So the weights and moments are equal, bit for
bit, on any layout, and the tensors it ends with are exactly those it trains with.

Memory per rank, bounded: its own new shard (weights and optimizer state) on its device,
plus a mask of one byte per element of it (which elements are filled: a checkpoint that
lacks a piece is named, never trained from zeros), plus one slice in flight. An old shard is
mapped, not read (``mmap``): its pages stay in the file and the operating system's cache,
and only the slices copied are read. No rank ever builds a full tensor of the model, nor
holds two old shards, so a model too big for one device reshards as it trains. Reading:
each old shard holding a needed box is hashed (1 MiB at a time) before it is mapped; the d
replicas of a piece are read once (the first one fills it). What changes is the sums'
order (t partial sums, d replicas): the loss curve continues to float rounding.

Why not ``torch.distributed.checkpoint`` (PyTorch's sharded format, which reshards the same
way: its metadata lists, for every named tensor, which chunk at which offset is in which
file)? Its planner reshards tensors that are DTensors (or ShardedTensors) with one named
source each; our tensor-parallel layers hold plain tensors, and the fused QKV weight on a
rank is three slices stacked, which is not one chunk of one tensor. We would have to write
this table anyway, to build DTensors from it; the course keeps its own small files (one
``torch.save`` per rank and a manifest with sizes and hashes, ``lessonlib.long_run.checkpoint``) and
the table in ``shard_map``, where a student can read it.

Laptop:  ``python labs/train.py --world-size 4 --cp 2 --layout t1p2d1 --shard zero1 --steps
         40 --checkpoint-dir results/ckpt``, then ``--world-size 4 --layout t1p2d2 --shard
         fsdp --steps 80``: it resumes at step 40 on the new layout.
GPU box: the same with ``torchrun --nproc-per-node 8 ... --layout t2p2d2``, then
         ``torchrun --nproc-per-node 4 ... --layout t2p1d2``.
"""
from __future__ import annotations

from pathlib import Path

import torch

from lessonlib import device
from lessonlib.grid_layout import ORDER, placements
from lessonlib.hybrid.layout_runs import step_losses
from lessonlib.long_run import checkpoint
from lessonlib.long_run.checkpoint_folder import MANIFEST
from lessonlib.models import GPTConfig
# The table of where each tensor sits lives beside.
from lessonlib.long_run.shard_map import Held, Layout, box_view, held, overlaps


def cut(full: dict[str, torch.Tensor], pieces: list) -> torch.Tensor:
    """One rank's stage tensor from full tensors: its pieces, concatenated (for tests and
    for checking a builder against ``placement``)."""
    return torch.cat([full[name].narrow(dim, start, stop - start)
                      for name, dim, start, stop in pieces], dim=pieces[0][1])


def open_mapped(found: dict, rank: int) -> dict:
    """Rank ``rank``'s shard of checkpoint ``found``, checked against its manifest's size and
    SHA-256 (hashed 1 MiB at a time), then mapped: its tensors stay in the file, on the CPU,
    and only the slices a caller copies are read."""
    path = Path(found["path"]) / f"rank_{rank:05d}.pt"
    want = (found.get("shards") or {}).get(path.name)
    if want is None:
        raise checkpoint.CheckpointError(f"{Path(found['path']) / MANIFEST} lists "
                                         f"no SHA-256 for {path.name}: unverified, so not loaded")
    if not path.exists():
        raise checkpoint.CheckpointError(f"{path} is missing (its manifest lists it)")
    if path.stat().st_size != want["bytes"] or checkpoint.file_sha256(path) != want["sha256"]:
        raise checkpoint.CheckpointError(f"{path} is damaged: its size or SHA-256 does not "
                                         f"match its manifest's ({want['bytes']:,} bytes)")
    return torch.load(path, map_location="cpu", weights_only=True, mmap=True)


def mismatch(found: dict) -> str | None:
    """What makes checkpoint ``found`` (a manifest with its ``path``) damaged beyond its
    hashes, or None: a layout that is not its world size, or shards that do not hold the
    tensors (shapes, in order) its layout places on them. Reads each shard's index only
    (``mmap``), not its tensors; for ``checkpoint.scan`` before any process starts."""
    manifest = Path(found["path"]) / MANIFEST
    if not {"layout", "model"} <= set(found["meta"]):
        return None                 # another run's settings: check_resume names the difference
    order = found["meta"].get("order", ORDER)
    if order != ORDER:              # intact, but laid out in an order this course retired
        return (f"{manifest} cannot be resumed: it was saved with the ranks in the order "
                f"{order!r}, not the course's one order {ORDER!r}; nothing in it was changed")
    try:
        layout = Layout.of(found["meta"])
        cfg = GPTConfig(**found["meta"]["model"])
    except (TypeError, ValueError) as exc:
        return f"{manifest} is damaged: its layout or model cannot be read ({exc})"
    if layout.world != found["world_size"]:
        return (f"{manifest} is damaged: its layout {found['meta']['layout']} has "
                f"{layout.world} ranks, its world_size says {found['world_size']}")
    for rank in range(layout.world):
        want = [tuple(h.shape) for h in held(layout, cfg, rank)["model"]]
        shard = Path(found["path"]) / f"rank_{rank:05d}.pt"
        try:
            model = torch.load(shard, map_location="cpu", weights_only=True, mmap=True)["model"]
            got = [tuple(tensor.shape) for tensor in model.values()]
        except Exception as exc:  # noqa: BLE001  (any unreadable shard is damage, named)
            return f"{shard} is damaged: it cannot be read as a shard ({type(exc).__name__})"
        if got != want:
            return (f"{manifest} is damaged: its layout {found['meta']['layout']} does not "
                    f"match {shard.name}, which holds other tensors than that layout places "
                    f"on rank {rank}")
    return None


def _empty(wanted: list[Held], dtype, where) -> list[torch.Tensor]:
    return [torch.zeros(h.shape, dtype=dtype, device=where) for h in wanted]


def _masks(wanted: list[Held], where) -> list[torch.Tensor]:
    """One flag per element to fill: False until copied; True where nothing is to come
    (FSDP's padding rows)."""
    masks = [torch.ones(h.shape, dtype=torch.bool, device=where) for h in wanted]
    for mask, h in zip(masks, wanted):
        for seg in h.segments:
            box_view(mask, seg, seg.box).fill_(False)
    return masks


def _lacking(wanted: list[Held], masks: list, had: list[Held]) -> list[tuple]:
    """(new index, old index, overlap) for every overlap of an old tensor with a new one
    that holds an element not yet filled: what this old shard is opened for."""
    return [(i, j, hit) for i, want in enumerate(wanted) for j, have in enumerate(had)
            for hit in overlaps(want, have) if not bool(box_view(masks[i], hit[0], hit[2]).all())]


def load(found: dict, cfg: GPTConfig, layout: Layout, rank: int, names: list[str],
         dtype: torch.dtype = torch.float32, where=None) -> dict:
    """Rank side: rank ``rank``'s state on ``layout`` from checkpoint ``found`` (saved on
    another layout): ``{"model": {names[i]: tensor}, "optimizer": {"state": ...}, "step",
    "losses"}``, its tensors on ``where`` (default: this rank's device). The loss history
    becomes one value per step (the global batch's mean)."""
    where = device.current_device() if where is None else where
    old, new = Layout.of(found["meta"]), held(layout, cfg, rank)
    stateful = found["meta"].get("optimizer", "adamw") != "sgd"     # SGD keeps no state
    params, param_masks = _empty(new["model"], dtype, where), _masks(new["model"], where)
    moment_masks = _masks(new["moments"], where) if stateful else []
    moments, scalars, last_coords, last_losses = {}, {}, [], []
    for old_rank, pl in enumerate(placements(old.d, old.p, old.t, None, old.c, old.e)):
        had = held(old, cfg, old_rank)
        todo = _lacking(new["model"], param_masks, had["model"])
        todo_moments = _lacking(new["moments"], moment_masks, had["moments"]) if stateful else []
        keeps_losses = (pl.pp, pl.tp) == (old.p - 1, 0)
        if not (todo or todo_moments or keeps_losses):
            continue
        shard = open_mapped(found, old_rank)                  # one old shard at a time
        if keeps_losses:                                      # the last stage keeps the losses
            last_coords.append(shard["coords"])
            last_losses.append(shard["losses"])
        tensors, states = list(shard["model"].values()), shard["optimizer"]["state"]
        for i, j, (mine, theirs, box) in todo:
            box_view(params[i], mine, box).copy_(box_view(tensors[j], theirs, box))
            box_view(param_masks[i], mine, box).fill_(True)
        for i, j, (mine, theirs, box) in todo_moments:
            for key, value in states[j].items():
                if value.dim() > 0:                           # a moment, shaped like its weight
                    if key not in moments:
                        moments[key] = _empty(new["moments"], dtype, where)
                    box_view(moments[key][i], mine, box).copy_(box_view(value, theirs, box))
            box_view(moment_masks[i], mine, box).fill_(True)
        for state in states.values():                         # AdamW's step count
            scalars.update({k: v.clone() for k, v in state.items() if v.dim() == 0})
        del shard, tensors, states                            # unmapped before the next one
    lacking = [f"{names[i]}" for i, mask in enumerate(param_masks) if not bool(mask.all())] + [
        f"the optimizer state of {i}" for i, mask in enumerate(moment_masks) if not bool(mask.all())]
    if lacking:
        raise checkpoint.CheckpointError(
            f"{found['path']} (layout {found['meta']['layout']}) holds no copy of parts of "
            f"{lacking[0]}: its shards do not cover the model; resume from another checkpoint")
    state = {i: {**{k: v.clone() for k, v in scalars.items()},
                 **{key: tensors[i] for key, tensors in moments.items()}}
             for i in range(len(new["moments"])) if moments or scalars}
    return {"model": dict(zip(names, params)), "optimizer": {"state": state},
            "step": found["step"],
            "losses": [[loss] for loss in step_losses(last_coords, last_losses)]}
