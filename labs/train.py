"""The long run: train the tiny GPT for minutes on any (t, p, d) layout, kill it, resume it.

Every ``--checkpoint-every`` steps each rank saves its shard (its stage's weights, split over
its TP group, and the optimizer state of those weights) with ``lessonlib.long_run.checkpoint``. Kill
the run at any moment (Ctrl-C, ``kill -9``, a preempted job) and run the same command again:
it resumes from the newest complete checkpoint and continues the same loss curve, step for
step, because the data of step k depends only on k and the RNG state travels with the
weights (``lessonlib.long_run``). Each checkpoint's manifest holds every shard's size and
SHA-256: a damaged newest checkpoint (a file truncated, emptied, missing or overwritten) is
named and the run resumes from the newest intact one. A checkpoint saved on another layout
or world size is resharded onto this one (``lessonlib.long_run.reshard``); one written with another
model, batch, learning rate, optimizer or seed is refused before any process starts, with
the settings that differ, as is a ``--checkpoint-dir`` that is a file. A loss that is not
finite (``--lr`` too high) stops the run with one line, before that step is saved, as does a
full disk (the earlier checkpoints stay intact). One run holds the folder at a time: a second
one is refused, naming the first's process (``lessonlib.long_run.folder_lock``). A save killed
between its last shard and its manifest is completed when its temporary manifest matches
every shard; otherwise that step folder, and any newer one, is set aside as
``step_*.unverified`` (renamed, nothing deleted) and the run resumes from the newest verified
checkpoint (``--set-aside`` does the same, and is kept for the scripts that pass it).
``--fail-at RANK:STEP`` makes one rank fail, to rehearse a crash.

Beyond three axes, as ``labs/hybrid.py`` names them: ``--cp C`` (context parallelism),
``--ep E`` (expert parallelism inside d, on the MoE tiny GPT; ``--moe`` alone trains it at
e = 1), ``--sp`` (sequence parallelism with TP) and ``--shard zero1|fsdp`` (the optimizer
state, or the weights too, sharded over the d*c ranks of a stage) train on
``lessonlib.hybrid``'s trainer; the checkpoint records the five axes (``t1c2p2d1``) and the
sharding, each rank saves what it holds, and a resume on any other such layout is resharded.

Laptop:  python labs/train.py --world-size 2 --checkpoint-dir results/ckpt --json results/t.json
         (a minute or two on a laptop: 600 steps of 1F1B on 2 pipeline stages);
         python labs/train.py --world-size 4 --layout t1p2d1 --cp 2 --shard zero1 ...
GPU box: TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --nproc-per-node 8 --max-restarts 3 \\
             labs/train.py --layout t2p2d2 --checkpoint-dir /shared/ckpt
         (torchrun restarts failed workers and they resume; the variable keeps the restarted
         ranks from reading the failed ones' addresses, pytorch/pytorch issue 135712)
"""
import contextlib
import os
import sys
from dataclasses import asdict

import torch

import lessonlib
from lessonlib import long_run
from lessonlib.data_parallel.parallelize import SHARDS
from lessonlib.hybrid.trainer import HybridTrainer
from lessonlib.lab import labargs, labkit
from lessonlib.long_run import checkpoint, checkpoint_folder, folder_lock


# The flag that sets each recorded setting a resume must match (the model's are several)
FLAGS = {"lr": "--lr", "optimizer": "--optimizer", "seed": "--seed", "moe": "--moe",
         "global_batch": "--global-batch"}


def check_settings(ap, args) -> long_run.RunSettings:
    labargs.check_positive(ap, args, "world-size", "steps", "checkpoint-every", "keep")
    labargs.check_number(ap, args, "lr")
    model = labargs.gpt_model(ap, args)
    try:
        checkpoint_folder.check_directory(args.checkpoint_dir, "--checkpoint-dir")
    except ValueError as exc:
        ap.error(str(exc))
    try:   # what is left to fail is the layout against the world, the model and the batch
        return long_run.plan(args.world_size, args.layout, model, args.global_batch,
                             args.microbatches, args.lr, args.optimizer, args.seed, args.steps,
                             args.checkpoint_dir, args.checkpoint_every, args.keep, args.cp,
                             args.ep, args.shard, args.sp, args.moe or args.ep > 1)
    except ValueError as exc:
        beyond = "".join(f" --{k} {v}" for k, v in (("cp", args.cp), ("ep", args.ep),
                                                     ("shard", args.shard)) if v not in (1, "none"))
        flags = " --sp" * args.sp + " --moe" * args.moe
        ap.error(f"--layout {args.layout or '(default)'}{beyond}{flags}: {exc}")


def fail_at(ap, text: str | None, world_size: int) -> tuple[int, int] | None:
    if text is None:
        return None
    rank, _, step = text.partition(":")
    if not (rank.isdigit() and step.isdigit() and int(step) > 0):
        ap.error(f"--fail-at {text!r}: write RANK:STEP, e.g. 1:25")
    if int(rank) >= world_size:
        ap.error(f"--fail-at {text}: there is no rank {rank} in a world of {world_size}; use "
                 f"a rank from 0 to {world_size - 1}")
    return int(rank), int(step)


def check_run(ap, args, held: contextlib.ExitStack) -> long_run.RunSettings:
    """Every setting, the checkpoint folder and the checkpoint to resume from, checked (or
    cleared with ``--fresh``) before any process starts. The folder is held for the run
    (``held``, closed at its end): a second run in it stops here, naming this one's process;
    then an interrupted save is completed or set aside (``long_run.recover``)."""
    settings = check_settings(ap, args)
    args.failure = fail_at(ap, args.fail_at, args.world_size)
    args.resume = None
    if not lessonlib.launcher.is_main_process():
        return settings    # under torchrun rank 0 alone reads the folder; the others follow it
    try:
        held.enter_context(folder_lock.hold(args.checkpoint_dir, "--checkpoint-dir"))
    except ValueError as exc:
        ap.error(str(exc))
    if args.set_aside and lessonlib.launcher.under_torchrun():
        ap.error("--set-aside renames folders once, before a run: run it with python "
                 "labs/train.py (which then trains), not under torchrun, whose workers all "
                 "read the folder at once")
    if args.set_aside:
        found = checkpoint.latest(args.checkpoint_dir)
        for folder in checkpoint_folder.held_ahead(args.checkpoint_dir, args.world_size,
                                                   found.manifest if found else None):
            moved = checkpoint_folder.set_aside(folder)
            print(f"labs/train.py: set {folder} aside as {moved.name} (shards without a "
                  f"manifest; nothing deleted)", file=sys.stderr)
    if args.fresh:
        try:    # only the course's own files; a folder holding anything else is refused
            checkpoint_folder.clear(args.checkpoint_dir, "--checkpoint-dir")
        except ValueError as exc:
            ap.error(str(exc))
        return settings
    try:
        for note in long_run.recover(settings):
            print(f"labs/train.py: {note}", file=sys.stderr)
    except checkpoint.SaveFailed as exc:         # the disk is still full
        sys.exit(f"labs/train.py: {exc}")
    try:
        args.resume = long_run.resume_point(settings, FLAGS)
    except ValueError as exc:
        ap.error(str(exc))
    return settings


def measure(args, settings: long_run.RunSettings) -> dict:
    resume = args.resume
    if lessonlib.launcher.is_main_process():
        # Interrupted saves when starting afresh (kept on disk: never pruned), or what made
        # each newer checkpoint untrustworthy: never skipped in silence
        skipped = resume["damaged"] if resume else checkpoint.scan(args.checkpoint_dir)[1]
        for problem in skipped:
            print(f"labs/train.py: skipping a newer checkpoint: {problem}", file=sys.stderr)
        start = f"resuming at step {resume['step']}" if resume else "starting at step 0"
        if resume and any(resume["meta"].get(k) != settings.meta.get(k)
                          for k in ("layout", "shard", "order")):
            start += (f" (resharded from {resume['meta']['layout']}, shard "
                      f"{resume['meta'].get('shard', 'none')})")
        print(f"labs/train.py: {settings.meta['layout']}, {start} of {args.steps}, "
              f"checkpoints every {args.checkpoint_every} steps in {args.checkpoint_dir}",
              file=sys.stderr, flush=True)
    try:
        ranks = lessonlib.run(long_run.train, args.world_size, settings, resume,
                              fail_at=args.failure, backend=args.backend, timeout=args.timeout)
    except lessonlib.RankError as exc:
        # A result of the settings (Diverged) or of the disk (SaveFailed), not a crash: one
        # line, without the rank's traceback
        for kind in ("Diverged: ", "SaveFailed: "):
            lines = [line for line in str(exc).splitlines() if kind in line]
            if lines:
                sys.exit(f"labs/train.py: {lines[-1].split(kind, 1)[1]}")
        raise
    return {"ranks": ranks, "resume": resume}


def build_record(measured: dict, settings: long_run.RunSettings, world_size: int,
                 dtype: str) -> dict:
    ranks = measured["ranks"]
    shown = settings.as_dict() | {"dtype": dtype}
    summary = long_run.summary(ranks, settings, measured["resume"])
    record = labkit.result("train", world_size, shown, {"lessonlib": asdict(summary)},
                           ranks[0]["info"])
    starter = (f"torchrun --nproc-per-node {world_size}"
               if lessonlib.launcher.under_torchrun() else "python")
    record["command"] = " ".join([starter, "labs/train.py", *sys.argv[1:]])
    record["host"] = {"cpu_count": os.cpu_count(), "torch": torch.__version__}
    record["rows"] = [{"implementation": "lessonlib", "layout": settings.meta["layout"],
                       "shard": settings.axes["shard"], "sp": settings.axes["sp"],
                       "step_time_s": summary.step_time_s, "first_loss": summary.first_loss,
                       "last_loss": summary.last_loss,
                       "resumed_from_step": summary.resumed_from_step,
                       "steps_run_now": summary.steps_run_now,
                       "checkpoint_save_s": summary.checkpoint_save_s}]
    record["headline"] = labkit.headline("last_loss", x="steps", series=["implementation"])
    return record


def main(argv=None):
    ap = labargs.parser("train", __doc__.splitlines()[0])
    ap.set_defaults(steps=600, timeout=3600.0)
    ap.add_argument("--layout", default=None, help="t<t>p<p>d<d>, e.g. t1p2d1 (default: as "
                    "many pipeline stages as the world and layers allow, then TP, then DP, "
                    "d a multiple of --ep)")
    labargs.add_gpt_flags(ap, hidden=128, seq=64)
    ap.add_argument("--cp", type=int, default=1, help="context-parallel ranks (default 1)")
    ap.add_argument("--ep", type=int, default=1,
                    help="expert-parallel ranks inside d, on the MoE tiny GPT (default 1)")
    ap.add_argument("--moe", action="store_true",
                    help="train the MoE tiny GPT (implied by --ep > 1)")
    ap.add_argument("--shard", choices=SHARDS, default="none",
                    help="sharded data parallelism on the d*c ranks of a stage (default none)")
    ap.add_argument("--sp", action="store_true",
                    help="sequence parallelism with TP (LayerNorms on s/(c t) rows)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--optimizer", default="adamw", choices=sorted(HybridTrainer.OPTIMIZERS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--checkpoint-dir", default="results/train-checkpoints",
                    help="one folder per run; on several nodes, a folder every node can reach")
    ap.add_argument("--checkpoint-every", type=int, default=50, help="steps between saves")
    ap.add_argument("--keep", type=int, default=2, help="complete checkpoints to keep")
    ap.add_argument("--fresh", action="store_true",
                    help="delete the folder's checkpoints and start from step 0 (shards "
                         "without a manifest are set aside, not deleted); a folder "
                         "holding anything but checkpoints is refused (not with torchrun "
                         "--max-restarts: every restart would start over)")
    ap.add_argument("--set-aside", action="store_true",
                    help="rename the newer step folders that hold shards but no manifest to "
                         "step_*.unverified (never deleted), then resume from the newest "
                         "verified checkpoint (every run now does this by itself)")
    ap.add_argument("--fail-at", default=None, metavar="RANK:STEP",
                    help="make RANK raise at STEP, to rehearse a failure and the resume")
    args = labkit.parse(ap, argv,
                        fp32_only="its pipeline stages receive activations in fp32 buffers")
    with contextlib.ExitStack() as held:        # the checkpoint folder, for the whole run
        settings = check_run(ap, args, held)
        record = build_record(measure(args, settings), settings, args.world_size, args.dtype)
    return labkit.emit(record, args.json)


if __name__ == "__main__":
    main()
