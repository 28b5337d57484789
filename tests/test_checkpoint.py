"""No lost work: a checkpoint exists only once complete, and a 2-rank run killed midway
resumes to the same loss curve and the same weights as a run never interrupted, also when
the newest checkpoint was damaged after the kill (it resumes from the one before).

The kill is ``kill -9`` of the lab's parent process only, as when a job is preempted: the
launcher's ranks must notice and exit by themselves. The runs that are killed and resumed are
real command lines; the uninterrupted run, the resumed runs and the refusals call the lab in
this process (tests/labrun.py). One run is killed for the module; each test resumes its own
copy of what the kill left."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import ckpt_workers
import labrun
import psutil
import pytest
import torch

from lessonlib.long_run import checkpoint, checkpoint_folder, restart

LAB = labrun.LABS / "train.py"
# Killed after the checkpoint of step 40 (the one of step 20 kept before it, for the damaged
# newest one), with 80 steps left: the ranks train on for a few steps after the kill, as
# long as it takes them to see their parent gone (rank.py looks every 0.2 s)
STEPS, EVERY, KILL_AFTER = 120, 20, 40
TINY = ["--world-size", "2", "--layout", "t1p2d1", "--layers", "2", "--hidden", "32",
        "--seq", "16", "--global-batch", "8", "--microbatches", "2", "--steps", str(STEPS),
        "--checkpoint-every", str(EVERY), "--timeout", "240"]
META = {"layout": "t1p2d1", "lr": 0.1}


def _lab(*args):
    return labrun.command("train", *args)


# ---------------------------------------------------------------- files only, no processes
def _save(folder, step, world=2, meta=META, keep=2):
    for rank in range(world):
        checkpoint.write_shard(folder, step, rank, {"step": step, "w": torch.full((3,), rank)})
    return checkpoint.commit(folder, step, world, meta, keep)


def test_a_checkpoint_counts_only_once_every_shard_and_the_manifest_are_written(tmp_path):
    assert checkpoint.latest(tmp_path) is None
    assert restart.check_resume(tmp_path, 2, META) is None
    _save(tmp_path, 5)
    checkpoint.write_shard(tmp_path, 10, 0, {"step": 10})  # rank 1 was killed before writing
    with pytest.raises(RuntimeError, match=r"lacks the shards of ranks \[1\]"):
        checkpoint.commit(tmp_path, 10, 2, META)
    found = checkpoint.latest(tmp_path)
    assert found.step == 5 and found.manifest["world_size"] == 2
    assert checkpoint.load(found.path, 1)["w"].tolist() == [1, 1, 1]
    assert not list(tmp_path.rglob("*.tmp*")), "temporary files must be renamed into place"


def test_old_checkpoints_are_pruned_and_a_stale_pointer_is_ignored(tmp_path):
    checkpoint.write_shard(tmp_path, 3, 0, {})          # an incomplete folder from a kill:
    for step in (5, 10, 15):                            # kept (it may hold the only copy)
        _save(tmp_path, step, keep=2)
    assert sorted(p.name for p in tmp_path.glob("step_*")) == [
        "step_00000003", "step_00000010", "step_00000015"]
    (tmp_path / checkpoint_folder.LATEST).write_text("step_00000099")
    assert checkpoint.latest(tmp_path).step == 15


def test_resuming_with_other_settings_names_every_difference(tmp_path):
    _save(tmp_path, 5)
    with pytest.raises(ValueError) as err:
        restart.check_resume(tmp_path, 4, {"layout": "t2p2d1", "lr": 0.1})
    text = str(err.value)
    assert "world_size: checkpoint 2, this run 4" in text
    assert "layout: checkpoint 't1p2d1', this run 't2p2d1'" in text and "lr" not in text
    assert restart.check_resume(tmp_path, 2, META)["step"] == 5


# ---------------------------------------------------------------- kill -9 midway, resume
def _wait_for(what, predicate, timeout, run=None):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        assert run is None or run.poll() is None, f"the run ended (code {run.returncode})"
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def _final_shards(folder):
    found = checkpoint.latest(folder)
    assert found.step == STEPS
    return [checkpoint.load(found.path, rank) for rank in range(2)]


def _assert_same_state(a, b, where=""):
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), f"{where} differs"
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            _assert_same_state(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same_state(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The run nobody kills: (its checkpoint folder, its results)."""
    where = tmp_path_factory.mktemp("uninterrupted")
    done = labrun.run("train", *TINY, "--checkpoint-dir", str(where / "ckpt"), "--json",
                      str(where / "whole.json"))
    assert done.returncode == 0, done.stderr[-3000:]
    return where / "ckpt", json.loads((where / "whole.json").read_text())["results"]["lessonlib"]


def _kill_midway(killed) -> int:
    """Start the lab in ``killed``, ``kill -9`` its parent once the checkpoint of step
    KILL_AFTER is there, wait for its ranks to exit; the newest intact step at the kill."""
    run = subprocess.Popen(_lab(*TINY, "--checkpoint-dir", str(killed)), start_new_session=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for(f"the checkpoint of step {KILL_AFTER}",
                  lambda: getattr(checkpoint.latest(killed), "step", 0) >= KILL_AFTER, 120,
                  run)
        ranks = psutil.Process(run.pid).children(recursive=True)
        os.kill(run.pid, signal.SIGKILL)               # the parent only, as a preemption would
        run.wait(timeout=10)
        _wait_for("every rank of the killed run to exit",
                  lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE
                                  for p in ranks), 30)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    at_kill = checkpoint.latest(killed).step
    assert KILL_AFTER <= at_kill < STEPS, f"the run was not killed midway (step {at_kill})"
    return at_kill


@pytest.fixture(scope="module")
def killed_midway(tmp_path_factory):
    """The run killed midway, once: (its checkpoint folder as the kill left it, the step)."""
    killed = tmp_path_factory.mktemp("killed") / "ckpt"
    return killed, _kill_midway(killed)


def _copy_of(killed_midway, tmp_path):
    """A copy of the killed run's folder for one test to resume (and damage)."""
    killed, at_kill = killed_midway
    return shutil.copytree(killed, tmp_path / "killed"), at_kill


@pytest.mark.timeout(400)
def test_a_run_killed_midway_resumes_to_the_uninterrupted_curve(tmp_path, uninterrupted,
                                                                killed_midway):
    (whole, whole_run), (killed, at_kill) = uninterrupted, _copy_of(killed_midway, tmp_path)

    done = labrun.run("train", *TINY, "--checkpoint-dir", str(killed), "--json",
                      str(tmp_path / "resumed.json"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"resuming at step {at_kill}" in done.stderr
    resumed = json.loads((tmp_path / "resumed.json").read_text())["results"]["lessonlib"]
    assert resumed["resumed_from_step"] == at_kill and whole_run["resumed_from_step"] is None
    assert resumed["steps_run_now"] == STEPS - at_kill
    assert resumed["losses"] == whole_run["losses"]      # the same curve, bit for bit
    assert whole_run["last_loss"] < whole_run["first_loss"] - 0.5
    for a, b in zip(_final_shards(whole), _final_shards(killed)):
        _assert_same_state(a, b, "rank shard")           # weights and optimizer state


@pytest.mark.timeout(400)
def test_a_killed_run_with_a_damaged_newest_checkpoint_resumes_from_the_older_one(
        tmp_path, uninterrupted, killed_midway):
    """Killed, then 32 bytes of a weight in the newest checkpoint overwritten (NaN): the same
    command names the damaged file, sets it aside (with any half-written step after it),
    resumes from the checkpoint before it, and ends on the uninterrupted curve."""
    (whole, whole_run), (killed, at_kill) = uninterrupted, _copy_of(killed_midway, tmp_path)
    ckpt_workers.damage_inside_a_tensor(checkpoint_folder.shard_path(killed, at_kill, 1))

    done = labrun.run("train", *TINY, "--checkpoint-dir", str(killed), "--json",
                      str(tmp_path / "resumed.json"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"step_{at_kill:08d}/rank_00001.pt is damaged: its SHA-256 differs" in done.stderr
    assert f"resuming at step {at_kill - EVERY} of {STEPS}" in done.stderr
    resumed = json.loads((tmp_path / "resumed.json").read_text())["results"]["lessonlib"]
    assert resumed["resumed_from_step"] == at_kill - EVERY
    assert resumed["losses"] == whole_run["losses"]      # the same curve, bit for bit
    for a, b in zip(_final_shards(whole), _final_shards(killed)):
        _assert_same_state(a, b, "rank shard")
    left = [p for p in killed.rglob("*.tmp*") if ".unverified" not in p.parent.name]
    assert not left, "temporary files of the killed saves remain outside the folders set aside"


@pytest.mark.timeout(60)
def test_bad_settings_and_foreign_checkpoints_stop_the_lab_before_any_rank(tmp_path):
    _save(tmp_path, 5, meta={"layout": "t1p2d1"})
    done = labrun.run("train", *TINY, "--checkpoint-dir", str(tmp_path))
    assert done.returncode == 2 and "was written by a run with other settings" in done.stderr
    assert "model: checkpoint None" in done.stderr
    for args, words in ((["--checkpoint-every", "0"], "--checkpoint-every must be a positive"),
                        (["--layout", "t3p1d1"], "--layout t3p1d1"),
                        (["--layout", "two"], "cannot read the layout 'two'"),
                        (["--fail-at", "one"], "write RANK:STEP"),
                        (["--fail-at", "2:5"], "there is no rank 2 in a world of 2")):
        done = labrun.run("train", "--world-size", "2", *args, "--checkpoint-dir",
                          str(tmp_path / "new"))
        assert done.returncode == 2 and words in done.stderr, done.stderr[-500:]


@pytest.mark.timeout(400)
def test_torchrun_restarts_a_killed_rank_and_the_run_resumes(tmp_path, uninterrupted):
    """The cluster path: torchrun --max-restarts starts the ranks again after one dies, and
    they resume from the newest checkpoint (with the rendezvous store not shared: see
    labs/slurm/torchrun.sbatch), and the curve is the uninterrupted one."""
    folder = tmp_path / "elastic"
    env = {**os.environ, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "OMP_NUM_THREADS": "1"}
    args = TINY[2:]                                     # torchrun sets the world size
    log = open(tmp_path / "torchrun.log", "w")  # a file, not a pipe nobody reads until the end
    run = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                            "--nproc-per-node", "2", "--max-restarts", "1", str(LAB), *args,
                            "--checkpoint-dir", str(folder), "--json",
                            str(tmp_path / "elastic.json")],
                           env=env, start_new_session=True, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_for(f"the checkpoint of step {KILL_AFTER}",
                  lambda: getattr(checkpoint.latest(folder), "step", 0) >= KILL_AFTER, 120,
                  run)

        def rank_one():
            for proc in psutil.Process(run.pid).children(recursive=True):
                try:
                    if proc.environ().get("LOCAL_RANK") == "1":
                        return proc
                except psutil.Error:
                    continue
        rank_one().kill()
        at_kill = checkpoint.latest(folder).step
        run.wait(timeout=240)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
        log.close()
    output = (tmp_path / "torchrun.log").read_text()
    assert run.returncode == 0, output[-3000:]
    assert KILL_AFTER <= at_kill < STEPS and "resuming at step" in output
    resumed = json.loads((tmp_path / "elastic.json").read_text())["results"]["lessonlib"]
    assert resumed["resumed_from_step"] is not None
    assert resumed["losses"] == uninterrupted[1]["losses"]


@pytest.mark.timeout(200)
def test_a_failing_rank_is_named_and_the_next_run_resumes_from_the_last_checkpoint(
        tmp_path, uninterrupted, no_children_left):
    """The notebook's path (lessonlib.long_run, no subprocess): rank 1 fails at step 25,
    the launcher names it, the checkpoint of step 20 stays, and the next run continues the
    uninterrupted curve (its first 30 steps: training is causal)."""
    from lessonlib import long_run
    from lessonlib.launcher import RankError

    settings = long_run.plan(2, "t1p2d1", steps=30, checkpoint_dir=str(tmp_path),
                             checkpoint_every=10)
    with pytest.raises(RankError) as failed:
        long_run.run(settings, fail_at=(1, 25), timeout=120)
    assert failed.value.rank == 1 and "simulated failure of rank 1 at step 25" in str(failed.value)
    assert checkpoint.latest(tmp_path).step == 20
    resumed = long_run.run(settings, timeout=120)
    assert resumed.resumed_from_step == 20 and resumed.steps_run_now == 10
    assert resumed.losses == uninterrupted[1]["losses"][:30]
    with pytest.raises(ValueError, match="already at step 30; use steps >= 30"):
        long_run.run(long_run.plan(2, "t1p2d1", steps=20, checkpoint_dir=str(tmp_path)))
