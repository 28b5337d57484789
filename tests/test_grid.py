"""The (dp, pp, tp) grid: groups, coordinates, the server table, bad input, and PyTorch's
DeviceMesh agreeing rank for rank (one 4-rank launch that builds several layouts)."""
import warnings

import pytest
import torch
import torch.distributed as dist

import lessonlib
from lessonlib.context_parallel.gpt import ContextParallelGrid
from lessonlib.costmodel import group_spans_nodes
from lessonlib.expert_parallel.groups import ExpertParallelContext
from lessonlib.grid import ParallelContext, device_mesh_view
from lessonlib.grid_layout import (GROUP_AXES, GridWarning, axis_groups, check_grid, grid_mesh,
                                   layout_table, placements)

pytestmark = pytest.mark.timeout(120)


def test_tp_is_innermost_and_groups_read_the_mesh_along_one_axis():
    assert grid_mesh(2, 2, 2).tolist() == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
    groups = axis_groups(2, 2, 2)
    assert groups["tp"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert groups["pp"] == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert groups["dp"] == [[0, 4], [1, 5], [2, 6], [3, 7]]


@pytest.mark.parametrize("shape", [(1, 1, 1), (2, 2, 2), (3, 4, 2), (1, 8, 4), (4, 1, 8)])
def test_every_axis_partitions_the_world(shape):
    dp, pp, tp = shape
    world = dp * pp * tp
    for axis, size in zip(("dp", "pp", "tp"), shape):
        groups = axis_groups(dp, pp, tp)[axis]
        assert len(groups) == world // size and all(len(g) == size for g in groups)
        assert sorted(r for g in groups for r in g) == list(range(world))
    for pl in placements(dp, pp, tp):  # rank = (i*p + j)*t + k
        assert pl.rank == (pl.dp * pp + pl.pp) * tp + pl.tp


def test_placements_put_consecutive_ranks_on_a_server():
    table = placements(2, 2, 8, gpus_per_node=8)
    assert [(pl.node, pl.gpu) for pl in table[:9]] == [(0, g) for g in range(8)] + [(1, 0)]
    assert {pl.node for pl in table if pl.dp == 1 and pl.pp == 1} == {3}


def test_layout_table_lists_every_rank_with_server_and_groups():
    text = layout_table(2, 2, 2, gpus_per_node=4)
    lines = text.splitlines()
    assert len(lines) == 2 + 8 and "servers of 4 GPUs" in lines[0]
    # rank 5 = (1, 0, 1), on server 1 as its GPU 1
    assert lines[2 + 5].split()[:6] == ["5", "1", "0", "1", "1", "1"]
    assert "[4, 5]" in lines[2 + 5] and "[5, 7]" in lines[2 + 5] and "[1, 5]" in lines[2 + 5]
    assert "server" not in layout_table(1, 1, 2).splitlines()[1]


@pytest.mark.parametrize("bad", [(8, 2, 2, 3), (8, 3, 2, 2), (6, 1, 1, 4)])
def test_world_size_must_equal_t_p_d(bad):
    world, dp, pp, tp = bad
    with pytest.raises(ValueError, match=f"world_size={world}"):
        check_grid(world, dp, pp, tp)


@pytest.mark.parametrize("setting", ["dp", "pp", "tp"])
@pytest.mark.parametrize("value", [0, -1, 1.5, True])
def test_sizes_must_be_positive_integers(setting, value):
    sizes = {"dp": 1, "pp": 1, "tp": 1, setting: value}
    with pytest.raises(ValueError, match=f"{setting}={value!r}"):
        check_grid(1, **sizes)


def test_hint_lists_layouts_that_would_work():
    with pytest.raises(ValueError, match=r"\(dp, pp\) in \[\(1, 4\), \(2, 2\), \(4, 1\)\]"):
        check_grid(8, 3, 2, 2)


def test_tp_group_that_needlessly_spans_servers_warns_and_says_why():
    with pytest.warns(GridWarning, match=r"ranks \[6, 7, 8\] spans servers \[0, 1\].*NVLink"
                                         r".*tp in \[1, 2, 4, 8\]"):
        check_grid(24, 2, 4, 3, gpus_per_node=8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_grid(64, 2, 4, 8, gpus_per_node=8)   # t = server: fine
        check_grid(32, 2, 1, 16, gpus_per_node=8)  # t = 2 servers, the least it can span
        check_grid(8, 1, 2, 4, gpus_per_node=8)


@pytest.mark.parametrize("dp,pp,tp,gpn", [(2, 4, 3, 8), (2, 2, 8, 8), (1, 2, 16, 8),
                                          (4, 2, 2, 4), (2, 3, 6, 4)])
def test_grid_agrees_with_the_cost_models_view_of_spanning_groups(dp, pp, tp, gpn):
    spans = any(len({r // gpn for r in g}) > 1 for g in axis_groups(dp, pp, tp)["tp"])
    assert spans == group_spans_nodes(dp * pp * tp, tp, 1, gpn)
    spans_dp = any(len({r // gpn for r in g}) > 1 for g in axis_groups(dp, pp, tp)["dp"])
    assert spans_dp == group_spans_nodes(dp * pp * tp, dp, tp * pp, gpn)


def test_context_needs_a_process_group():
    with pytest.raises(ValueError, match="needs a process group"):
        ParallelContext.build(1, 1, 1)


LAYOUTS = [(2, 2, 1), (2, 1, 2), (1, 2, 2), (4, 1, 1), (1, 1, 4)]


def build_many_layouts():
    """On each of 4 ranks: for every layout, our context, one all-reduce per axis, and
    PyTorch's DeviceMesh on the same shape. Also a bad layout, rejected before any group."""
    out = []
    for dp, pp, tp in LAYOUTS:
        ctx = ParallelContext.build(dp, pp, tp)
        sums = []
        for axis in ("dp", "pp", "tp"):
            x = torch.tensor([float(ctx.rank)])
            lessonlib.comm.all_reduce(x, group=ctx.axis(axis).group)
            sums.append(x.item())
        out.append({"ctx": (ctx.coords, *(ctx.axis(a).ranks for a in ("dp", "pp", "tp")),
                            ctx.prev_stage_rank, ctx.next_stage_rank),
                    "sums": sums, "torch": device_mesh_view(dp, pp, tp)})
    out.append(views_and_axes())
    try:
        ParallelContext.build(2, 2, 2)
        out.append("accepted")
    except ValueError as exc:
        out.append(str(exc))
    return out


def views_and_axes() -> dict:
    """Every group the context-parallel and expert-parallel views create, in order, and what
    they read; a (t, c) = (2, 2) context's axis records, and no other name for them."""
    with lessonlib.comm.ledger() as book:
        cp, ep = ContextParallelGrid.build(2), ExpertParallelContext.build(2)
    ctx = ParallelContext.build(1, 1, 2, cp=2)
    out = {"made": [e.ranks for e in book.events if e.op == "new_group"],
           "cp": (cp.dp.size, cp.cp.rank, cp.dp.rank, dist.get_process_group_ranks(cp.cp.group)),
           "ep": (ep.ep.rank, ep.ep.ranks, ep.edp.ranks,
                  dist.get_process_group_ranks(ep.ep.group),
                  dist.get_process_group_ranks(ep.edp.group)),
           "axes": {a: (ctx.axis(a).size, ctx.axis(a).rank, ctx.axis(a).ranks) for a in GROUP_AXES},
           "flat": [name for a in GROUP_AXES for name in (a, f"{a}_rank", f"{a}_group", f"{a}_ranks")
                    if hasattr(ctx, name)]}
    for made in (cp, ep, ctx):
        made.destroy()
    return out


@pytest.fixture(scope="module")
def four_ranks():
    return lessonlib.launch(build_many_layouts, 4, timeout=90)


def test_context_on_four_ranks_matches_device_mesh_and_groups_talk(four_ranks, no_children_left):
    results = four_ranks
    for rank, per_layout in enumerate(results):
        assert "world_size=4" in per_layout[-1]
        for (dp, pp, tp), got in zip(LAYOUTS, per_layout):
            (coords, dp_ranks, pp_ranks, tp_ranks, prev, nxt) = got["ctx"]
            pl = placements(dp, pp, tp)[rank]
            assert coords == (pl.dp, pl.pp, pl.tp)
            assert got["torch"] == {"coords": coords, "dp_ranks": dp_ranks,
                                    "pp_ranks": pp_ranks, "tp_ranks": tp_ranks}
            assert got["sums"] == [float(sum(g)) for g in (dp_ranks, pp_ranks, tp_ranks)]
            assert prev == (pp_ranks[pl.pp - 1] if pl.pp > 0 else None)
            assert nxt == (pp_ranks[pl.pp + 1] if pl.pp < pp - 1 else None)


def test_the_cp_and_ep_views_make_their_groups_in_the_grids_order(four_ranks):
    """The views create only their axes' groups, as the lessons did before they were views
    (the NCCL traces depend on it): c = 2 consecutive ranks, then e = 2 consecutive ranks and
    the ranks e apart holding the same experts."""
    for rank, per_layout in enumerate(four_ranks):
        views = per_layout[len(LAYOUTS)]
        assert views["made"] == [(0, 1), (2, 3), (0, 1), (2, 3), (0, 2), (1, 3)]
        pair, apart = (rank - rank % 2, rank - rank % 2 + 1), (rank % 2, rank % 2 + 2)
        assert views["cp"] == (2, rank % 2, rank // 2, list(pair))
        assert views["ep"] == (rank % 2, pair, apart, list(pair), list(apart))


def test_axes_are_records_read_by_name_only(four_ranks):
    """(t, c) = (2, 2) on 4 ranks: tp pairs, cp ranks 2 apart; ``ctx.axis(name)`` is the only
    way to read an axis (no flat ``ctx.tp_group`` beside it)."""
    for rank, per_layout in enumerate(four_ranks):
        views = per_layout[len(LAYOUTS)]
        pair, apart = (rank - rank % 2, rank - rank % 2 + 1), (rank % 2, rank % 2 + 2)
        assert views["axes"] == {"tp": (2, rank % 2, pair), "pp": (1, 0, (rank,)),
                                 "dp": (1, 0, (rank,)), "cp": (2, rank // 2, apart),
                                 "dp_cp": (2, rank // 2, apart), "ep": (1, 0, (rank,)),
                                 "edp": (1, 0, (rank,))}
        assert views["flat"] == []


def test_only_gives_the_named_axes_whatever_their_sizes():
    assert axis_groups(2, 1, 1, cp=2, only=("cp",)) == {"cp": [[0, 1], [2, 3]]}
    assert axis_groups(4, 1, 1, only=("cp",)) == {"cp": [[0], [1], [2], [3]]}
    assert axis_groups(4, 1, 1, ep=2, only=("ep", "edp")) == {"ep": [[0, 1], [2, 3]],
                                                              "edp": [[0, 2], [1, 3]]}
    everything = axis_groups(2, 2, 2, cp=2, ep=2)
    assert axis_groups(2, 2, 2, cp=2, ep=2, only=GROUP_AXES) == everything
    with pytest.raises(ValueError, match="no axis"):
        axis_groups(2, 1, 1, only=("sp",))
