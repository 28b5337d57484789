"""The long run: train the tiny GPT for minutes on any (t, p, d) layout, kill it, resume it.

Every ``--checkpoint-every`` steps each rank saves its shard (its stage's weights, split over
its TP group, and the optimizer state of those weights) with ``lessonlib.checkpoint``. Kill
the run at any moment (Ctrl-C, ``kill -9``, a preempted job) and run the same command again:
it resumes from the newest complete checkpoint and continues the same loss curve, step for
step, because the data of step k depends only on k and the RNG state travels with the
weights. A checkpoint written by other settings (world size, layout, model, batch,
optimizer) is refused before any process starts, with the settings that differ.

Laptop:  python labs/train.py --world-size 2 --checkpoint-dir results/ckpt --json results/t.json
         (a minute or two on a laptop: 600 steps of 1F1B on 2 pipeline stages)
GPU box: torchrun --nproc-per-node 8 --max-restarts 3 labs/train.py --layout t2p2d2 \\
             --checkpoint-dir /shared/ckpt     (torchrun restarts failed workers; they resume)
"""
import os
import shutil
import statistics
import sys
import time

import torch

import lessonlib
from lessonlib import checkpoint, labkit
from lessonlib.data import corpus_tokens, lm_batch
from lessonlib.grid import ParallelContext, check_grid, layout_name, parse_layout
from lessonlib.hybrid import HybridTrainer, check_layout, step_losses
from lessonlib.models import GPTConfig, TinyGPT


def default_layout(world: int, cfg: GPTConfig) -> tuple[int, int, int]:
    """As many pipeline stages as the world and the layers allow, then TP, then DP."""
    p = max(k for k in range(1, min(world, cfg.layers) + 1) if world % k == 0)
    t = max(k for k in range(1, world // p + 1)
            if (world // p) % k == 0 and cfg.heads % k == 0)
    return t, p, world // (t * p)


def worker(settings: dict, resume: dict | None) -> dict:
    """One rank: build its shard, load the checkpoint if resuming, train to the last step,
    saving every ``checkpoint_every`` steps and at the end."""
    cfg, (t, p, d) = GPTConfig(**settings["model"]), settings["layout"]
    ctx = ParallelContext.build(d, p, t)
    trainer = HybridTrainer(TinyGPT(cfg, settings["seed"]), ctx, settings["m"],
                            settings["global_batch"], settings["lr"],
                            optimizer=settings["optimizer"])
    start, history = 0, []
    torch.manual_seed(settings["seed"] + ctx.rank)  # reproducible, and restored on resume
    if resume is not None:
        state = checkpoint.load(resume["path"], ctx.rank)
        trainer.stage.load_state_dict(state["model"])
        trainer.opt.load_state_dict(state["optimizer"])
        checkpoint.set_rng_state(state["rng"])
        start, history = state["step"], state["losses"]
    tokens, _ = corpus_tokens()
    seconds, saves, every = [], [], settings["checkpoint_every"]
    for step in range(start, settings["steps"]):
        lessonlib.progress(f"step {step + 1} of {settings['steps']}")
        x, y = lm_batch(tokens, settings["global_batch"], cfg.seq, step, settings["seed"])
        out = trainer.step(x, y)
        history.append(out["losses"])
        seconds.append(out["seconds"])
        if (step + 1) % every == 0 or step + 1 == settings["steps"]:
            state = {"model": trainer.stage.state_dict(), "optimizer": trainer.opt.state_dict(),
                     "step": step + 1, "losses": history, "rng": checkpoint.rng_state(),
                     "coords": list(ctx.coords)}
            began = time.perf_counter()
            checkpoint.save(settings["checkpoint_dir"], step + 1, state, settings["meta"],
                            settings["keep"])
            saves.append(time.perf_counter() - began)
    return {"rank": ctx.rank, "coords": ctx.coords, "losses": history, "seconds": seconds,
            "saves": saves, "info": labkit.rank_info()}


def check_settings(ap, args) -> dict:
    labkit.check_positive(ap, args, "world-size", "steps", "checkpoint-every", "keep")
    model = labkit.gpt_model(ap, args)
    cfg = GPTConfig(**model)
    try:
        t, p, d = (parse_layout(args.layout) if args.layout
                   else default_layout(args.world_size, cfg))
        check_grid(args.world_size, d, p, t)
        check_layout(cfg, d, p, t, args.global_batch, args.microbatches)
    except ValueError as exc:
        ap.error(f"--layout {args.layout or '(default)'}: {exc}")
    # What the shards depend on; the step count and checkpoint cadence may change on resume.
    meta = {"layout": layout_name(t, p, d), "model": model, "global_batch": args.global_batch,
            "m": args.microbatches, "lr": args.lr, "optimizer": args.optimizer,
            "seed": args.seed}
    return {**meta, "layout": (t, p, d), "steps": args.steps,
            "checkpoint_every": args.checkpoint_every, "keep": args.keep,
            "checkpoint_dir": str(args.checkpoint_dir), "meta": meta}


def build_record(ranks: list[dict], settings: dict, resume: dict | None, world: int) -> dict:
    losses = step_losses(ranks)
    seconds = [max(r["seconds"][i] for r in ranks) for i in range(len(ranks[0]["seconds"]))]
    results = {"losses": losses, "first_loss": losses[0], "last_loss": losses[-1],
               "resumed_from_step": resume["step"] if resume else None,
               "steps_run_now": len(seconds),
               "step_time_s": statistics.median(seconds) if seconds else None,
               "checkpoint_save_s": statistics.median(ranks[0]["saves"]) if seconds else None,
               "checkpoint": checkpoint.latest(settings["checkpoint_dir"])["path"]}
    shown = {k: v for k, v in settings.items() if k != "meta"}
    record = labkit.result("train", world, shown, {"lessonlib": results}, ranks[0]["info"])
    starter = (f"torchrun --nproc-per-node {world}" if lessonlib.launcher.under_torchrun()
               else "python")
    record["command"] = " ".join([starter, "labs/train.py", *sys.argv[1:]])
    record["host"] = {"cpu_count": os.cpu_count(), "torch": torch.__version__}
    return record


def main():
    ap = labkit.parser("train", __doc__.splitlines()[0])
    ap.set_defaults(steps=600, timeout=3600.0)
    ap.add_argument("--layout", default=None, help="t<t>p<p>d<d>, e.g. t1p2d1 (default: as "
                    "many pipeline stages as the world and layers allow, then TP, then DP)")
    labkit.add_gpt_flags(ap, hidden=128, seq=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--optimizer", default="adamw", choices=sorted(HybridTrainer.OPTIMIZERS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--checkpoint-dir", default="results/train-checkpoints",
                    help="one folder per run; on several nodes, a folder every node can reach")
    ap.add_argument("--checkpoint-every", type=int, default=50, help="steps between saves")
    ap.add_argument("--keep", type=int, default=2, help="complete checkpoints to keep")
    ap.add_argument("--fresh", action="store_true",
                    help="delete the folder's checkpoints and start from step 0 (not with "
                         "torchrun --max-restarts: every restart would start over)")
    args = ap.parse_args()
    args.world_size = labkit.world_size(args)
    settings = check_settings(ap, args)
    resume = None
    if args.fresh:
        if lessonlib.launcher.is_main_process():
            shutil.rmtree(args.checkpoint_dir, ignore_errors=True)
    else:
        try:
            resume = checkpoint.check_resume(args.checkpoint_dir, args.world_size,
                                             settings["meta"])
        except ValueError as exc:
            ap.error(str(exc))
        if resume and resume["step"] > args.steps:
            ap.error(f"--steps {args.steps}: the checkpoint in {resume['path']} is already at "
                     f"step {resume['step']}; use --steps {resume['step']} or more")
    if lessonlib.launcher.is_main_process():
        start = f"resuming at step {resume['step']}" if resume else "starting at step 0"
        print(f"labs/train.py: {layout_name(*settings['layout'])}, {start} of {args.steps}, "
              f"checkpoints every {args.checkpoint_every} steps in {args.checkpoint_dir}",
              file=sys.stderr, flush=True)
    ranks = lessonlib.run(worker, args.world_size, settings, resume, backend=args.backend,
                          timeout=args.timeout)
    labkit.emit(build_record(ranks, settings, resume, args.world_size), args.json)


if __name__ == "__main__":
    main()
