"""Checkpoints of five-axis layouts: the table of where each number sits (``shard_map``),
resharding box by box across (t, c, p, d, e) and ZeRO-1/FSDP, and a five-axis run killed,
resumed on its layout to the same curve, and resumed on another layout.

Why a tolerance after a resume on another layout: it adds the same numbers in another order
(the c ranks' gradient sum becomes d replicas', FSDP reduce-scatters), so a float32 loss may
differ in its last bits. Measured once (2-core machine): t1c2p2d1 with ZeRO-1 resumed at
step 3 as t1p2d2 with FSDP, the next 3 losses differed by at most 5.7e-8 relative; the 1e-6
of tests/test_reshard.py leaves a margin of 17 and is far below a wrong resume (AdamW's
moments restarted from zero: 3e-4). On its own layout the resume is bit for bit."""
import shutil

import pytest
import torch

from lessonlib import long_run
from lessonlib.grid_layout import layout_name, parse_axes
from lessonlib.launcher import RankError, launch
from lessonlib.long_run import checkpoint, reshard, shard_map
from lessonlib.long_run.shard_map import Layout
from lessonlib.models import GPTConfig

import ckpt_workers
import labrun

CFG = GPTConfig(**long_run.SMALL)
LOSS_TOLERANCE = {"rtol": 1e-6, "atol": 0.0}
LAYOUTS = [Layout(2, 1, 2, 1), Layout(1, 2, 2, 1, 1, "zero1"), Layout(1, 1, 2, 2, 1, "fsdp"),
           Layout(2, 2, 1, 1, 1, "fsdp"), Layout(4, 1, 1, 1, 1, "zero1"),
           Layout(2, 1, 1, 2, 2, "none", True), Layout(1, 1, 1, 1, 1, "zero1", True)]


def _full(moe: bool, seed: int = 1) -> dict:
    """Full weights and two moments, random, by full name."""
    gen = torch.Generator().manual_seed(seed)
    shapes = shard_map.dense_shapes(CFG, moe)
    return {key: {n: torch.randn(s, generator=gen) for n, s in shapes.items()}
            for key in ("param", "exp_avg", "exp_avg_sq")}


def _meta(layout: Layout) -> dict:
    meta = {"layout": layout_name(dp=layout.d, pp=layout.p, tp=layout.t, cp=layout.c,
                                  ep=layout.e),
            "model": long_run.SMALL}
    if (layout.c, layout.e, layout.shard, layout.moe) != (1, 1, "none", False):
        meta |= {"shard": layout.shard} | (
            {"moe": True} if layout.moe else {})
    return meta


def _save_as(folder, full: dict, layout: Layout, step: int = 3):
    """Write ``full`` as ``layout`` would have: each rank what ``shard_map.held`` says."""
    for rank in range(layout.world):
        where = shard_map.held(layout, CFG, rank)
        model = {str(i): ckpt_workers.held_from_full(full["param"], h)
                 for i, h in enumerate(where["model"])}
        state = {j: {"step": torch.tensor(1.0),
                     **{k: ckpt_workers.held_from_full(full[k], h) for k in ("exp_avg", "exp_avg_sq")}}
                 for j, h in enumerate(where["moments"])}
        checkpoint.write_shard(folder, step, rank, {
            "model": model, "optimizer": {"state": state, "param_groups": []}, "step": step,
            "losses": [[2.0], [1.0], [0.5]], "coords": [0, 0, 0]})
    checkpoint.commit(folder, step, layout.world, _meta(layout))
    return checkpoint.latest(folder).manifest


def test_five_axis_names_read_back_and_a_three_axis_manifest_is_c_e_1():
    assert parse_axes("t2c2p1d1") == (2, 2, 1, 1, 1) and parse_axes("t1p2d2e2") == (1, 1, 2, 2, 2)
    assert parse_axes("t2p2d2") == (2, 1, 2, 2, 1)
    with pytest.raises(ValueError, match=r"write t<t>\[c<c>\]p<p>d<d>\[e<e>\]"):
        parse_axes("t2x2")
    old = Layout.of({"layout": "t2p2d1"})
    assert (old.c, old.e, old.shard, old.moe) == (1, 1, "none", False)
    with pytest.raises(ValueError, match=r"order 'tp-cp-dp-pp', which this course no longer"):
        Layout.of({"layout": "t1c2p2d1", "shard": "zero1", "order": "tp-cp-dp-pp"})


def test_a_flat_range_is_at_most_three_row_major_boxes():
    assert shard_map.flat_boxes((3, 4), 2, 11) == [((0, 1), (2, 4)), ((1, 2), (0, 4)),
                                                   ((2, 3), (0, 3))]
    assert shard_map.flat_boxes((3, 4), 4, 12) == [((1, 3), (0, 4))]
    assert shard_map.flat_boxes((5,), 1, 3) == [((1, 3),)]


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_every_five_axis_layout_holds_the_whole_model(layout):
    """Writing back what every rank holds (weights, and moments) rebuilds every full tensor,
    each element covered."""
    full = _full(layout.moe)
    for key, kind in (("param", "model"), ("exp_avg", "moments")):
        hit = {n: torch.zeros(q.shape, dtype=torch.bool) for n, q in full[key].items()}
        for rank in range(layout.world):
            for h in shard_map.held(layout, CFG, rank)[kind]:
                held = ckpt_workers.held_from_full(full[key], h)
                for seg in h.segments:
                    box = tuple(slice(a, b) for a, b in seg.box)
                    assert torch.equal(shard_map.box_view(held, seg, seg.box), full[key][seg.name][box])
                    hit[seg.name][box] = True
        assert all(bool(h.all()) for h in hit.values()), (layout, key)


@pytest.mark.parametrize("saved,loaded", [
    (Layout(2, 1, 2, 1), Layout(1, 2, 2, 1, 1, "zero1")),            # (t, p, d) -> c, ZeRO-1
    (Layout(1, 2, 2, 1, 1, "zero1"), Layout(1, 1, 2, 2, 1, "fsdp")),
    (Layout(2, 2, 1, 1, 1, "fsdp"), Layout(1, 1, 1, 1)),             # -> lesson 05's run
    (Layout(2, 1, 1, 2, 2, "none", True), Layout(1, 1, 1, 1, 1, "zero1", True))],
    ids=str)
def test_resharding_gives_every_rank_exactly_what_its_layout_holds(tmp_path, saved, loaded):
    full = _full(saved.moe)
    found = _save_as(tmp_path, full, saved)
    assert reshard.mismatch(found) is None
    for rank in range(loaded.world):
        where = shard_map.held(loaded, CFG, rank)
        names = [str(i) for i in range(len(where["model"]))]
        got = reshard.load(found, CFG, loaded, rank, names, where="cpu")
        assert got["step"] == 3 and got["losses"] == [[2.0], [1.0], [0.5]]
        for name, h in zip(names, where["model"]):
            assert torch.equal(got["model"][name], ckpt_workers.held_from_full(full["param"], h))
        for j, h in enumerate(where["moments"]):
            for key in ("exp_avg", "exp_avg_sq"):
                want = ckpt_workers.held_from_full(full[key], h)
                assert torch.equal(got["optimizer"]["state"][j][key], want), (rank, j, key)
            assert got["optimizer"]["state"][j]["step"].item() == 1.0


def test_a_replica_is_opened_only_for_what_is_still_lacking(tmp_path, monkeypatch):
    """Saved at t2p1d2 (ranks 0-1 one replica, 2-3 the other), loaded on one rank: ranks 0
    and 1 fill it, rank 2 is opened for its losses only, rank 3 not at all."""
    found = _save_as(tmp_path, _full(False), Layout(2, 1, 1, 2))
    opened, open_mapped = [], reshard.open_mapped
    monkeypatch.setattr(reshard, "open_mapped",
                        lambda found, rank: opened.append(rank) or open_mapped(found, rank))
    names = [str(i) for i in range(len(shard_map.held(Layout(1, 1, 1, 1), CFG, 0)["model"]))]
    reshard.load(found, CFG, Layout(1, 1, 1, 1), 0, names, where="cpu")
    assert opened == [0, 1, 2]


def test_a_manifest_whose_axes_do_not_fit_its_shards_is_named(tmp_path):
    found = _save_as(tmp_path, _full(False), Layout(1, 2, 2, 1, 1, "zero1"))
    wrong_world = {**found, "meta": {**found["meta"], "layout": "t1c2p2d2"}}
    assert "has 8 ranks, its world_size says 4" in reshard.mismatch(wrong_world)
    wrong_shard = {**found, "meta": {**found["meta"], "shard": "fsdp"}}
    assert "holds other tensors than that layout places on rank 0" in reshard.mismatch(wrong_shard)


def test_a_five_axis_plan_refuses_before_any_process(tmp_path):
    with pytest.raises(ValueError, match="ep=2 needs experts: use moe=True"):
        long_run.plan(4, "t1p1d4", ep=2, moe=False, checkpoint_dir=str(tmp_path))
    with pytest.raises(ValueError, match="cp=3 must divide world_size=4"):
        long_run.plan(4, "t1p1d1", cp=3, checkpoint_dir=str(tmp_path))
    meta = long_run.plan(4, "t1p2d1", cp=2, shard="zero1", checkpoint_dir=str(tmp_path)).meta
    assert (meta["layout"], meta["shard"], "order" in meta) == ("t1c2p2d1", "zero1", False)
    assert "shard" not in long_run.plan(2, "t1p2d1", checkpoint_dir=str(tmp_path)).meta


@pytest.mark.timeout(150)
def test_the_map_is_what_the_five_axis_trainer_holds(no_children_left):
    cases = [(1, 2, 2, 1, 1, "zero1", False, False), (1, 1, 2, 2, 1, "fsdp", False, False),
             (2, 2, 1, 1, 1, "none", True, False), (2, 1, 1, 2, 2, "none", False, True)]
    ranks = launch(ckpt_workers.axes_against_map, 4, long_run.SMALL, cases, timeout=120)
    assert all(all(r) for r in ranks), ranks


@pytest.mark.timeout(300)
def test_a_five_axis_run_killed_resumes_to_its_curve_and_on_another_layout(tmp_path,
                                                                           no_children_left):
    """t1c2p2d1 with ZeRO-1 (AdamW's moments sharded over the c ranks) on 4 ranks: rank 1
    fails at step 5, the checkpoint of step 3 stays; resumed on its layout the curve is the
    uninterrupted run's bit for bit; resumed as t1p2d2 with FSDP, to float rounding."""
    def plan(folder, layout="t1p2d1", **axes):
        return long_run.plan(4, layout, steps=6, checkpoint_every=3,
                             checkpoint_dir=str(tmp_path / folder), **axes)

    whole = long_run.run(plan("whole", cp=2, shard="zero1"), timeout=200)
    with pytest.raises(RankError, match="simulated failure of rank 1 at step 5"):
        long_run.run(plan("killed", cp=2, shard="zero1"), fail_at=(1, 5), timeout=200)
    assert checkpoint.latest(tmp_path / "killed").step == 3
    shutil.copytree(tmp_path / "killed", tmp_path / "moved")
    same = long_run.run(plan("killed", cp=2, shard="zero1"), timeout=200)
    assert same.resumed_from_step == 3 and same.losses == whole.losses
    moved = long_run.run(plan("moved", "t1p2d2", shard="fsdp"), timeout=200)
    assert (moved.resumed_from_step, moved.resumed_from_layout) == (3, "t1c2p2d1")
    assert moved.losses[:3] == whole.losses[:3]
    torch.testing.assert_close(torch.tensor(moved.losses[3:], dtype=torch.float64),
                               torch.tensor(whole.losses[3:], dtype=torch.float64),
                               **LOSS_TOLERANCE)


LAB = ["--layers", "2", "--hidden", "32", "--seq", "16", "--global-batch", "8",
       "--microbatches", "2", "--checkpoint-every", "2", "--timeout", "200"]


def test_the_lab_refuses_bad_axes_in_one_line_before_any_process(tmp_path):
    done = labrun.run("train", "--world-size", "4", "--layout", "t1p1d4", "--ep", "2",
                      "--shard", "zero1", *LAB, "--checkpoint-dir", str(tmp_path))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert ("--layout t1p1d4 --ep 2 --shard zero1: ep=2 with cp=1, shard='zero1'"
            in done.stderr.splitlines()[-1])


@pytest.mark.timeout(240)
def test_a_three_axis_checkpoint_of_the_lab_resumes_on_a_five_axis_layout(tmp_path,
                                                                          no_children_left):
    """lesson 05's trainer saves t1p2d1 on 2 ranks (a manifest without c, e or sharding);
    the lab resumes it on 4 ranks as t1c2p2d1 with ZeRO-1, resharded."""
    folder = ["--checkpoint-dir", str(tmp_path / "ckpt")]
    first = labrun.run("train", "--world-size", "2", "--layout", "t1p2d1", "--steps", "2",
                       *LAB, *folder)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "shard" not in checkpoint.latest(tmp_path / "ckpt").meta
    record = labrun.run_lab("train", "--world-size", "4", "--layout", "t1p2d1", "--cp", "2",
                            "--shard", "zero1", "--steps", "4", *LAB, *folder, tmp_path=tmp_path)
    row = record["rows"][0]
    assert (row["layout"], row["shard"], row["resumed_from_step"]) == ("t1c2p2d1", "zero1", 2)
    assert checkpoint.latest(tmp_path / "ckpt").meta["shard"] == "zero1"


def test_a_checkpoint_in_a_retired_rank_order_is_named_so_not_called_damaged(tmp_path):
    from lessonlib.long_run.reshard import mismatch
    found = {"path": str(tmp_path), "world_size": 4,
             "meta": {"layout": "t1c2p2d1", "model": {}, "order": "tp-cp-dp-pp"}}
    line = mismatch(found)
    assert "cannot be resumed" in line and "'tp-cp-dp-pp'" in line and "damaged" not in line
