"""Where every number a rank holds sits in the full model, on any (t, c, p, d, e) layout.

What it teaches: a checkpoint is only as useful as the layouts it can be loaded on, and
loading it elsewhere needs one table: for each tensor a rank holds, which box of which full
tensor it is. Three cuts compose, each a pure function of the layout and the rank:

1. **the stage** (``placement``): p stages of whole layers, each block's attention and MLP
   split over t ranks (column-parallel: dim 0 of nn.Linear's (out, in) weight; row-parallel:
   dim 1), an MoE block's E experts split over e ranks (E/e each, replicated over t), so a
   stage tensor is one or more *pieces* ``(full name, dim, start, stop)`` concatenated
   along that dim; context parallelism (c) and sequence parallelism cut activations only;
2. **the data-parallel shard** of the d*c ranks that hold the same stage: FSDP keeps rows
   ``[r ceil(R/n), (r+1) ceil(R/n))`` of every stage tensor (zero-padded), ZeRO-1 keeps the
   optimizer state of one flat range of the stage's tensors laid end to end
   (``data_parallel.sharded.flat_ranges``); without sharding, the whole stage tensor;
3. **the boxes** (``segments``): a flat range of a stage tensor is at most three boxes of
   it in row-major order (a partial row, whole rows, a partial row), each a box of one full
   tensor, lying at one offset of what the rank stores:

       Segment("blocks.0.attn.q.weight", ((16, 24), (0, 32)), 0)   # rows 16-23, all columns

Copying between two layouts is then box against box (``copy_overlap``): where a box the
new rank stores meets a box an old shard stores, the intersection is one slice of each, and
nothing else is read or written. A rank never builds a full tensor.

The grid's one rank order (``grid_layout.ORDER``: ``view(d, p, c, t)``) says which
coordinates a rank has; the hybrid trainer splits every block, even over t = 1, so q, k and v
are one qkv tensor at every t. A checkpoint whose manifest names another rank order (saved
before the grid had one) cannot be mapped, and ``Layout.of`` says so in one line.

Laptop:  ``python -c "from lessonlib import shard_map as S; from lessonlib.models import
         LONG_RUN; print(S.held(S.Layout(1, 2, 2, 1, 1, 'zero1'), LONG_RUN, 1)['moments'][0])"``
GPU box: the same (pure: no process, no device).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import NamedTuple

import torch

from lessonlib.data_parallel.sharded import flat_ranges, shard_rows
from lessonlib.grid_layout import ORDER, axis_groups, parse_axes, placements
from lessonlib.hybrid.build import make_model, stage_counts
from lessonlib.hybrid.checks import N_EXPERTS
from lessonlib.models import GPTConfig

# How ``tensor_parallel.parallelize_block`` splits a transformer layer over t ranks: each
# tensor of the parallel layer that is made of slices of dense tensors, and the dim they are
# cut along. Every other tensor of the layer (LayerNorms, the row-parallel biases) is whole.
TP_SPLITS = {
    "attn.qkv.weight": (("attn.q.weight", "attn.k.weight", "attn.v.weight"), 0),
    "attn.qkv.bias": (("attn.q.bias", "attn.k.bias", "attn.v.bias"), 0),
    "attn.proj.weight": (("attn.proj.weight",), 1),
    "mlp.fc1.weight": (("mlp.fc1.weight",), 0),
    "mlp.fc1.bias": (("mlp.fc1.bias",), 0),
    "mlp.fc2.weight": (("mlp.fc2.weight",), 1),
}
_LOCAL = {source: (local, sources, dim)
          for local, (sources, dim) in TP_SPLITS.items() for source in sources}


@dataclass(frozen=True)
class Layout:
    """A run's layout as its checkpoint records it: the five axes, the data-parallel
    sharding and whether the model is the MoE tiny GPT."""
    t: int
    c: int
    p: int
    d: int
    e: int = 1
    shard: str = "none"
    moe: bool = False

    @classmethod
    def of(cls, meta: dict) -> "Layout":
        """From a manifest's ``meta``: a (t, p, d) run's has no shard nor moe. ValueError
        for a checkpoint saved in another rank order than the grid's."""
        if meta.get("order", ORDER) != ORDER:
            raise ValueError(f"it was saved with the ranks in the order {meta['order']!r}, "
                             f"which this course no longer lays out (its one order is "
                             f"{ORDER!r}); start a new run in a new checkpoint folder")
        t, c, p, d, e = parse_axes(meta["layout"])
        return cls(t, c, p, d, e, meta.get("shard", "none"), bool(meta.get("moe", False)))

    @property
    def world(self) -> int:
        return self.t * self.c * self.p * self.d


class Segment(NamedTuple):
    """One box of the full tensor ``name`` (a (start, stop) per dim), stored row-major from
    element ``offset`` of a rank's flat tensor."""
    name: str
    box: tuple
    offset: int


@functools.lru_cache(maxsize=8)
def dense_shapes(cfg: GPTConfig, moe: bool = False) -> dict[str, torch.Size]:
    """The full model's tensor names and shapes, in order (built on the meta device: no
    memory)."""
    with torch.device("meta"):
        model = make_model(cfg, moe)
    return {name: q.shape for name, q in model.named_parameters()}


def placement(cfg: GPTConfig, t: int, p: int, pp_rank: int, tp_rank: int, moe: bool = False,
              e: int = 1, ep_rank: int = 0) -> dict[str, list]:
    """Each tensor of the stage at (pp_rank, tp_rank, ep_rank) -> its pieces ``(full name,
    dim, start, stop)``, in the stage's parameter order (lesson 05's local names)."""
    shapes, counts = dense_shapes(cfg, moe), stage_counts(cfg.layers, p)
    parts = ["embed", *(f"blocks.{i}" for i in range(cfg.layers)), "head"]
    first, local_experts = sum(counts[:pp_rank]), N_EXPERTS // e
    out = {}
    for i, part in enumerate(parts[first:first + counts[pp_rank]]):  # stage = Sequential(parts)
        for name, shape in shapes.items():
            inner = name[len(part) + 1:]
            if not name.startswith(part + "."):
                continue
            if inner.startswith("mlp.experts."):                       # E/e experts, whole
                _, _, g, rest = inner.split(".", 3)
                if int(g) // local_experts == ep_rank:
                    out[f"{i}.mlp.experts.{int(g) % local_experts}.{rest}"] = [(name, 0, 0, shape[0])]
            elif inner in _LOCAL:
                local, sources, dim = _LOCAL[inner]
                if f"{i}.{local}" not in out:                          # q, k, v: once, at q
                    n = shape[dim] // t
                    out[f"{i}.{local}"] = [(f"{part}.{s}", dim, tp_rank * n, (tp_rank + 1) * n)
                                           for s in sources]
            else:
                out[f"{i}.{inner}"] = [(name, 0, 0, shape[0])]
    return out


def local_shape(shapes: dict, pieces: list) -> tuple[int, ...]:
    """The shape of the stage tensor made of ``pieces``."""
    shape = list(shapes[pieces[0][0]])
    shape[pieces[0][1]] = sum(stop - start for _, _, start, stop in pieces)
    return tuple(shape)


def flat_boxes(shape: tuple, a: int, b: int) -> list[tuple]:
    """Elements [a, b) of a tensor of ``shape`` in row-major order, as boxes in that order,
    each contiguous: a partial row, the whole rows, a partial row (recursively)."""
    if a >= b:
        return []
    if len(shape) <= 1:
        return [((a, b),)]
    inner = math.prod(shape[1:])
    first, last = a // inner, (b - 1) // inner
    if first == last:
        return [((first, first + 1), *box)
                for box in flat_boxes(shape[1:], a - first * inner, b - first * inner)]
    head = flat_boxes(shape, a, (first + 1) * inner) if a % inner else []
    tail = flat_boxes(shape, last * inner, b) if b % inner else []
    rows = (first + bool(head), last + 1 - bool(tail))
    whole = [(rows, *((0, n) for n in shape[1:]))] if rows[0] < rows[1] else []
    return head + whole + tail


def segments(pieces: list, shape: tuple, a: int, b: int) -> list[Segment]:
    """Elements [a, b) of the stage tensor made of ``pieces`` (``shape``), as boxes of the
    full tensors, from offset 0 of the flat tensor that stores them."""
    dim, out, offset = pieces[0][1], [], 0
    for box in flat_boxes(shape, a, b):
        row = math.prod(hi - lo for lo, hi in box[dim + 1:])
        at = 0                                 # where each piece starts along ``dim``
        for name, _, start, stop in pieces:
            lo, hi = max(box[dim][0], at), min(box[dim][1], at + stop - start)
            if lo < hi:
                if len(pieces) > 1 and math.prod(hi - lo for lo, hi in box[:dim]) > 1:
                    raise ValueError(f"{name}: pieces stacked along dim {dim} of a box with "
                                     f"several rows are not contiguous; stack them along dim 0")
                full = (*box[:dim], (lo - at + start, hi - at + start), *box[dim + 1:])
                out.append(Segment(name, full, offset + (lo - box[dim][0]) * row))
            at += stop - start
        offset += math.prod(hi - lo for lo, hi in box)
    return out


class Held(NamedTuple):
    """One tensor a rank stores: its shape and the boxes of the full model it holds (any
    element in no box is padding: zero)."""
    shape: tuple
    segments: list


def data_parallel_place(layout: Layout, rank: int) -> tuple[int, int]:
    """(this rank's index, the size) of its dp_cp group: the d*c ranks holding one stage."""
    groups = axis_groups(layout.d, layout.p, layout.t, layout.c, layout.e)
    group = next(sorted(g) for g in groups.get("dp_cp", groups["dp"]) if rank in g)
    return group.index(rank), len(group)


def held(layout: Layout, cfg: GPTConfig, rank: int) -> dict[str, list[Held]]:
    """What ``rank`` of ``layout`` stores: ``model`` (its parameters, in order) and
    ``moments`` (each optimizer state tensor shaped like a parameter, by state index)."""
    pl = placements(layout.d, layout.p, layout.t, None, layout.c, layout.e)[rank]
    shapes = dense_shapes(cfg, layout.moe)
    stage = list(placement(cfg, layout.t, layout.p, pl.pp, pl.tp, layout.moe,
                           layout.e, pl.ep).values())
    sizes = [local_shape(shapes, pieces) for pieces in stage]
    whole = [Held(size, segments(pieces, size, 0, math.prod(size)))
             for pieces, size in zip(stage, sizes)]
    me, n = data_parallel_place(layout, rank)
    if layout.shard == "fsdp":
        rows = [shard_rows(size, n) for size in sizes]
        whole = [Held((r, *size[1:]), segments(pieces, size, min(me * r, size[0]) * math.prod(size[1:]),
                                               min((me + 1) * r, size[0]) * math.prod(size[1:])))
                 for pieces, size, r in zip(stage, sizes, rows)]
    if layout.shard != "zero1":
        return {"model": whole, "moments": whole}
    _, ranges = flat_ranges([math.prod(size) for size in sizes], me, n)
    return {"model": whole,
            "moments": [Held((b - a,), segments(stage[i], sizes[i], a, b)) for i, a, b in ranges]}


def box_view(tensor: torch.Tensor, seg: Segment, box: tuple) -> torch.Tensor:
    """The part of ``tensor`` (flat, storing ``seg``) that is ``box`` of the full tensor: a
    slice, no copy."""
    size = [hi - lo for lo, hi in seg.box]
    flat = tensor.reshape(-1)[seg.offset:seg.offset + math.prod(size)]
    return flat.view(size)[tuple(slice(lo - s, hi - s) for (lo, hi), (s, _) in zip(box, seg.box))]


def overlaps(want: Held, have: Held):
    """Every (segment of ``want``, segment of ``have``, their common box) that is not empty."""
    for mine in want.segments:
        for theirs in have.segments:
            if mine.name != theirs.name:
                continue
            box = tuple((max(a, c), min(b, d)) for (a, b), (c, d) in zip(mine.box, theirs.box))
            if all(lo < hi for lo, hi in box):
                yield mine, theirs, box


def copy_overlap(dst: torch.Tensor, dst_held: Held, src: torch.Tensor, src_held: Held) -> None:
    """Copy every element ``src`` stores that ``dst`` needs, slice into slice."""
    for mine, theirs, box in overlaps(dst_held, src_held):
        box_view(dst, mine, box).copy_(box_view(src, theirs, box))
