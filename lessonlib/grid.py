"""The 3-D process grid: which rank does data, pipeline and tensor parallelism with whom.

What it teaches: hybrid parallelism is one arrangement of the world's ranks in a box of
shape (d, p, t) = (dp, pp, tp), built once as ``torch.arange(world).view(dp, pp, tp)``.
Tensor parallelism is the innermost axis, so a TP group is t *consecutive* ranks and, with
``gpus_per_node`` a multiple of t, sits inside one server where its many all-reduces use
NVLink (Megatron-LM 2021, Narayanan et al., takeaway #1). A PP group strides by t and a DP
group by t*p, so the rarer pipeline and data-parallel messages are the ones that cross
servers. Reading the box along one axis while the other two coordinates stay fixed gives
the groups of that axis:

    tp groups: mesh[i, j, :]     pp groups: mesh[i, :, k]     dp groups: mesh[:, j, k]

Two halves:

* pure (no processes): ``grid_mesh``, ``axis_groups``, ``placements``, ``layout_table`` and
  ``check_grid`` draw and check any layout, e.g. (d, p, t) = (2, 2, 8) on 4 servers;
* on the ranks: ``ParallelContext.build(dp, pp, tp)`` creates *every* group of every axis on
  every rank, in the same order (``dist.new_group`` is collective over the world, so a rank
  that skipped one would hang the others), and freezes this rank's coordinates and groups in
  a small dataclass that the parallel code receives as an argument (no global state).

PyTorch offers the same arrangement as ``init_device_mesh(kind, (dp, pp, tp),
mesh_dim_names=("dp", "pp", "tp"))``; ``device_mesh_view`` reads its groups so a test (and
the notebook) can check that both agree, rank for rank.

Laptop:  ``python -m lessonlib.grid 2 2 2 --gpus-per-node 4`` prints the table of 8 ranks;
``python -c "import lessonlib as L; print(L.launch(L.grid.demo_grid, 8, 2, 2, 2))"`` builds it.
GPU box: ``torchrun --nproc-per-node 8`` a script that calls ``ParallelContext.build(2, 2, 2)``.
"""
from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from lessonlib import comm
from lessonlib.argcheck import positive_int

AXES = ("dp", "pp", "tp")  # outermost to innermost


class GridWarning(UserWarning):
    """A layout that runs, but slower than it needs to."""


# ---------------------------------------------------------------- pure: the layout
def _check_sizes(dp, pp, tp) -> None:
    for name, value in (("dp", dp), ("pp", pp), ("tp", tp)):
        positive_int(name, value, what=f"the number of ranks along the {name} axis")


def check_grid(world_size: int, dp: int, pp: int, tp: int,
               gpus_per_node: int | None = None) -> None:
    """Raise ValueError unless t*p*d ranks fill the world; warn if a TP group needlessly
    spans servers. Pure: call it before any process starts."""
    _check_sizes(dp, pp, tp)
    positive_int("world_size", world_size)
    if dp * pp * tp != world_size:
        ok = [(d, p) for d in range(1, world_size + 1) for p in range(1, world_size + 1)
              if d * p * tp == world_size]
        hint = (f"with tp={tp}, (dp, pp) in {ok} would work" if ok
                else f"tp must divide the world size {world_size}")
        raise ValueError(f"dp*pp*tp = {dp}*{pp}*{tp} = {dp * pp * tp} ranks, but the world "
                         f"has world_size={world_size}; {hint}")
    if gpus_per_node is None:
        return
    positive_int("gpus_per_node", gpus_per_node)
    spanning = [g for g in axis_groups(dp, pp, tp)["tp"] if _nodes_of(g, gpus_per_node)
                > -(-tp // gpus_per_node)]
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


def layout_name(tp: int, pp: int, dp: int) -> str:
    """A layout as the labs write it: ``t2p2d2``."""
    return f"t{tp}p{pp}d{dp}"


def parse_layout(text: str) -> tuple[int, int, int]:
    """``"t2p4d1"`` -> (t, p, d) = (2, 4, 1); ValueError showing the form otherwise."""
    match = re.fullmatch(r"t(\d+)p(\d+)d(\d+)", text.strip())
    if not match:
        raise ValueError(f"cannot read the layout {text!r}; write t<t>p<p>d<d>, e.g. t2p2d2")
    return tuple(int(g) for g in match.groups())


def _nodes_of(ranks, gpus_per_node) -> int:
    return len({r // gpus_per_node for r in ranks})


def grid_mesh(dp: int, pp: int, tp: int) -> torch.Tensor:
    """The grid itself: ``mesh[i, j, k]`` is the global rank with coordinates (dp=i, pp=j, tp=k)."""
    _check_sizes(dp, pp, tp)
    return torch.arange(dp * pp * tp).view(dp, pp, tp)                # (d, p, t)


def axis_groups(dp: int, pp: int, tp: int) -> dict[str, list[list[int]]]:
    """Every group of every axis as lists of global ranks, in the order they are created.

    ``{"tp": [[0, 1], [2, 3], ...], "pp": [[0, 2], ...], "dp": [[0, 4], ...]}``"""
    mesh = grid_mesh(dp, pp, tp)
    return {
        "tp": [mesh[i, j, :].tolist() for i in range(dp) for j in range(pp)],
        "pp": [mesh[i, :, k].tolist() for i in range(dp) for k in range(tp)],
        "dp": [mesh[:, j, k].tolist() for j in range(pp) for k in range(tp)],
    }


@dataclass(frozen=True)
class Placement:
    """Where one rank sits: its grid coordinates and, given the server size, its server and GPU."""
    rank: int
    dp: int
    pp: int
    tp: int
    node: int | None = None
    gpu: int | None = None


def placements(dp: int, pp: int, tp: int, gpus_per_node: int | None = None) -> list[Placement]:
    """One ``Placement`` per rank, in rank order. Servers hold consecutive ranks (torchrun's
    numbering: rank = node * gpus_per_node + local rank)."""
    mesh = grid_mesh(dp, pp, tp)
    out = {}
    for i in range(dp):
        for j in range(pp):
            for k in range(tp):
                rank = int(mesh[i, j, k])
                node, gpu = divmod(rank, gpus_per_node) if gpus_per_node else (None, None)
                out[rank] = Placement(rank, i, j, k, node, gpu)
    return [out[r] for r in sorted(out)]


def layout_table(dp: int, pp: int, tp: int, gpus_per_node: int | None = None) -> str:
    """A printable table: rank -> (dp, pp, tp) -> server and GPU, and the groups it belongs to."""
    groups = axis_groups(dp, pp, tp)
    member = {axis: {r: g for g in gs for r in g} for axis, gs in groups.items()}
    width = {a: max(9, *(len(str(g)) for g in gs)) for a, gs in groups.items()}
    where = gpus_per_node is not None
    head = f"{'rank':>4}  {'dp':>2} {'pp':>2} {'tp':>2}" + ("  server gpu" if where else "")
    lines = [f"grid (dp, pp, tp) = ({dp}, {pp}, {tp})"
             + (f" on servers of {gpus_per_node} GPUs" if where else ""),
             (head + "".join(f"   {a + ' group':<{width[a]}}" for a in AXES[::-1])).rstrip()]
    for pl in placements(dp, pp, tp, gpus_per_node):
        spot = f"  {pl.node:>6} {pl.gpu:>3}" if where else ""
        groups_text = "".join(f"   {str(member[a][pl.rank]):<{width[a]}}" for a in AXES[::-1])
        lines.append(f"{pl.rank:>4}  {pl.dp:>2} {pl.pp:>2} {pl.tp:>2}{spot}{groups_text}".rstrip())
    return "\n".join(lines)


# ---------------------------------------------------------------- on the ranks: the context
@dataclass(frozen=True)
class ParallelContext:
    """This rank's place in the (dp, pp, tp) grid and the process groups it talks through.

    Build it once per run with ``ParallelContext.build(dp, pp, tp)`` on every rank and pass
    it to the parallel code. ``*_ranks`` are the global ranks of this rank's group on each
    axis, in axis order (what ``comm.send``/``recv``, which take global ranks, need)."""
    dp: int
    pp: int
    tp: int
    rank: int
    dp_rank: int
    pp_rank: int
    tp_rank: int
    dp_group: object = field(repr=False)
    pp_group: object = field(repr=False)
    tp_group: object = field(repr=False)
    dp_ranks: tuple = ()
    pp_ranks: tuple = ()
    tp_ranks: tuple = ()
    gpus_per_node: int | None = None

    @classmethod
    def build(cls, dp: int, pp: int, tp: int, gpus_per_node: int | None = None):
        """Create every group of every axis (on every rank, same order) and keep this rank's.

        Checks the sizes against the world before any group is created."""
        if not dist.is_initialized():
            raise ValueError("ParallelContext.build needs a process group: call it inside a "
                             "function run by lessonlib.launch (or under torchrun)")
        world, rank = dist.get_world_size(), dist.get_rank()
        check_grid(world, dp, pp, tp, gpus_per_node)
        mine, ranks = {}, {}
        for axis, groups in axis_groups(dp, pp, tp).items():   # tp, pp, dp: same on every rank
            for group_ranks in groups:
                group = comm.new_group(group_ranks)   # recorded: the NCCL check sees it
                if rank in group_ranks:
                    mine[axis], ranks[axis] = group, tuple(group_ranks)
        pl = placements(dp, pp, tp)[rank]
        return cls(dp, pp, tp, rank, pl.dp, pl.pp, pl.tp,
                   mine["dp"], mine["pp"], mine["tp"],
                   ranks["dp"], ranks["pp"], ranks["tp"], gpus_per_node)

    def destroy(self) -> None:
        """Destroy this rank's three groups once the layout is done (every member calls it).
        Under NCCL each group holds communicators and GPU buffers until destroyed, so a run
        that tries layout after layout would otherwise pile them up."""
        for group in (self.tp_group, self.pp_group, self.dp_group):
            dist.destroy_process_group(group)

    @property
    def coords(self) -> tuple[int, int, int]:
        return (self.dp_rank, self.pp_rank, self.tp_rank)

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp - 1

    @property
    def prev_stage_rank(self) -> int | None:
        """Global rank of the previous pipeline stage (same dp and tp coordinates)."""
        return None if self.is_first_stage else self.pp_ranks[self.pp_rank - 1]

    @property
    def next_stage_rank(self) -> int | None:
        return None if self.is_last_stage else self.pp_ranks[self.pp_rank + 1]

    def describe(self) -> str:
        return (f"rank {self.rank}: (dp, pp, tp) = {self.coords}; tp group {list(self.tp_ranks)}, "
                f"pp group {list(self.pp_ranks)}, dp group {list(self.dp_ranks)}")


def device_mesh_view(dp: int, pp: int, tp: int) -> dict:
    """PyTorch's reading of the same grid on this rank: coordinates and group ranks from
    ``init_device_mesh(kind, (dp, pp, tp), mesh_dim_names=("dp", "pp", "tp"))``."""
    from torch.distributed.device_mesh import init_device_mesh

    from lessonlib import device

    mesh = init_device_mesh(device.current_device().type, (dp, pp, tp), mesh_dim_names=AXES)
    return {"coords": tuple(mesh.get_coordinate()),
            **{f"{axis}_ranks": tuple(dist.get_process_group_ranks(mesh.get_group(axis)))
               for axis in AXES}}


def demo_grid(dp: int, pp: int, tp: int, gpus_per_node: int | None = None) -> dict:
    """Build the context on this rank, sum the rank ids over each axis's group (one
    all-reduce per axis), and read PyTorch's DeviceMesh for comparison."""
    from lessonlib import device

    ctx = ParallelContext.build(dp, pp, tp, gpus_per_node)
    sums = {}
    for axis in AXES:
        x = torch.tensor([float(ctx.rank)], device=device.current_device())
        comm.all_reduce(x, group=getattr(ctx, f"{axis}_group"))
        sums[axis] = x.item()
    torch_view = device_mesh_view(dp, pp, tp)
    return {"rank": ctx.rank, "coords": ctx.coords, "tp_ranks": ctx.tp_ranks,
            "pp_ranks": ctx.pp_ranks, "dp_ranks": ctx.dp_ranks, "sums": sums,
            "torch": torch_view,
            "agrees_with_torch": torch_view == {"coords": ctx.coords, "dp_ranks": ctx.dp_ranks,
                                               "pp_ranks": ctx.pp_ranks,
                                               "tp_ranks": ctx.tp_ranks}}


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(prog="python -m lessonlib.grid",
                                 description="Print the (dp, pp, tp) grid's rank table.")
    ap.add_argument("dp", type=int)
    ap.add_argument("pp", type=int)
    ap.add_argument("tp", type=int)
    ap.add_argument("--gpus-per-node", type=int, default=None)
    args = ap.parse_args()
    try:
        check_grid(args.dp * args.pp * args.tp, args.dp, args.pp, args.tp, args.gpus_per_node)
    except ValueError as exc:
        ap.error(str(exc))
    print(layout_table(args.dp, args.pp, args.tp, args.gpus_per_node))
