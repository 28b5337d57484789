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
import pytest
import torch

import labrun
from lessonlib import long_run
from lessonlib.long_run import checkpoint
from lessonlib.long_run.shard_map import Layout, held
from lessonlib.models import GPTConfig

TINY = ["--world-size", "4", "--layers", "2", "--hidden", "32", "--heads", "2", "--seq", "16",
        "--global-batch", "4", "--microbatches", "2", "--checkpoint-every", "10", "--steps",
        "20"]


def _save(folder, step, meta, world=2, keep=2):
    for rank in range(world):
        checkpoint.write_shard(folder, step, rank, {"w": torch.full((3,), float(rank + step))})
    return checkpoint.commit(folder, step, world, meta, keep)


def test_ep_without_a_layout_picks_one_whose_d_it_divides(tmp_path):
    """Not "ep=2 must divide dp=1 ... use ep in [1]": the most stages, then TP, then DP as
    without --ep, within the world / e ranks (t*p = 2 of 4, 4 of 8)."""
    for world, plain, want in ((4, (2, 2, 1), (1, 2, 2)), (8, (4, 2, 1), (2, 2, 2))):
        settings = long_run.plan(world, ep=2, checkpoint_dir=str(tmp_path))
        assert settings["layout"] == want and settings["axes"]["moe"]
        assert long_run.plan(world, checkpoint_dir=str(tmp_path))["layout"] == plain


def _save_shaped(folder, step, settings):
    """A checkpoint of ``settings`` whose shards hold zeros of the shapes its layout places
    on each rank (what ``reshard.mismatch`` reads), without training."""
    layout, cfg = Layout.of(settings["meta"]), GPTConfig(**settings["model"])
    for rank in range(layout.world):
        shapes = [h.shape for h in held(layout, cfg, rank)["model"]]
        checkpoint.write_shard(folder, step, rank, {"model": {
            f"w{i}": torch.zeros(shape) for i, shape in enumerate(shapes)}})
    return checkpoint.commit(folder, step, layout.world, settings["meta"])


def test_a_moe_checkpoint_resumed_without_moe_names_the_flag(tmp_path):
    """Not "moe: checkpoint True, this run None"."""
    model = {"vocab": 27, "seq": 16, "hidden": 32, "heads": 2, "layers": 2}
    _save_shaped(tmp_path, 10, long_run.plan(4, "t1p2d2", model, global_batch=4, ep=2,
                                             checkpoint_dir=str(tmp_path)))
    done = labrun.run("train", *TINY, "--layout", "t1p2d2", "--checkpoint-dir", str(tmp_path))
    assert done.returncode == 2, done.stderr[-800:]
    assert "moe: checkpoint True, this run not set (pass --moe)" in done.stderr
    assert "this run None" not in done.stderr
