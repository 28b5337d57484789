"""One run per checkpoint folder, and saves that end half-way are finished or set aside.

* A second run in a folder that a live run holds is refused in one line naming the first
  run's process id, before it reads or writes anything; a lock left by a dead process is
  taken over. Cleanup and pruning touch only what this run wrote.
* A save interrupted between the last shard and the manifest (every process killed there,
  or the disk full at the manifest): its temporary manifest, whose hashes match the shards,
  completes it; otherwise the partial step is set aside (renamed, never deleted), never an
  earlier step, and the same command resumes.
* A full disk during a save is one line, and the earlier checkpoints stay intact.
* ``labs/train.py --ep 2`` without ``--layout`` picks a layout whose d is a multiple of 2,
  and a resume that needs ``--moe`` says so."""
import json
import os
import shutil
import signal
import subprocess
import time

import ckpt_workers
import labrun
import psutil
import pytest
import torch

import lessonlib
from lessonlib import long_run
from lessonlib.long_run import checkpoint, checkpoint_folder, folder_lock
from lessonlib.long_run.shard_map import Layout, held
from lessonlib.models import GPTConfig

TINY = ["--world-size", "4", "--layers", "2", "--hidden", "32", "--heads", "2", "--seq", "16",
        "--global-batch", "4", "--microbatches", "2", "--checkpoint-every", "10", "--steps",
        "20"]
TWO = ["--world-size", "2", "--layout", "t1p2d1", "--layers", "2", "--hidden", "16", "--heads",
       "2", "--seq", "8", "--global-batch", "2", "--microbatches", "2", "--timeout", "60"]


def _save(folder, step, meta, world=2, keep=2):
    for rank in range(world):
        checkpoint.write_shard(folder, step, rank, {"w": torch.full((3,), float(rank + step))})
    return checkpoint.commit(folder, step, world, meta, keep)


def test_ep_without_a_layout_picks_one_whose_d_it_divides(tmp_path):
    """Not "ep=2 must divide dp=1 ... use ep in [1]": the most stages, then TP, then DP as
    without --ep, within the world / e ranks (t*p = 2 of 4, 4 of 8)."""
    for world, plain, want in ((4, (2, 2, 1), (1, 2, 2)), (8, (4, 2, 1), (2, 2, 2))):
        settings = long_run.plan(world, ep=2, checkpoint_dir=str(tmp_path))
        assert settings.layout == want and settings.axes["moe"]
        assert long_run.plan(world, checkpoint_dir=str(tmp_path)).layout == plain


def _save_shaped(folder, step, settings):
    """A checkpoint of ``settings`` whose shards hold zeros of the shapes its layout places
    on each rank (what ``reshard.mismatch`` reads), without training."""
    layout, cfg = Layout.of(settings.meta), GPTConfig(**settings.model)
    for rank in range(layout.world):
        shapes = [h.shape for h in held(layout, cfg, rank)["model"]]
        checkpoint.write_shard(folder, step, rank, {"model": {
            f"w{i}": torch.zeros(shape) for i, shape in enumerate(shapes)}})
    return checkpoint.commit(folder, step, layout.world, settings.meta)


def test_a_moe_checkpoint_resumed_without_moe_names_the_flag(tmp_path):
    """Not "moe: checkpoint True, this run None"."""
    model = {"vocab": 27, "seq": 16, "hidden": 32, "heads": 2, "layers": 2}
    _save_shaped(tmp_path, 10, long_run.plan(4, "t1p2d2", model, global_batch=4, ep=2,
                                             checkpoint_dir=str(tmp_path)))
    done = labrun.run("train", *TINY, "--layout", "t1p2d2", "--checkpoint-dir", str(tmp_path))
    assert done.returncode == 2, done.stderr[-800:]
    assert "moe: checkpoint True, this run not set (pass --moe)" in done.stderr
    assert "this run None" not in done.stderr


# ---------------------------------------------------------------- one run per folder
def _wait_for(what, predicate, timeout, run=None):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        assert run is None or run.poll() is None, f"the run ended (code {run.returncode})"
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def _kill(run):
    """``kill -9`` of the lab's parent only (a preemption); wait for its ranks to exit."""
    ranks = psutil.Process(run.pid).children(recursive=True)
    os.kill(run.pid, signal.SIGKILL)
    run.wait(timeout=10)
    _wait_for("the killed run's ranks to exit", lambda: not any(
        p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in ranks), 30)


@pytest.mark.timeout(180)
def test_a_second_run_is_refused_naming_the_first_and_a_killed_run_resumes(tmp_path):
    """The same command started twice: the second stops in one line naming the first's
    process, before it reads or changes the folder. The first, killed at any moment (here
    while it saves every step), leaves its lock to be taken over, and the same command
    resumes (an interrupted save completed or set aside)."""
    folder = tmp_path / "ckpt"
    command = [*TWO, "--checkpoint-every", "1", "--checkpoint-dir", str(folder)]
    first = subprocess.Popen(labrun.command("train", *command, "--steps", "100000"),
                             start_new_session=True, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        _wait_for("the first run's checkpoint of step 3",
                  lambda: getattr(checkpoint.latest(folder), "step", 0) >= 3, 120, first)
        second = labrun.run("train", *command, "--steps", "100000")
        assert second.returncode == 2 and "Traceback" not in second.stderr, second.stderr
        (line,) = second.stderr.strip().splitlines()
        assert f"is in use by another run (process {first.pid} on " in line, line
        assert first.poll() is None                  # the first run trains on, untouched
        _kill(first)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert checkpoint_folder.LOCK in os.listdir(folder)    # left by the dead process
    at_kill = max(checkpoint_folder.steps(folder))
    again = labrun.run("train", *command, "--steps", str(at_kill + 2))
    assert again.returncode == 0, again.stderr[-2000:]
    assert "resuming at step" in again.stderr
    assert checkpoint.latest(folder).step == at_kill + 2
    assert checkpoint_folder.LOCK not in os.listdir(folder)  # released at the end


def test_a_lock_names_its_holder_and_is_released(tmp_path):
    with folder_lock.hold(tmp_path):
        with pytest.raises(ValueError, match=f"in use by another run .process {os.getpid()} on"):
            with folder_lock.hold(tmp_path):
                pass
    with folder_lock.hold(tmp_path):          # released: taken again
        assert (tmp_path / checkpoint_folder.LOCK).read_text().split()[0] == str(os.getpid())


# ---------------------------------------------------------------- interrupted saves
@pytest.fixture(scope="module")
def two_checkpoints(tmp_path_factory):
    """A real 2-rank run's checkpoints of steps 10 and 20."""
    folder = tmp_path_factory.mktemp("run") / "ckpt"
    done = labrun.run("train", *TWO, "--steps", "20", "--checkpoint-every", "10", "--keep", "2",
                      "--checkpoint-dir", str(folder))
    assert done.returncode == 0, done.stderr[-2000:]
    return folder


def _interrupt_at_the_manifest(source, tmp_path, edit=None):
    """A copy of ``source`` whose step 20 was killed between its manifest's write and its
    rename: ``.manifest.json.tmp<pid>`` beside the shards (``edit``: its text changed)."""
    folder = shutil.copytree(source, tmp_path / "ckpt")
    manifest = checkpoint_folder.step_dir(folder, 20) / checkpoint_folder.MANIFEST
    text = manifest.read_text()
    manifest.unlink()
    tmp = manifest.with_name(f".{manifest.name}.tmp4242")
    tmp.write_text(edit(text) if edit else text)
    return folder


@pytest.mark.timeout(120)
def test_a_save_killed_before_its_manifests_rename_is_completed_and_resumed(two_checkpoints,
                                                                              tmp_path):
    """Not "holds the shards of ranks 0-1 but no manifest.json ... set it aside"."""
    folder = _interrupt_at_the_manifest(two_checkpoints, tmp_path)
    done = labrun.run("train", *TWO, "--steps", "22", "--checkpoint-every", "10",
                      "--checkpoint-dir", str(folder))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "completed the interrupted save of step_00000020" in done.stderr
    assert "resuming at step 20 of 22" in done.stderr
    assert checkpoint.latest(folder).step == 22


@pytest.mark.parametrize("edit", [lambda text: text[:len(text) // 2],          # cut short
                                  lambda text: text.replace('"sha256": "', '"sha256": "0', 1)],
                         ids=["cut short", "a hash changed"])
def test_a_temporary_manifest_that_does_not_match_sets_only_that_step_aside(two_checkpoints,
                                                                            tmp_path, edit):
    folder = _interrupt_at_the_manifest(two_checkpoints, tmp_path, edit)
    shards = {p.name: p.read_bytes() for p in checkpoint_folder.step_dir(folder, 20).iterdir()}
    settings = long_run.plan(2, "t1p2d1", {"vocab": 27, "seq": 8, "hidden": 16, "heads": 2,
                                           "layers": 2}, 2, 2, checkpoint_dir=str(folder))
    (note,) = long_run.recover(settings)
    assert "set aside as step_00000020.unverified (nothing deleted)" in note
    moved = folder / "step_00000020.unverified"
    assert {p.name: p.read_bytes() for p in moved.iterdir()} == shards
    assert long_run.resume_point(settings)["step"] == 10          # the earlier step, kept


# ---------------------------------------------------------------- a full disk
@pytest.mark.timeout(120)
def test_a_full_disk_at_a_save_is_one_line_and_the_same_command_resumes(tmp_path, monkeypatch):
    """The disk fills at the manifest of step 20 (every write from then on fails with
    ENOSPC): one line, not a traceback; step 10 intact; no temporary file of the failed
    writes left; with space again, the same command sets step 20 aside and resumes."""
    folder = tmp_path / "ckpt"
    command = [*TWO, "--steps", "20", "--checkpoint-every", "10", "--checkpoint-dir",
               str(folder)]
    real = lessonlib.run
    with monkeypatch.context() as patch:
        patch.setattr(lessonlib, "run", lambda fn, *args, **kwargs: real(
            ckpt_workers.train_on_a_full_disk, *args, **kwargs))
        full = labrun.run("train", *command)
    assert full.returncode == 1 and "Traceback" not in full.stderr, full.stderr[-3000:]
    last = full.stderr.strip().splitlines()[-1]
    assert last.startswith("labs/train.py: ") and "manifest.json could not be written (No " \
        "space left on device); the checkpoints saved before it are intact" in last, last
    assert checkpoint.latest(folder).step == 10
    assert not list(folder.rglob("*.tmp*"))
    again = labrun.run("train", *command, "--json", str(tmp_path / "again.json"))
    assert again.returncode == 0, again.stderr[-2000:]
    assert "set aside as step_00000020.unverified" in again.stderr
    assert json.loads((tmp_path / "again.json").read_text())["results"]["lessonlib"][
        "resumed_from_step"] == 10
    assert checkpoint.latest(folder).step == 20


def test_a_lock_file_the_course_did_not_write_is_refused_and_kept(tmp_path):
    (tmp_path / checkpoint_folder.LOCK).write_text("my notes about this run\n")
    with pytest.raises(ValueError, match="did not write"):
        with folder_lock.hold(tmp_path):
            pass
    assert (tmp_path / checkpoint_folder.LOCK).read_text() == "my notes about this run\n"
