"""The process grid: which rank does data, pipeline, context and tensor parallelism with whom.

What it teaches: hybrid parallelism is one arrangement of the world's ranks in a box of
shape (d, p, t) = (dp, pp, tp), built once as ``torch.arange(world).view(dp, pp, tp)``.
Tensor parallelism is the innermost axis, so a TP group is t *consecutive* ranks and, with
``gpus_per_node`` a multiple of t, sits inside one server where its many all-reduces use
NVLink (Megatron-LM 2021, Narayanan et al., takeaway #1). A PP group strides by t and a DP
group by t*p, so the rarer pipeline and data-parallel messages are the ones that cross
servers. Reading the box along one axis while the other two coordinates stay fixed gives
the groups of that axis:

    tp groups: mesh[i, j, :]     pp groups: mesh[i, :, k]     dp groups: mesh[:, j, k]

Beyond three axes (``lessonlib.grid_layout``, the pure half, states the one rank order): a
context-parallel axis c between pp and tp, ``view(dp, pp, cp, tp)``, and expert parallelism
carved from the dp ranks; ``build(dp, pp, tp, cp=c, ep=e)`` lays them out.

Two halves:

* pure (no processes, in ``grid_layout``): ``grid_mesh``, ``axis_groups``, ``placements``,
  ``layout_table`` and ``check_grid`` draw and check any layout, e.g. (d, p, t) = (2, 2, 8)
  on 4 servers;
* on the ranks: ``ParallelContext.build(dp, pp, tp)`` creates *every* group of every axis on
  every rank, in the same order (``dist.new_group`` is collective over the world, so a rank
  that skipped one would hang the others), and freezes this rank's place in a small
  dataclass that the parallel code receives as an argument (no global state): one record
  per axis, ``ctx.axis("tp")`` (size, rank, group, ranks), the only way to read an axis.
  The layouts' groups are all made
  here (``new_groups``); the context-parallel and expert-parallel lessons' grids are views
  built with ``only=`` the axes they need, so they create those groups alone.

PyTorch offers the same arrangement as ``init_device_mesh(kind, (dp, pp, tp),
mesh_dim_names=("dp", "pp", "tp"))``; ``device_mesh_view`` reads its groups so a test (and
the notebook) can check that both agree, rank for rank.

Laptop:  ``python -m lessonlib.grid 2 2 2 --gpus-per-node 4`` prints the table of 8 ranks;
``python -c "import lessonlib as L; print(L.launch(L.grid.demo_grid, 8, 2, 2, 2))"`` builds it.
GPU box: ``torchrun --nproc-per-node 8`` a script that calls ``ParallelContext.build(2, 2, 2)``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from lessonlib import comm
from lessonlib.grid_layout import ALL_AXES, AXES, GROUP_AXES, axis_groups, check_grid, layout_table


# ---------------------------------------------------------------- on the ranks: the context
def new_groups(lines: list[list[int]]) -> list:
    """One process group per list of global ranks, in order, through ``comm.new_group``
    (recorded: the NCCL check sees it). Every rank must call it with the same lists, members
    or not (torch.distributed docs, ``new_group``); a rank's handle to a group it is not in
    is torch's placeholder."""
    return [comm.new_group(line) for line in lines]


def destroy_groups(groups) -> None:
    """Destroy ``groups`` (every rank of the world calls it). Under gloo a group's pairs
    connect as it is made, and a rank that returns from ``new_group`` first may destroy it
    while a slower peer still connects (gloo then fails that peer: "Connection closed by
    peer", seen here twice in some thirty runs of a layout whose groups carried nothing): a
    world barrier first, as ``launcher.rank`` does before a rank leaves. NCCL makes its
    communicators at their first call and needs none."""
    if dist.get_backend() == "gloo":
        dist.barrier()
    for group in groups:
        dist.destroy_process_group(group)


@dataclass(frozen=True, kw_only=True)
class Axis:
    """One axis of the grid as this rank sees it: ``size`` ranks along it, this rank's
    coordinate ``rank`` on it, its process ``group`` (None where none was created: cp = 1,
    ep = 1, or an axis ``build``'s ``only`` left out) and the global ``ranks`` of that group
    in axis order (``comm.send``/``recv`` take global ranks)."""
    name: str
    size: int
    rank: int
    group: object = field(repr=False)
    ranks: tuple


@dataclass(frozen=True, kw_only=True)
class ParallelContext:
    """This rank's place in the (dp, pp, cp, tp) grid and the process groups it talks through.

    Build it once per run with ``ParallelContext.build(dp, pp, tp)`` (lesson 05's grid), or
    ``build(dp, pp, tp, cp=c, ep=e)`` on every rank, and pass it to the parallel code.
    ``ctx.axis("tp")`` is the tp axis's record (``Axis``: size, rank, group, ranks), and so
    for every name of ``GROUP_AXES``. With cp = 1 the cp group is None and the dp_cp axis is
    the dp axis; with ep = 1 the ep group is None and the edp axis (the ranks averaging an
    expert's copies) is the dp axis."""
    rank: int
    axes: tuple           # one ``Axis`` per name of ``GROUP_AXES``
    gpus_per_node: int | None = None
    made: tuple = field(default=(), repr=False)

    def axis(self, name: str) -> Axis:
        """This rank's record of the axis ``name`` (one of ``GROUP_AXES``)."""
        for axis in self.axes:
            if axis.name == name:
                return axis
        raise ValueError(f"no axis {name!r} in the grid: the axes are {GROUP_AXES}")

    @classmethod
    def build(cls, dp: int, pp: int, tp: int, *, gpus_per_node: int | None = None,
              cp: int = 1, ep: int = 1, only=None):
        """Create every group of every axis (on every rank, same order: tp, pp, dp, then cp
        and dp_cp, then ep and edp) and keep this rank's. ``only``: the groups of the named
        axes alone, whatever their sizes, in the same order (a lesson that needs one axis,
        e.g. ``build(dp=d, pp=1, tp=1, cp=c, only=("cp",))``); the other axes' records keep
        their size, rank and ranks, with group None.

        Checks the sizes against the world before any group is created."""
        if not dist.is_initialized():
            raise ValueError("ParallelContext.build needs a process group: call it inside a "
                             "function run by lessonlib.launch (or under torchrun)")
        world, rank = dist.get_world_size(), dist.get_rank()
        check_grid(world, dp, pp, tp, gpus_per_node, cp, ep)
        made = {}
        for axis, lines in axis_groups(dp, pp, tp, cp, ep, only).items():
            for line, group in zip(lines, new_groups(lines)):
                if rank in line:
                    made[axis] = group
        axes = []
        for name, lines in axis_groups(dp, pp, tp, cp, ep, only=GROUP_AXES).items():
            ranks = next(tuple(line) for line in lines if rank in line)
            group = made.get(name, made.get("dp") if name in ("dp_cp", "edp") else None)
            axes.append(Axis(name=name, size=len(ranks), rank=ranks.index(rank), group=group,
                             ranks=ranks))
        return cls(rank=rank, axes=tuple(axes), gpus_per_node=gpus_per_node,
                   made=tuple(made.values()))

    def destroy(self) -> None:
        """Destroy every group this rank joined once the layout is done (every member calls
        it). Under NCCL each group holds communicators and GPU buffers until destroyed, so a
        run that tries layout after layout would otherwise pile them up."""
        destroy_groups(self.made or [self.axis(a).group for a in ("tp", "pp", "dp")])

    @property
    def coords(self) -> tuple[int, int, int]:
        """(dp, pp, tp) coordinates."""
        return tuple(self.axis(a).rank for a in AXES)

    @property
    def coords4(self) -> tuple[int, int, int, int]:
        """(dp, pp, cp, tp) coordinates."""
        return tuple(self.axis(a).rank for a in ALL_AXES)

    @property
    def is_first_stage(self) -> bool:
        return self.axis("pp").rank == 0

    @property
    def is_last_stage(self) -> bool:
        pp = self.axis("pp")
        return pp.rank == pp.size - 1

    @property
    def prev_stage_rank(self) -> int | None:
        """Global rank of the previous pipeline stage (same dp and tp coordinates)."""
        pp = self.axis("pp")
        return None if self.is_first_stage else pp.ranks[pp.rank - 1]

    @property
    def next_stage_rank(self) -> int | None:
        pp = self.axis("pp")
        return None if self.is_last_stage else pp.ranks[pp.rank + 1]

    def describe(self) -> str:
        groups = {a: list(self.axis(a).ranks) for a in GROUP_AXES}
        text = (f"rank {self.rank}: (dp, pp, tp) = {self.coords}; tp group {groups['tp']}, "
                f"pp group {groups['pp']}, dp group {groups['dp']}")
        extra = ([f"cp group {groups['cp']}"] if self.axis("cp").size > 1 else []) + (
            [f"ep group {groups['ep']}, edp group {groups['edp']}"]
            if self.axis("ep").size > 1 else [])
        return "; ".join([text, *extra])


def device_mesh_view(dp: int, pp: int, tp: int, cp: int = 1) -> dict:
    """PyTorch's reading of the same grid on this rank: coordinates, in (dp, pp, [cp,] tp)
    order, and group ranks from ``init_device_mesh`` over the axes outermost first, e.g.
    ``init_device_mesh(kind, (dp, pp, tp), mesh_dim_names=("dp", "pp", "tp"))``."""
    from torch.distributed.device_mesh import init_device_mesh

    from lessonlib import device

    dims = [a for a in ALL_AXES if a != "cp" or cp > 1]
    size = {"dp": dp, "pp": pp, "cp": cp, "tp": tp}
    mesh = init_device_mesh(device.current_device().type, tuple(size[a] for a in dims),
                            mesh_dim_names=tuple(dims))
    coord = dict(zip(dims, mesh.get_coordinate()))
    return {"coords": tuple(coord[a] for a in dims),
            **{f"{axis}_ranks": tuple(dist.get_process_group_ranks(mesh.get_group(axis)))
               for axis in dims}}


def demo_axes(dp: int, pp: int, tp: int, cp: int = 1, ep: int = 1) -> dict:
    """Build the context beyond three axes and compare it with PyTorch's DeviceMesh over
    the same dims (which has no expert axis: the ep and edp groups are returned as built)."""
    ctx = ParallelContext.build(dp, pp, tp, cp=cp, ep=ep)
    torch_view = device_mesh_view(dp, pp, tp, cp)
    ours = {"coords": ctx.coords4 if cp > 1 else ctx.coords,
            **{f"{a}_ranks": ctx.axis(a).ranks for a in ALL_AXES if a != "cp" or cp > 1}}
    out = {"rank": ctx.rank, "ours": ours, "torch": torch_view,
           **{f"{a}_ranks": ctx.axis(a).ranks for a in ("ep", "edp", "dp_cp")},
           "agrees_with_torch": ours == torch_view}
    ctx.destroy()
    return out


@dataclass(frozen=True)
class GridDemo:
    """What ``demo_grid`` saw on one rank: its rank and (dp, pp, tp) coordinates, each
    axis's group ranks and the sum of the rank ids over it (both by axis name), PyTorch's
    DeviceMesh view of the same grid, and whether the two agree."""
    rank: int
    coords: tuple
    ranks: dict
    sums: dict
    torch: dict
    agrees_with_torch: bool


def demo_grid(dp: int, pp: int, tp: int, gpus_per_node: int | None = None) -> GridDemo:
    """Build the context on this rank, sum the rank ids over each axis's group (one
    all-reduce per axis), and read PyTorch's DeviceMesh for comparison."""
    from lessonlib import device

    ctx = ParallelContext.build(dp, pp, tp, gpus_per_node=gpus_per_node)
    sums = {}
    for axis in AXES:
        x = torch.tensor([float(ctx.rank)], device=device.current_device())
        comm.all_reduce(x, group=ctx.axis(axis).group)
        sums[axis] = x.item()
    ranks = {axis: ctx.axis(axis).ranks for axis in AXES}
    torch_view = device_mesh_view(dp, pp, tp)     # keyed as "coords", "dp_ranks", ...
    ours = {"coords": ctx.coords, **{f"{axis}_ranks": r for axis, r in ranks.items()}}
    return GridDemo(rank=ctx.rank, coords=ctx.coords, ranks=ranks, sums=sums, torch=torch_view,
                    agrees_with_torch=torch_view == ours)


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(prog="python -m lessonlib.grid",
                                 description="Print the (dp, pp, tp) grid's rank table.")
    ap.add_argument("dp", type=int)
    ap.add_argument("pp", type=int)
    ap.add_argument("tp", type=int)
    ap.add_argument("--gpus-per-node", type=int, default=None)
    ap.add_argument("--cp", type=int, default=1)
    ap.add_argument("--ep", type=int, default=1)
    args = ap.parse_args()
    sizes = dict(cp=args.cp, ep=args.ep)
    try:
        check_grid(args.dp * args.pp * args.cp * args.tp, args.dp, args.pp, args.tp,
                   args.gpus_per_node, **sizes)
    except ValueError as exc:
        ap.error(str(exc))
    print(layout_table(args.dp, args.pp, args.tp, args.gpus_per_node, **sizes))
