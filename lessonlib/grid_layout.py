"""The layout of the process grid, pure: which rank sits where on (dp, pp, cp, tp) and whom it joins.

What it teaches: a hybrid layout is the world's ranks arranged in a box, built once as
``torch.arange(world).view(dp, pp, cp, tp)``: one rank order, ``ORDER = "tp-cp-pp-dp"``
written innermost first as Megatron-Core writes its orders, so rank = ((i*p + j)*c + l)*t + k
at (dp=i, pp=j, cp=l, tp=k). The innermost axis gets consecutive ranks, so it sits inside one
server; each axis further out strides by the product of the ones inside it (with c = 1 this is
lesson 05's ``view(dp, pp, tp)``). Megatron-Core's default, ``tp-cp-ep-dp-pp``, puts the
pipeline outermost instead; with d = 1 or p = 1 the two agree.

Reading the box along one axis with the others fixed gives that axis's groups (tp, cp, pp,
dp). Two more are read from them, as Megatron-Core builds them:

* ``dp_cp``: the d*c ranks that hold the same weights (same pp and tp); context-parallel
  ranks see different tokens of the same sequences, so the gradients are averaged over them
  and the data-parallel ranks at once;
* expert parallelism is carved from the data-parallel ranks: ``ep`` groups are e consecutive
  members of a dp group (by dp index), and ``edp`` groups the d/e members holding copies of
  the same experts (e apart), over which those experts' gradients are averaged.

Sharded data parallelism (ZeRO-1, FSDP) is a choice on the dp axis, not a new axis: it uses
the dp (or dp_cp) group. Every function takes the axis sizes in the grid's order, (dp, pp,
tp), then ``cp`` and ``ep`` by name.

Laptop:  ``python -m lessonlib.grid 2 2 2 --cp 2`` prints a table.
GPU box: the same (pure); keep tp (and tp*cp where it fits) inside a server.
"""
from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from itertools import product

import torch

from lessonlib.argcheck import positive_int

AXES = ("dp", "pp", "tp")                    # lesson 05's three, outermost to innermost
ALL_AXES = ("dp", "pp", "cp", "tp")          # how coordinates are written: (dp, pp, cp, tp)
ORDER = "tp-cp-pp-dp"                        # the one rank order, innermost first
# every axis with groups, in the order they are created; dp_cp and edp are read from the others
GROUP_AXES = ("tp", "pp", "dp", "cp", "dp_cp", "ep", "edp")


class GridWarning(UserWarning):
    """A layout that runs, but slower than it needs to."""


def _check_sizes(dp, pp, tp, cp=1, ep=1) -> None:
    for name, value in (("dp", dp), ("pp", pp), ("tp", tp), ("cp", cp), ("ep", ep)):
        positive_int(name, value, what=f"the number of ranks along the {name} axis")
    if dp % ep:
        ok = [k for k in range(1, dp + 1) if dp % k == 0]
        raise ValueError(f"ep={ep} must divide dp={dp}: expert-parallel groups are ep "
                         f"consecutive data-parallel ranks; use ep in {ok}")


def mesh4(dp: int, pp: int, tp: int, cp: int = 1) -> torch.Tensor:
    """``mesh[i, j, l, k]``: the global rank at (dp=i, pp=j, cp=l, tp=k)."""
    _check_sizes(dp, pp, tp, cp)
    return torch.arange(dp * pp * cp * tp).view(dp, pp, cp, tp)


def grid_mesh(dp: int, pp: int, tp: int, cp: int = 1) -> torch.Tensor:
    """The grid itself: ``mesh[i, j, k]`` is the rank at (dp=i, pp=j, tp=k) when cp = 1,
    ``mesh[i, j, l, k]`` with l the cp coordinate otherwise."""
    mesh = mesh4(dp, pp, tp, cp)
    return mesh[:, :, 0, :] if cp == 1 else mesh


def _lines(mesh: torch.Tensor, axis: str) -> list[list[int]]:
    """The groups of one axis: the mesh read along it, the other coordinates in order."""
    moved = mesh.movedim(ALL_AXES.index(axis), -1)
    return moved.reshape(-1, moved.shape[-1]).tolist()


def axis_groups(dp: int, pp: int, tp: int, cp: int = 1, ep: int = 1,
                only=None) -> dict[str, list[list[int]]]:
    """Every group of every axis as lists of global ranks, in the order they are created:
    tp, pp, dp always; cp and dp_cp when cp > 1; ep and edp when ep > 1. Given ``only``
    (names of ``GROUP_AXES``), those axes alone, in the same order, whatever their sizes."""
    _check_sizes(dp, pp, tp, cp, ep)
    unknown = set(only or ()) - set(GROUP_AXES)
    if unknown:
        raise ValueError(f"only={only!r}: no axis {sorted(unknown)}; the axes are {GROUP_AXES}")
    mesh = mesh4(dp, pp, tp, cp)
    dp_lines = _lines(mesh, "dp")
    groups = {"tp": _lines(mesh, "tp"), "pp": _lines(mesh, "pp"), "dp": dp_lines,
              "cp": _lines(mesh, "cp"),
              "dp_cp": [mesh[:, j, :, k].reshape(-1).tolist()
                        for j, k in product(range(pp), range(tp))],
              "ep": [g[s:s + ep] for g in dp_lines for s in range(0, dp, ep)],
              "edp": [g[r::ep] for g in dp_lines for r in range(ep)]}
    if only is None:
        only = AXES + (("cp", "dp_cp") if cp > 1 else ()) + (("ep", "edp") if ep > 1 else ())
    return {axis: lines for axis, lines in groups.items() if axis in only}


@dataclass(frozen=True)
class Placement:
    """Where one rank sits: its grid coordinates and, given the server size, its server and GPU."""
    rank: int
    dp: int
    pp: int
    tp: int
    node: int | None = None
    gpu: int | None = None
    cp: int = 0
    ep: int = 0


def placements(dp: int, pp: int, tp: int, gpus_per_node: int | None = None, cp: int = 1,
               ep: int = 1) -> list[Placement]:
    """One ``Placement`` per rank, in rank order. Servers hold consecutive ranks (torchrun's
    numbering: rank = node * gpus_per_node + local rank)."""
    _check_sizes(dp, pp, tp, cp, ep)
    mesh, out = mesh4(dp, pp, tp, cp), {}
    for i, j, l, k in product(range(dp), range(pp), range(cp), range(tp)):
        rank = int(mesh[i, j, l, k])
        node, gpu = divmod(rank, gpus_per_node) if gpus_per_node else (None, None)
        out[rank] = Placement(rank, i, j, k, node, gpu, l, i % ep)
    return [out[r] for r in sorted(out)]


def _nodes_of(ranks, gpus_per_node) -> int:
    return len({r // gpus_per_node for r in ranks})


def check_grid(world_size: int, dp: int, pp: int, tp: int, gpus_per_node: int | None = None,
               cp: int = 1, ep: int = 1) -> None:
    """Raise ValueError unless t*c*p*d ranks fill the world (and e divides d); warn if a TP
    group needlessly spans servers. Pure: call it before any process starts."""
    _check_sizes(dp, pp, tp, cp, ep)
    positive_int("world_size", world_size)
    if dp * pp * cp * tp != world_size:
        if cp == 1:
            ok = [(d, p) for d in range(1, world_size + 1) for p in range(1, world_size + 1)
                  if d * p * tp == world_size]
            hint = (f"with tp={tp}, (dp, pp) in {ok} would work" if ok
                    else f"tp must divide the world size {world_size}")
            raise ValueError(f"dp*pp*tp = {dp}*{pp}*{tp} = {dp * pp * tp} ranks, but the "
                             f"world has world_size={world_size}; {hint}")
        raise ValueError(f"dp*pp*cp*tp = {dp}*{pp}*{cp}*{tp} = {dp * pp * cp * tp} ranks, but "
                         f"the world has world_size={world_size}; the four sizes must multiply "
                         f"to it")
    if gpus_per_node is None:
        return
    positive_int("gpus_per_node", gpus_per_node)
    spanning = [g for g in axis_groups(dp, pp, tp, cp, 1)["tp"]
                if _nodes_of(g, gpus_per_node) > -(-tp // gpus_per_node)]
    if spanning:
        fits = [k for k in range(1, gpus_per_node + 1) if gpus_per_node % k == 0]
        group = spanning[0]
        warnings.warn(
            f"tp={tp} with gpus_per_node={gpus_per_node}: the TP group of ranks {group} "
            f"spans servers {sorted({r // gpus_per_node for r in group})} although "
            f"{-(-tp // gpus_per_node)} server(s) could hold it, because t consecutive ranks "
            f"cross a server boundary when t does not divide (or is not a multiple of) the "
            f"GPUs per server. Its all-reduces, several per layer per micro-batch, would then "
            f"run over the network instead of NVLink. Use tp in {fits} (or a multiple of "
            f"{gpus_per_node}).", GridWarning, stacklevel=2)


def layout_name(*, dp: int, pp: int, tp: int, cp: int = 1, ep: int = 1) -> str:
    """A layout as the labs write it, innermost axis first: ``t2p2d2``, with ``c2`` / ``e2``
    where they are not 1 (the sizes by name, as every hybrid function takes them)."""
    return f"t{tp}" + (f"c{cp}" if cp > 1 else "") + f"p{pp}d{dp}" + (f"e{ep}" if ep > 1 else "")


def parse_layout(text: str) -> tuple[int, int, int]:
    """``"t2p4d1"`` -> (t, p, d) = (2, 4, 1); ValueError showing the form otherwise."""
    match = re.fullmatch(r"t(\d+)p(\d+)d(\d+)", text.strip())
    if not match:
        raise ValueError(f"cannot read the layout {text!r}; write t<t>p<p>d<d>, e.g. t2p2d2")
    return tuple(int(g) for g in match.groups())


def parse_axes(text: str) -> tuple[int, int, int, int, int]:
    """``"t2c2p1d1"`` -> (t, c, p, d, e) = (2, 2, 1, 1, 1), as ``layout_name`` writes five
    axes (c and e only where not 1); ValueError showing the form otherwise."""
    match = re.fullmatch(r"t(\d+)(?:c(\d+))?p(\d+)d(\d+)(?:e(\d+))?", text.strip())
    if not match:
        raise ValueError(f"cannot read the layout {text!r}; write t<t>[c<c>]p<p>d<d>[e<e>], "
                         f"e.g. t2p2d2 or t1c2p2d1")
    t, c, p, d, e = (int(g) if g else 1 for g in match.groups())
    return t, c, p, d, e


def layout_table(dp: int, pp: int, tp: int, gpus_per_node: int | None = None, cp: int = 1,
                 ep: int = 1) -> str:
    """A printable table: rank -> coordinates -> server and GPU, and the groups it belongs
    to (cp and ep columns only where those axes are used)."""
    groups = axis_groups(dp, pp, tp, cp, ep)
    shown = [a for a in ("tp", "cp", "pp", "dp", "ep", "edp") if a in groups]
    member = {axis: {r: g for g in groups[axis] for r in g} for axis in shown}
    width = {a: max(9, *(len(str(g)) for g in groups[a])) for a in shown}
    coords = ["dp", "pp"] + (["cp"] if cp > 1 else []) + ["tp"] + (["ep"] if ep > 1 else [])
    where = gpus_per_node is not None
    head = f"{'rank':>4}  " + " ".join(f"{a:>2}" for a in coords) + ("  server gpu" if where else "")
    sizes = ", ".join(str({"dp": dp, "pp": pp, "cp": cp, "tp": tp, "ep": ep}[a]) for a in coords)
    title = f"grid ({', '.join(coords)}) = ({sizes})" + (
        f", rank order {ORDER}" if (cp > 1 or ep > 1) else "")
    lines = [title + (f" on servers of {gpus_per_node} GPUs" if where else ""),
             (head + "".join(f"   {a + ' group':<{width[a]}}" for a in shown)).rstrip()]
    for pl in placements(dp, pp, tp, gpus_per_node, cp, ep):
        spot = f"  {pl.node:>6} {pl.gpu:>3}" if where else ""
        text = "".join(f"   {str(member[a][pl.rank]):<{width[a]}}" for a in shown)
        lines.append((f"{pl.rank:>4}  " + " ".join(f"{getattr(pl, a):>2}" for a in coords)
                      + spot + text).rstrip())
    return "\n".join(lines)
