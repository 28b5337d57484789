"""``--fresh`` and pruning delete only what the course wrote: a checkpoint folder that also
holds a user's files is refused with one line naming one of them, and nothing is deleted."""
import pytest
import torch

from lessonlib.long_run import checkpoint, checkpoint_folder

import labrun

META = {"layout": "t1p2d1", "lr": 0.1}
TINY = ["--world-size", "2", "--layout", "t1p2d1", "--layers", "2", "--hidden", "32",
        "--seq", "16", "--global-batch", "8", "--microbatches", "2", "--heads", "2",
        "--checkpoint-every", "10", "--steps", "20"]


def _save(folder, step, world=2, keep=3):
    for rank in range(world):
        checkpoint.write_shard(folder, step, rank, {"w": torch.full((3,), float(rank))})
    return checkpoint.commit(folder, step, world, META, keep)


def _users_files(folder):
    (folder / "notes").mkdir(parents=True)
    (folder / "notes" / "thesis.txt").write_text("two years of work")
    (folder / "ddp.json").write_text("{}")


@pytest.mark.timeout(60)
def test_fresh_refuses_a_folder_with_a_users_notes_and_deletes_nothing(tmp_path):
    _save(tmp_path, 10)
    _users_files(tmp_path)
    done = labrun.run("train", *TINY, "--checkpoint-dir", str(tmp_path), "--fresh")
    assert done.returncode == 2, done.stderr[-800:]
    assert "ddp.json, which is not a checkpoint file; nothing was deleted" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert (tmp_path / "notes" / "thesis.txt").read_text() == "two years of work"
    assert (tmp_path / "ddp.json").exists() and checkpoint.latest(tmp_path).step == 10


def test_clearing_the_working_directory_is_refused(tmp_path, monkeypatch):
    (tmp_path / "README.md").write_text("the course")
    _save(tmp_path, 10)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"checkpoint_dir='\.' holds README.md"):
        checkpoint_folder.clear(".")
    assert (tmp_path / "README.md").exists() and checkpoint.latest(".").step == 10


def test_a_folder_of_checkpoints_only_is_cleared_interrupted_saves_included(tmp_path):
    _save(tmp_path, 10)
    _save(tmp_path, 20)
    checkpoint.write_shard(tmp_path, 30, 0, {})                 # a save killed mid-way
    (checkpoint_folder.step_dir(tmp_path, 30) / ".rank_00001.pt.tmp77").write_bytes(b"half")
    checkpoint_folder.clear(tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("stranger", ["step_00000010/notes.txt", "step_12/rank_00000.pt",
                                      "latest.bak", "step_00000010/sub/rank_00000.pt"])
def test_anything_the_course_did_not_write_is_named(tmp_path, stranger):
    _save(tmp_path, 10)
    path = tmp_path / stranger
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("mine")
    with pytest.raises(ValueError, match="which is not a checkpoint file"):
        checkpoint_folder.clear(tmp_path)
    assert path.exists() and checkpoint.latest(tmp_path).step == 10


def test_pruning_keeps_a_users_file_and_its_folder(tmp_path):
    folder = _save(tmp_path, 10)
    (folder / "my-plot.png").write_bytes(b"png")
    (tmp_path / ".notes.tmp1").write_text("an editor's swap file")
    _save(tmp_path, 20, keep=1)
    assert (folder / "my-plot.png").exists() and not (folder / checkpoint_folder.MANIFEST).exists()
    assert (tmp_path / ".notes.tmp1").exists()
