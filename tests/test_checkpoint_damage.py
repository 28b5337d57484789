"""No lost work when a checkpoint is damaged or the run diverges: each probe of a damaged
newest checkpoint (a tensor overwritten, a shard truncated, emptied or missing, a manifest
truncated) is named and the newest intact checkpoint is resumed instead; pruning never lets
a damaged checkpoint push out a good one; a loss that is not finite is never saved."""
import math
import re

import pytest
import torch

from lessonlib import device, long_run
from lessonlib.launcher import RankError, launch
from lessonlib.long_run import checkpoint, checkpoint_folder, restart

import ckpt_workers
import labrun

META = {"layout": "t1p2d1", "lr": 0.1}


def _save(folder, step, world=2, keep=3):
    for rank in range(world):
        weight = torch.arange(64.0) + 100 * rank + step
        checkpoint.write_shard(folder, step, rank, {"model": {"w": weight}, "step": step})
    return checkpoint.commit(folder, step, world, META, keep)


def _truncate(path, keep_bytes):
    path.write_bytes(path.read_bytes()[:keep_bytes])


PROBES = {  # what is done to the newest checkpoint, what the message says
    "a tensor overwritten": (lambda f: ckpt_workers.damage_inside_a_tensor(f / "rank_00001.pt"),
                             "rank_00001.pt is damaged: its SHA-256 differs"),
    "a shard truncated": (lambda f: _truncate(f / "rank_00001.pt", 300),
                          "rank_00001.pt is damaged: 300 bytes, its manifest says"),
    "a shard emptied": (lambda f: _truncate(f / "rank_00001.pt", 0),
                        "rank_00001.pt is damaged: 0 bytes"),
    "a shard missing": (lambda f: (f / "rank_00001.pt").unlink(), "rank_00001.pt is missing"),
    "the manifest truncated": (lambda f: _truncate(f / checkpoint_folder.MANIFEST, 40),
                               "manifest.json is damaged (unreadable"),
}


@pytest.mark.parametrize("probe", list(PROBES))
def test_a_damaged_newest_checkpoint_is_named_and_the_older_intact_one_resumed(tmp_path, probe):
    damage, words = PROBES[probe]
    _save(tmp_path, 5)
    damage(_save(tmp_path, 10))
    found = restart.check_resume(tmp_path, 2, META)
    assert found["step"] == 5 and len(found["damaged"]) == 1, found["damaged"]
    assert words in found["damaged"][0] and "step_00000010" in found["damaged"][0]
    assert checkpoint.load(found["path"], 1)["model"]["w"][0].item() == 105
    if probe != "the manifest truncated":     # the rank side checks the shard it reads, too
        with pytest.raises(checkpoint.CheckpointError, match="rank_00001.pt is (damaged|missing)"):
            checkpoint.load(checkpoint_folder.step_dir(tmp_path, 10), 1)


def test_a_folder_whose_every_checkpoint_is_damaged_is_refused_not_restarted(tmp_path):
    _truncate(_save(tmp_path, 5) / "rank_00000.pt", 0)
    with pytest.raises(ValueError, match="no intact checkpoint .*rank_00000.pt is damaged"):
        restart.check_resume(tmp_path, 2, META)
    checkpoint.write_shard(tmp_path / "killed", 5, 0, {})     # only a save interrupted:
    assert restart.check_resume(tmp_path / "killed", 2, META) is None   # a fresh start


def test_pruning_never_lets_a_damaged_checkpoint_push_out_a_good_one(tmp_path):
    _save(tmp_path, 5)
    _truncate(_save(tmp_path, 10) / "rank_00001.pt", 300)
    _save(tmp_path, 7, keep=2)         # the run resumed from 5, saves 7: 10 is not its own
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_00000005", "step_00000007",
                                                              "step_00000010"]
    with pytest.raises(checkpoint.CheckpointError, match="does not match its manifest"):
        checkpoint.commit(tmp_path, 7, 2, META, keep=1,
                          shards=[{"bytes": 1, "sha256": "00" * 32}] * 2)
    assert checkpoint.latest(tmp_path).step == 5      # nothing pruned on a bad word


def test_a_save_deletes_no_temporary_file_of_another_process(tmp_path):
    """Two runs in one folder: the second died at its shard's rename, because the first's
    cleanup deleted every ``.rank_*.tmp*``. A save deletes only its own temporaries (of a
    write that failed); the next run sets aside a step folder left half-written."""
    folder = _save(tmp_path, 5)
    others = [folder / ".rank_00001.pt.tmp4242", tmp_path / f".{checkpoint_folder.LATEST}.tmp4242"]
    for path in others:
        path.write_bytes(b"another process is writing this")
    _save(tmp_path, 5)
    _save(tmp_path, 10, keep=1)
    assert all(path.exists() for path in others)


def test_load_maps_the_shard_onto_this_ranks_device(tmp_path, monkeypatch):
    """Saved from another GPU index, a shard must come back on the loading rank's device:
    the meta device stands in for that rank's GPU here."""
    _save(tmp_path, 5)
    shard = checkpoint.load(checkpoint_folder.step_dir(tmp_path, 5), 0, map_location="meta")
    assert shard["model"]["w"].device.type == "meta"
    monkeypatch.setattr(device, "current_device", lambda: torch.device("meta"))
    assert checkpoint.load(checkpoint_folder.step_dir(tmp_path, 5), 0)["model"]["w"].is_meta


def test_a_checkpoint_folder_that_is_a_file_is_refused_before_any_rank(tmp_path):
    afile = tmp_path / "notes.txt"
    afile.write_text("not a folder")
    for where, words in ((afile, "is a file, not a folder"), (afile / "ckpt", "lies inside the file")):
        with pytest.raises(ValueError, match=f"checkpoint_dir=.*{words}"):
            long_run.plan(2, "t1p2d1", checkpoint_dir=str(where))
    done = labrun.run("train", "--world-size", "2", "--checkpoint-dir", str(afile))
    assert done.returncode == 2 and f"--checkpoint-dir={str(afile)!r} is a file" in done.stderr


@pytest.mark.timeout(200)
def test_a_diverging_run_stops_on_every_rank_and_keeps_its_good_checkpoints(tmp_path,
                                                                          no_children_left):
    """SGD at lr=10 takes the tiny GPT's loss to NaN within a few steps (measured)."""
    settings = long_run.plan(2, "t1p2d1", optimizer="sgd", lr=10.0, steps=12,
                             checkpoint_every=2, checkpoint_dir=str(tmp_path))
    with pytest.raises(RankError, match=r"diverged: a loss or weight is not finite at step (\d+)") \
            as failed:
        long_run.run(settings, timeout=150)
    at = int(re.search(r"not finite at step (\d+) \(", str(failed.value)).group(1))
    found = checkpoint.latest(tmp_path)
    assert found is not None and found.step < at and f"step {found.step}" in str(failed.value)
    assert max(int(p.name[5:]) for p in tmp_path.glob("step_*")) == found.step
    for rank in range(2):
        shard = checkpoint.load(found.path, rank)
        assert all(torch.isfinite(w).all() for w in shard["model"].values())
        assert all(math.isfinite(x) for step in shard["losses"] for x in step)
    assert len(list(tmp_path.glob("step_*"))) == settings.keep    # both good ones stay


@pytest.mark.timeout(120)
def test_ranks_that_chose_different_checkpoints_all_resume_from_rank_0s(tmp_path,
                                                                     no_children_left):
    """Under torchrun every rank picks its checkpoint by itself; a file damaged between two
    ranks' looks would split them. They resume from rank 0's choice."""
    _save(tmp_path, 5)
    _save(tmp_path, 10)
    cases = [[5, 10], [None, 10], [10, None], [10, 10]]
    ranks = launch(ckpt_workers.agreed_steps, 2, str(tmp_path), cases, timeout=100)
    assert ranks == [[5, None, 10, 10]] * 2
