"""Shards without a manifest are never lost, and a manifest is trusted only field by field.

A step folder that holds every rank's shard but no manifest (the manifest deleted, or the
save killed between the last shard and the manifest) may be the only copy of good weights:
``check_resume`` refuses to write that step again; a run first sets it aside
(``checkpoint.recover``), as ``--fresh`` does: renamed to ``step_*.unverified``, never deleted. A
manifest whose step or world size is of the wrong kind or out of range is named in one line
and skipped like any damaged checkpoint."""
import json

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lessonlib import long_run
from lessonlib.long_run import checkpoint, checkpoint_folder, restart

import labrun

META = {"layout": "t1p2d1", "lr": 0.1}
TINY = ["--world-size", "2", "--layout", "t1p2d1", "--layers", "2", "--hidden", "32",
        "--heads", "2", "--seq", "16", "--global-batch", "4", "--microbatches", "2",
        "--checkpoint-every", "10", "--steps", "20", "--lr", "0.002"]


def _save(folder, step, world=2, keep=3):
    for rank in range(world):
        checkpoint.write_shard(folder, step, rank, {"w": torch.full((3,), float(rank + step))})
    return checkpoint.commit(folder, step, world, META, keep)


def _lose_manifest(folder):
    (folder / checkpoint_folder.MANIFEST).unlink()
    return folder


def _shards(folder):
    return {p.name: p.read_bytes() for p in folder.glob("rank_*.pt")}


def test_shards_without_a_manifest_are_set_aside_not_overwritten(tmp_path):
    """A run of 20 steps, its manifests deleted: ``check_resume`` alone refuses to write
    over them; ``recover`` (what a run does first) sets both aside, their shards intact."""
    for step in (10, 20):
        _lose_manifest(_save(tmp_path, step))
    before = {s: _shards(checkpoint_folder.step_dir(tmp_path, s)) for s in (10, 20)}
    with pytest.raises(ValueError, match=r"step_00000010 holds the shards of ranks 0-1 but no "
                                         r"manifest.json.*nothing was changed.*--set-aside"):
        restart.check_resume(tmp_path, 2, META)
    notes = restart.recover(tmp_path)
    assert [n.split("set aside as ")[1] for n in notes] == [
        "step_00000020.unverified (nothing deleted)", "step_00000010.unverified (nothing deleted)"]
    assert {s: _shards(tmp_path / f"step_{s:08d}.unverified") for s in (10, 20)} == before
    assert restart.check_resume(tmp_path, 2, META) is None


def test_a_held_folder_after_the_newest_verified_step_is_refused(tmp_path):
    _save(tmp_path, 10)
    _lose_manifest(_save(tmp_path, 20))
    with pytest.raises(ValueError, match="step_00000020 holds the shards"):
        restart.check_resume(tmp_path, 2, META)
    assert checkpoint.latest(tmp_path).step == 10   # what the run would resume from


def test_a_held_folder_before_the_resume_point_is_kept_and_never_pruned(tmp_path):
    _lose_manifest(_save(tmp_path, 5))
    for step in (10, 15, 20):
        _save(tmp_path, step, keep=1)
    assert restart.check_resume(tmp_path, 2, META)["step"] == 20
    assert sorted(_shards(checkpoint_folder.step_dir(tmp_path, 5))) == ["rank_00000.pt",
                                                                       "rank_00001.pt"]


def test_an_interrupted_save_is_not_held(tmp_path):
    """A rank killed before or while writing: fewer shards than the world, or a temporary
    file. The next save of that step may overwrite it; a fresh start is allowed."""
    checkpoint.write_shard(tmp_path, 10, 0, {})
    assert checkpoint_folder.held_shards(checkpoint_folder.step_dir(tmp_path, 10), 2) == []
    assert restart.check_resume(tmp_path, 2, META) is None
    checkpoint.write_shard(tmp_path, 10, 1, {})
    (checkpoint_folder.step_dir(tmp_path, 10) / ".rank_00002.pt.tmp7").write_bytes(b"half")
    assert checkpoint_folder.held_shards(checkpoint_folder.step_dir(tmp_path, 10), 2) == []


def test_fresh_and_set_aside_move_held_shards_and_delete_nothing_of_them(tmp_path):
    _save(tmp_path, 5)
    held = _lose_manifest(_save(tmp_path, 10))
    shards = _shards(held)
    checkpoint_folder.clear(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000010.unverified"]
    assert _shards(tmp_path / "step_00000010.unverified") == shards
    checkpoint_folder.clear(tmp_path)                       # set-aside folders are ours: kept
    _lose_manifest(_save(tmp_path, 10))
    moved = checkpoint_folder.set_aside(checkpoint_folder.step_dir(tmp_path, 10))
    assert moved.name == "step_00000010.unverified2" and _shards(moved) == shards


@pytest.mark.timeout(120)
def test_the_lab_sets_held_shards_aside_by_itself_and_starts_afresh(tmp_path):
    _save(tmp_path / "other", 1)                      # keeps the lab's own resume path real
    for step in (10, 20):
        _lose_manifest(_save(tmp_path, step))
    done = labrun.run("train", *TINY, "--checkpoint-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr[-1500:]
    assert "set aside as step_00000010.unverified (nothing deleted)" in done.stderr
    assert "starting at step 0 of 20" in done.stderr
    assert len(_shards(tmp_path / "step_00000020.unverified")) == 2
    assert checkpoint.latest(tmp_path).step == 20


MANIFESTS = {  # what is written into the newest manifest, what the one line names
    "world_size 0": ({"world_size": 0}, "its world_size is 0, not a whole number >= 1"),
    "world_size -1": ({"world_size": -1}, "its world_size is -1, not a whole number >= 1"),
    "world_size 1e12": ({"world_size": 10**12},
                        "its world_size is 1000000000000, but it lists 2 shards"),
    "world_size '2'": ({"world_size": "2"}, "its world_size is '2', not a whole number"),
    "world_size true": ({"world_size": True}, "its world_size is True, not a whole number"),
    "step -5": ({"step": -5}, "its step is -5, not a whole number >= 0"),
    "step 1e30": ({"step": 1e30}, "its step is 1e+30, not a whole number"),
    "step of another folder": ({"step": 20}, "its step is 20, but it lies in the folder of step 10"),
    "meta a list": ({"meta": [1]}, "its meta is [1], not an object"),
}


@pytest.mark.parametrize("probe", list(MANIFESTS))
def test_a_manifest_field_of_the_wrong_kind_is_named_and_the_step_skipped(tmp_path, probe):
    change, words = MANIFESTS[probe]
    _save(tmp_path, 5)
    path = _save(tmp_path, 10) / checkpoint_folder.MANIFEST
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    found = restart.check_resume(tmp_path, 2, META)
    assert found["step"] == 5 and found["world_size"] == 2, found
    (problem,) = found["damaged"]
    assert words in problem and "step_00000010/manifest.json is damaged" in problem
    assert "\n" not in problem


def test_a_manifest_that_is_not_an_object_is_named(tmp_path):
    _save(tmp_path, 5)
    (_save(tmp_path, 10) / checkpoint_folder.MANIFEST).write_text("[1, 2]")
    found = restart.check_resume(tmp_path, 2, META)
    assert found["step"] == 5 and "holds a JSON list, not an object" in found["damaged"][0]


def test_the_resume_step_is_the_folders_never_the_manifests_word(tmp_path):
    """step -5 or 1e30 in the newest manifest: the older step is resumed (and said), not
    "resuming at step -5" while the ranks restore another, nor a refusal of the run."""
    settings = long_run.plan(2, "t1p2d1", steps=40, checkpoint_every=10,
                             checkpoint_dir=str(tmp_path))
    for bad in (-5, 1e30):
        for step in (10, 20):
            for rank in range(2):
                checkpoint.write_shard(tmp_path, step, rank, {"w": torch.zeros(1)})
            checkpoint.commit(tmp_path, step, 2, settings.meta, keep=3)
        path = checkpoint_folder.step_dir(tmp_path, 20) / checkpoint_folder.MANIFEST
        path.write_text(json.dumps({**json.loads(path.read_text()), "step": bad}))
        found = restart.check_resume(tmp_path, 2, settings.meta)
        assert found["step"] == 10 and "its step is" in found["damaged"][0]


# A manifest is input: any JSON in any field is read as a verified checkpoint or named in one
# line and skipped, never a traceback, never a resume at a step that is not its folder's.
JSON = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-10**13, 10**13),
                              st.floats(allow_nan=False), st.text(max_size=3)),
                    lambda inner: st.one_of(st.lists(inner, max_size=3),
                                            st.dictionaries(st.text(max_size=3), inner,
                                                            max_size=3)), max_leaves=6)


@settings(max_examples=30, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(["step", "world_size", "meta", "shards"]), value=JSON)
def test_any_json_in_a_manifest_field_is_verified_or_named_in_one_line(tmp_path, field, value):
    folder = tmp_path / f"case{abs(hash((field, repr(value)))) % 10**9}"
    _save(folder, 5)
    path = _save(folder, 10) / checkpoint_folder.MANIFEST
    path.write_text(json.dumps({**json.loads(path.read_text()), field: value}))
    try:
        found = restart.check_resume(folder, 2, META)
    except ValueError as exc:     # a verified manifest of other settings: refused, named
        assert "step 10) was written by a run with other settings" in str(exc)
        return
    assert found["step"] in (5, 10) and found["step"] == int(found["path"][-8:])
    if found["step"] == 5:
        (problem,) = found["damaged"]
        assert "step_00000010" in problem and "\n" not in problem
