"""A checkpoint is trusted only when verified: a manifest without a hash for a shard, a shard
it does not list, or a layout its shards do not hold is named in one line and skipped for the
newest verified step; it is never the reason a verified one is pruned, and a folder without a
manifest is never pruned."""
import json
import shutil
from dataclasses import replace

import pytest
import torch

from lessonlib import long_run
from lessonlib.long_run import checkpoint, checkpoint_folder, restart

import labrun

META = {"layout": "t1p2d1", "lr": 0.1}
MODEL = {"vocab": 27, "seq": 16, "hidden": 32, "heads": 2, "layers": 2}


def _save(folder, step, world=2, keep=3):
    for rank in range(world):
        checkpoint.write_shard(folder, step, rank, {"w": torch.full((3,), float(rank + step))})
    return checkpoint.commit(folder, step, world, META, keep)


def _edit_manifest(folder, change):
    path = folder / checkpoint_folder.MANIFEST
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))


def _flip_a_bit(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))


UNVERIFIED = {  # what is done to the newest manifest, what the one line says
    "no shards at all": (lambda m: m.pop("shards"), "lists no SHA-256 for its shards"),
    "one shard's entry gone": (lambda m: m["shards"].pop("rank_00001.pt"),
                               "rank_00001.pt is not listed in"),
    "one shard's hash gone": (lambda m: m["shards"]["rank_00001.pt"].pop("sha256"),
                              "lists no size and SHA-256 for rank_00001.pt"),
}


@pytest.mark.parametrize("probe", list(UNVERIFIED))
def test_an_unverified_newest_checkpoint_is_named_and_skipped(tmp_path, probe):
    change, words = UNVERIFIED[probe]
    _save(tmp_path, 5)
    newest = _save(tmp_path, 10)
    _edit_manifest(newest, change)
    _flip_a_bit(newest / "rank_00001.pt")
    found = restart.check_resume(tmp_path, 2, META)
    assert found["step"] == 5 and len(found["damaged"]) == 1
    assert words in found["damaged"][0] and "\n" not in found["damaged"][0]
    with pytest.raises(checkpoint.CheckpointError):
        checkpoint.load(newest, 1)
    _save(tmp_path, 7, keep=2)                    # the resumed run saves again
    assert checkpoint.latest(tmp_path).step == 7
    assert (checkpoint_folder.step_dir(tmp_path, 5) / checkpoint_folder.MANIFEST).exists()


def test_only_unverified_checkpoints_are_refused_naming_the_file(tmp_path):
    _edit_manifest(_save(tmp_path, 5), lambda m: m.pop("shards"))
    with pytest.raises(ValueError, match="no intact checkpoint .*lists no SHA-256"):
        restart.check_resume(tmp_path, 2, META)


def test_folders_without_a_manifest_are_never_pruned(tmp_path):
    for step in (5, 10):
        (_save(tmp_path, step) / checkpoint_folder.MANIFEST).unlink()
    found, problems = checkpoint.scan(tmp_path)
    assert found is None and len(problems) == 2 and "(incomplete)" in problems[0]
    _save(tmp_path, 1, keep=1)                    # a fresh start in the same folder
    _save(tmp_path, 2, keep=1)
    assert all(checkpoint_folder.shard_path(tmp_path, s, 1).exists() for s in (5, 10))


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    """Checkpoints of steps 10 and 20 from a real 2-rank t1p2d1 run."""
    folder = tmp_path_factory.mktemp("run")
    settings = long_run.plan(2, "t1p2d1", MODEL, 8, 2, steps=20, checkpoint_every=10,
                             checkpoint_dir=str(folder / "ckpt"))
    long_run.run(settings, timeout=120)
    return settings


@pytest.mark.timeout(180)
@pytest.mark.parametrize("layout", ["t2p1d1", "t1p1d2", "t1p4d1"])
def test_a_manifest_whose_layout_its_shards_do_not_hold_is_skipped(real_run, tmp_path, layout):
    folder = tmp_path / "ckpt"
    shutil.copytree(real_run.checkpoint_dir, folder)
    _edit_manifest(checkpoint_folder.step_dir(folder, 20),
                   lambda m: m["meta"].update(layout=layout))
    found = long_run.resume_point(replace(real_run, checkpoint_dir=str(folder)))
    assert found["step"] == 10 and len(found["damaged"]) == 1, found["damaged"]
    assert "step_00000020/manifest.json is damaged: its layout " + layout in found["damaged"][0]


@pytest.mark.timeout(180)
def test_the_lab_names_the_unverified_checkpoint_and_resumes_from_the_verified_one(real_run,
                                                                                 tmp_path):
    folder = tmp_path / "ckpt"
    shutil.copytree(real_run.checkpoint_dir, folder)
    _edit_manifest(checkpoint_folder.step_dir(folder, 20), lambda m: m.pop("shards"))
    _flip_a_bit(checkpoint_folder.shard_path(folder, 20, 1))
    done = labrun.run("train", "--world-size", "2", "--layout", "t1p2d1", "--layers", "2",
                      "--hidden", "32", "--heads", "2", "--seq", "16", "--global-batch", "8",
                      "--microbatches", "2", "--checkpoint-every", "10", "--steps", "20",
                      "--checkpoint-dir", str(folder))
    assert done.returncode == 0, done.stderr[-1500:]
    assert "skipping a newer checkpoint: " in done.stderr and "lists no SHA-256" in done.stderr
    assert "resuming at step 10 of 20" in done.stderr
    assert checkpoint.latest(folder).step == 20
