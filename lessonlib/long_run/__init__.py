"""A long run: training that survives being killed, and resumes on any layout.

What it teaches: a run of weeks on thousands of GPUs meets failed GPUs, lost nodes and
preempted jobs; what saves it is a checkpoint every N steps that proves itself on load, and
a restart that continues the *same* run, on the same layout or another. Read in this order,
each file one idea:

* ``training``: the tiny GPT on any (t, c, p, d, e) layout, saving every N steps and
  resuming from the newest complete checkpoint (``plan``, ``run``, ``train``; ``Diverged``
  stops a run whose loss is not finite before it is saved);
* ``checkpoint``: sharded checkpoints: every rank writes its own shard, one manifest with
  each shard's size and SHA-256 commits them, and ``load`` proves each file is the one saved;
* ``checkpoint_folder``: the files a checkpoint folder holds, by name: the only ones the
  course ever deletes (shards without a manifest are set aside, never deleted);
* ``folder_lock``: one run per checkpoint folder (a second one is refused, naming the first);
* ``checkpoint_manifest``: a manifest read as a validated record, each field's type and range;
* ``restart``: what a run in a used folder does first: an interrupted save completed or set
  aside, the checkpoint to resume from chosen and its settings compared;
* ``shard_map``: where every number a rank holds sits in the full model, on any layout,
  ZeRO-1 and FSDP included;
* ``reshard``: resume on another layout, one old shard and one slice at a time.

    from lessonlib import long_run as lr
    print(lr.run(lr.plan(2, steps=40, checkpoint_dir="results/ckpt")).losses[-1])

Laptop:  the two lines above, or ``python labs/train.py --world-size 2``
GPU box: ``torchrun --nproc-per-node 8 --max-restarts 3 labs/train.py --layout t2p2d2``
"""
from lessonlib.long_run.training import (SMALL, Diverged, RunResult, RunSettings, RunSummary,
                                        plan, recover, resume_point, run, summary, train)

__all__ = ["SMALL", "Diverged", "RunResult", "RunSettings", "RunSummary", "plan", "recover",
           "resume_point", "run", "summary", "train"]
