"""Resume on another layout: where each rank's tensors sit in the full model, and how to cut
a checkpoint saved at one (t, p, d) into the shards of another.

What it teaches: an allocation changes (8 GPUs this week, 2 the next), and a checkpoint is
only as useful as the layouts it can be loaded on. Every tensor a rank holds is a piece of
one or more tensors of the full model, at a place the layout decides: ``placement`` writes
that down, a pure function of the model and (t, p, stage, TP rank), e.g. on t=2 rank 1 of a
block

    "1.attn.qkv.weight" -> [("blocks.0.attn.q.weight", 0, 16, 32),
                            ("blocks.0.attn.k.weight", 0, 16, 32), (... v ...)]

(full name, dim, start, stop; the pieces are concatenated along that dim). Resharding is then
two copies and no arithmetic: a new rank reads the old shards that hold a piece of what it
needs (one data-parallel replica is enough: the d replicas are equal), ``assemble``s those
full tensors, and ``cut``s its own pieces, for the weights and for each optimizer state of
the same shape (AdamW's two moments); so the weights and moments are equal, bit for bit,
on any layout.

Why not ``torch.distributed.checkpoint`` (PyTorch's sharded format, which reshards the same
way: its metadata lists, for every named tensor, which chunk at which offset is in which
file)? Its planner reshards tensors that are DTensors (or ShardedTensors) with one named
source each; our tensor-parallel layers hold plain tensors, and the fused QKV weight on a
rank is three slices stacked, which is not one chunk of one tensor. We would have to write
this placement table anyway, to build DTensors from it; the course keeps its own small files
(one ``torch.save`` per rank and a manifest with sizes and hashes, ``lessonlib.checkpoint``)
and keeps the table here, where a student can read it.

Laptop:  ``python labs/train.py --world-size 4 --layout t2p2d1 --steps 40 --checkpoint-dir
         results/ckpt``, then the same command with ``--world-size 2 --layout t1p1d2 --steps
         80``: it resumes at step 40 on the new layout.
GPU box: the same with ``torchrun --nproc-per-node 8 ... --layout t2p2d2``, then
         ``torchrun --nproc-per-node 4 ... --layout t2p1d2``.
"""
from __future__ import annotations

import functools
from pathlib import Path

import torch

from lessonlib import checkpoint
from lessonlib.grid import parse_layout
from lessonlib.hybrid import stage_counts, step_losses
from lessonlib.models import GPTConfig, TinyGPT

# How ``tensor_parallel.parallelize_block`` splits a transformer layer over t ranks: each
# tensor of the parallel layer that is made of slices of dense tensors, and the dim they are
# cut along (column-parallel: dim 0 of nn.Linear's (out, in) weight; row-parallel: dim 1).
# Every other tensor of the layer (LayerNorms, the row-parallel biases) is copied whole.
TP_SPLITS = {
    "attn.qkv.weight": (("attn.q.weight", "attn.k.weight", "attn.v.weight"), 0),
    "attn.qkv.bias": (("attn.q.bias", "attn.k.bias", "attn.v.bias"), 0),
    "attn.proj.weight": (("attn.proj.weight",), 1),
    "mlp.fc1.weight": (("mlp.fc1.weight",), 0),
    "mlp.fc1.bias": (("mlp.fc1.bias",), 0),
    "mlp.fc2.weight": (("mlp.fc2.weight",), 1),
}
_SPLIT_SOURCES = {source for sources, _ in TP_SPLITS.values() for source in sources}


@functools.lru_cache(maxsize=8)
def dense_shapes(cfg: GPTConfig) -> dict[str, torch.Size]:
    """The full model's tensor names and shapes (built once per shape of model)."""
    return {name: p.shape for name, p in TinyGPT(cfg).named_parameters()}


def placement(cfg: GPTConfig, t: int, p: int, pp_rank: int, tp_rank: int) -> dict[str, list]:
    """Each tensor of the rank at (pp_rank, tp_rank) of a (t, p) layout -> its pieces
    ``(full name, dim, start, stop)``, in the order ``hybrid.build_stage`` concatenates them."""
    shapes, counts = dense_shapes(cfg), stage_counts(cfg.layers, p)
    parts = ["embed", *(f"blocks.{i}" for i in range(cfg.layers)), "head"]
    first = sum(counts[:pp_rank])
    out = {}
    for i, part in enumerate(parts[first:first + counts[pp_rank]]):  # stage = Sequential(parts)
        block = part.startswith("blocks.")
        for local, (sources, dim) in (TP_SPLITS.items() if block else ()):
            out[f"{i}.{local}"] = []
            for source in sources:
                n = shapes[f"{part}.{source}"][dim] // t
                out[f"{i}.{local}"].append((f"{part}.{source}", dim, tp_rank * n, (tp_rank + 1) * n))
        for name, shape in shapes.items():
            inner = name[len(part) + 1:]
            if name.startswith(part + ".") and not (block and inner in _SPLIT_SOURCES):
                out[f"{i}.{inner}"] = [(name, 0, 0, shape[0])]
    return out


def _shape(shapes: dict, pieces: list) -> tuple[int, ...]:
    """The shape of the tensor ``cut`` makes from ``pieces``."""
    shape = list(shapes[pieces[0][0]])
    shape[pieces[0][1]] = sum(stop - start for _, _, start, stop in pieces)
    return tuple(shape)


def mismatch(found: dict) -> str | None:
    """What makes checkpoint ``found`` (a manifest with its ``path``) damaged beyond its
    hashes, or None: a layout that is not its world size, or shards that do not hold the
    tensors (names and shapes) its layout places on them. Reads each shard's index only
    (``mmap``), not its tensors; for ``checkpoint.scan`` before any process starts."""
    manifest = Path(found["path"]) / checkpoint.MANIFEST
    if not {"layout", "model"} <= set(found["meta"]):
        return None                 # another run's settings: check_resume names the difference
    try:
        t, p, d = parse_layout(found["meta"]["layout"])
        cfg = GPTConfig(**found["meta"]["model"])
    except (TypeError, ValueError) as exc:
        return f"{manifest} is damaged: its layout or model cannot be read ({exc})"
    if t * p * d != found["world_size"]:
        return (f"{manifest} is damaged: its layout {found['meta']['layout']} has {t * p * d} "
                f"ranks, its world_size says {found['world_size']}")
    shapes = dense_shapes(cfg)
    for rank in range(t * p * d):                      # rank = (dp * p + pp) * t + tp
        want = {name: _shape(shapes, pieces)
                for name, pieces in placement(cfg, t, p, rank // t % p, rank % t).items()}
        shard = Path(found["path"]) / f"rank_{rank:05d}.pt"
        try:
            model = torch.load(shard, map_location="cpu", weights_only=True, mmap=True)["model"]
            got = {name: tuple(tensor.shape) for name, tensor in model.items()}
        except Exception as exc:  # noqa: BLE001  (any unreadable shard is damage, named)
            return f"{shard} is damaged: it cannot be read as a shard ({type(exc).__name__})"
        if got != want:
            return (f"{manifest} is damaged: its layout {found['meta']['layout']} does not "
                    f"match {shard.name}, which holds other tensors than that layout places "
                    f"on rank {rank}")
    return None


def cut(full: dict[str, torch.Tensor], pieces: list) -> torch.Tensor:
    """One rank's tensor from full tensors: its pieces, concatenated."""
    return torch.cat([full[name].narrow(dim, start, stop - start)
                      for name, dim, start, stop in pieces], dim=pieces[0][1])


def assemble(full: dict, shapes: dict, pieces: list, tensor: torch.Tensor) -> None:
    """Write one rank's ``tensor`` back into the full tensors ``full`` (made as needed)."""
    dim = pieces[0][1]
    for (name, _, start, stop), part in zip(pieces, tensor.split(
            [stop - start for _, _, start, stop in pieces], dim=dim)):
        if name not in full:
            full[name] = torch.empty(shapes[name], dtype=tensor.dtype, device=tensor.device)
        full[name].narrow(dim, start, stop - start).copy_(part)


def load(found: dict, cfg: GPTConfig, t: int, p: int, pp_rank: int, tp_rank: int,
         names: list[str]) -> dict:
    """Rank side: this rank's shard of checkpoint ``found`` (a manifest, saved on another
    layout) for the (t, p) layout: ``{"model": state dict, "optimizer": {"state": ...}
    (keyed by the position in ``names``, the stage's parameter names in order), "step",
    "losses"}``. The loss history becomes one value per step (the global batch's mean)."""
    t0, p0, d0 = parse_layout(found["meta"]["layout"])
    wanted = placement(cfg, t, p, pp_rank, tp_rank)
    needed = {piece[0] for pieces in wanted.values() for piece in pieces}
    shapes, full, scalars, last = dense_shapes(cfg), {}, {}, []
    for old_rank in range(d0 * p0 * t0):                  # rank = (dp * p + pp) * t + tp
        dp0, pp0, tp0 = old_rank // (p0 * t0), old_rank // t0 % p0, old_rank % t0
        old = placement(cfg, t0, p0, pp0, tp0)
        holds = dp0 == 0 and needed & {piece[0] for pieces in old.values() for piece in pieces}
        if not holds and (pp0, tp0) != (p0 - 1, 0):
            continue
        shard = checkpoint.load(found["path"], old_rank, manifest=found)
        if (pp0, tp0) == (p0 - 1, 0):                     # the last stage keeps the losses
            last.append({"coords": shard["coords"], "losses": shard["losses"]})
        if not holds:
            continue
        order = list(shard["model"])        # a stage's state dict lists its parameters in order
        for local, tensor in shard["model"].items():
            assemble(full.setdefault("param", {}), shapes, old[local], tensor)
        for index, state in shard["optimizer"]["state"].items():
            for key, value in state.items():
                if value.shape == shard["model"][order[index]].shape:   # a moment, like the weight
                    assemble(full.setdefault(key, {}), shapes, old[order[index]], value)
                else:                                                   # AdamW's step count
                    scalars[key] = value
    model = {local: cut(full["param"], pieces) for local, pieces in wanted.items()}
    moments = [key for key in full if key != "param"]
    state = {i: {**{k: v.clone() for k, v in scalars.items()},
                 **{key: cut(full[key], wanted[name]) for key in moments}}
             for i, name in enumerate(names) if moments or scalars}
    return {"model": model, "optimizer": {"state": state}, "step": found["step"],
            "losses": [[loss] for loss in step_losses(last)]}
