"""A training run that survives being killed: the tiny GPT on any layout, with checkpoints.

What it teaches: a run of weeks on thousands of GPUs meets failed GPUs, lost nodes and
preempted jobs; what saves it is a checkpoint every N steps and a restart that continues
the *same* run. Here every rank saves its own shard (``lessonlib.long_run.checkpoint``) every
``checkpoint_every`` steps; a new run in the same folder resumes from the newest complete
checkpoint. The loss curve continues bit for bit, because

* the weights, the optimizer state (AdamW's moments) and the RNG state are restored, and
* the data of step k depends only on k (``data.lm_batch``), so no sampler state is needed.

A step whose loss is not finite (a learning rate too high) stops the run on every rank
with ``Diverged`` before that step is saved, so the good checkpoints stay the newest. A
checkpoint saved on another (t, p, d) layout (or world size, or m) is resharded on load
(``lessonlib.long_run.reshard``): the weights and AdamW's moments are the same, and the loss curve
continues up to float rounding (the new layout sums in another order).

Beyond (t, p, d): with ``cp``, ``ep`` (the MoE tiny GPT), ``sp`` or ``shard="zero1"|"fsdp"``
the same ``hybrid.HybridTrainer`` trains (float32, AdamW or SGD), through the same step
loop (``hybrid.train``) with this module's per-step hook (the finite check, the loss history,
the saves); each rank saves what it holds (under FSDP its weights' row shards, under
ZeRO-1 the optimizer state of its range), the manifest records the five axes
(``t1c2p2d1``) and the sharding, and a resume on any other layout, five-axis or not, is
resharded the same way. Every layout lays its ranks out in the grid's one rank order.

One job: a long run from its checked settings (``RunSettings``) to its summary
(``RunSummary``), the rank side and the caller side; its length is those two records and
the resume each side of the launch agrees on.

``fail_at=(rank, step)`` makes that rank raise at that step, to watch the failure (the
launcher names the rank and stops the others) and the resume.

Laptop:  ``python -c "from lessonlib import long_run as lr;
         print(lr.run(lr.plan(2, steps=40, checkpoint_dir='results/ckpt')).losses[-1])"``
         or ``python labs/train.py --world-size 2`` (the lab over this module)
GPU box: ``torchrun --nproc-per-node 8 --max-restarts 3 labs/train.py --layout t2p2d2``
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from lessonlib import comm, device
from lessonlib.argcheck import positive_int
from lessonlib.data import corpus_tokens, lm_batch
from lessonlib.grid import ParallelContext
from lessonlib.grid_layout import layout_name, parse_layout
from lessonlib.hybrid.build import make_model
from lessonlib.hybrid.checks import check_layout
from lessonlib.hybrid.layout_runs import step_losses
from lessonlib.hybrid.recorder import StepRecorder
from lessonlib.hybrid.trainer import HybridTrainer
from lessonlib.hybrid.trainer import train as train_steps
from lessonlib.instruments.spans import no_record
from lessonlib.lab import labkit
from lessonlib.long_run import checkpoint, checkpoint_folder, folder_lock, reshard, restart
from lessonlib.long_run.shard_map import Layout
from lessonlib.models import LONG_RUN, GPTConfig

SMALL = {k: getattr(LONG_RUN, k) for k in ("vocab", "seq", "hidden", "heads", "layers")}
# How the work is split: a checkpoint saved with other values is resharded, not refused.
RESHARDABLE = ("world_size", "layout", "m", "shard", "sp", "order")
PLAIN = {"cp": 1, "ep": 1, "shard": "none", "sp": False, "moe": False}


@dataclass(frozen=True)
class RunSettings:
    """A long run's settings, checked by ``plan``: the world and its (t, p, d) layout, the
    model (``GPTConfig``'s arguments), the batch, the optimizer, the other axes (cp, ep,
    shard, sp, moe), how long, where and how often to save; ``meta`` is what the shards
    depend on, as the checkpoint's manifest records it."""
    world_size: int
    layout: tuple
    model: dict
    global_batch: int
    m: int
    lr: float
    optimizer: str
    seed: int
    axes: dict
    steps: int
    checkpoint_dir: str
    checkpoint_every: int
    keep: int
    meta: dict

    def as_dict(self) -> dict:
        """The settings as a lab's record prints them: the manifest's ``meta`` and the rest."""
        return {**self.meta, "layout": self.layout, "axes": self.axes,
                "world_size": self.world_size, "steps": self.steps,
                "checkpoint_dir": self.checkpoint_dir, "checkpoint_every": self.checkpoint_every,
                "keep": self.keep}


@dataclass(frozen=True)
class RunSummary:
    """A run, summed up on the caller's side: the whole loss curve (from step 1, before a
    resume included), where it resumed from and which newer checkpoints it skipped, the
    median step and save, the newest checkpoint, and the parameters each rank held."""
    losses: list
    first_loss: float
    last_loss: float
    resumed_from_step: int | None
    resumed_from_layout: str | None
    damaged_checkpoints: list
    steps_run_now: int
    step_time_s: float | None
    checkpoint_save_s: float | None
    checkpoint: str | None
    param_count_per_rank: list


@dataclass(frozen=True)
class RunResult(RunSummary):
    """``run``'s summary, and one line per interrupted save it found and dealt with."""
    recovered: list


class Diverged(RuntimeError):
    """The loss (or a weight) is no longer a finite number."""


def default_layout(world: int, cfg: GPTConfig, ep: int = 1) -> tuple[int, int, int]:
    """As many pipeline stages as the world and the layers allow, then TP, then DP, keeping
    d a multiple of ``ep`` (the expert-parallel groups lie inside d) when ``ep`` divides the
    world: t*p then divides world/ep."""
    room = world // ep if world % ep == 0 else world
    p = max(k for k in range(1, min(room, cfg.layers) + 1) if room % k == 0)
    t = max(k for k in range(1, room // p + 1)
            if (room // p) % k == 0 and cfg.heads % k == 0)
    return t, p, world // (t * p)


def plan(world_size: int, layout: str | None = None, model: dict | None = None,
         global_batch: int = 8, m: int = 2, lr: float = 1e-3, optimizer: str = "adamw",
         seed: int = 0, steps: int = 100, checkpoint_dir: str = "results/long-run",
         checkpoint_every: int = 10, keep: int = 2, cp: int = 1, ep: int = 1,
         shard: str = "none", sp: bool = False, moe: bool | None = None) -> RunSettings:
    """The run's settings, checked (ValueError naming the setting) before any process.
    ``layout`` is ``"t<t>p<p>d<d>"`` (default: ``default_layout``) on the world's t*p*d
    ranks, or on t*c*p*d with ``cp``, ``ep`` (the MoE tiny GPT: ``moe``, implied by ep > 1),
    ``shard`` (``"zero1"``, ``"fsdp"``) or ``sp``: then its manifest records those axes."""
    for name, value in (("steps", steps), ("checkpoint_every", checkpoint_every),
                        ("keep", keep)):
        positive_int(name, value)
    checkpoint_folder.check_directory(checkpoint_dir)
    if optimizer not in HybridTrainer.OPTIMIZERS:
        raise ValueError(f"optimizer={optimizer!r}; use one of {sorted(HybridTrainer.OPTIMIZERS)}")
    model = dict(model or SMALL)
    cfg = GPTConfig(**model)
    axes = {"cp": cp, "ep": ep, "shard": shard, "sp": sp, "moe": ep > 1 if moe is None else moe}
    for name in ("cp", "ep"):
        positive_int(name, axes[name])
    if world_size % cp:
        raise ValueError(f"cp={cp} must divide world_size={world_size} (c ranks share each "
                         f"sequence)")
    t, p, d = parse_layout(layout) if layout else default_layout(world_size // cp, cfg, ep)
    check_layout(cfg, dp=d, pp=p, cp=cp, tp=t, ep=ep, global_batch=global_batch, m=m,
                 shard_on=shard, sp=sp, moe=axes["moe"], world_size=world_size)
    # What the shards depend on; the step count and checkpoint cadence may change on resume.
    meta = {"layout": layout_name(dp=d, pp=p, tp=t, cp=cp, ep=ep), "model": model,
            "global_batch": global_batch, "m": m, "lr": lr, "optimizer": optimizer, "seed": seed}
    if axes != PLAIN:
        meta |= {"shard": shard, "sp": sp} | (
            {"moe": True} if axes["moe"] else {})
    return RunSettings(world_size=world_size, layout=(t, p, d), model=model,
                       global_batch=global_batch, m=m, lr=lr, optimizer=optimizer, seed=seed,
                       axes=axes, steps=steps, checkpoint_dir=str(checkpoint_dir),
                       checkpoint_every=checkpoint_every, keep=keep, meta=meta)


def build_trainer(settings: RunSettings, recorder=no_record):
    """Rank side: (context, trainer): ``HybridTrainer`` on the grid, float32, its step's
    phases scoped by ``recorder``."""
    cfg, (t, p, d) = GPTConfig(**settings.model), settings.layout
    axes = settings.axes
    ctx = ParallelContext.build(d, p, t, cp=axes["cp"], ep=axes["ep"])
    return ctx, HybridTrainer(make_model(cfg, axes["moe"], settings.seed), ctx,
                              settings.m, settings.global_batch, settings.lr,
                              axes["shard"], axes["sp"], settings.optimizer,
                              recorder=recorder)


def _optimizer(trainer):
    """The optimizer whose state this rank saves: under ZeRO-1 the inner one, stepping (and
    keeping AdamW's moments of) this rank's range only."""
    return getattr(trainer.opt, "optim", trainer.opt)


def _agreed_resume(settings: RunSettings, resume: dict | None) -> dict | None:
    """Every rank resumes from rank 0's choice (under torchrun each rank chose by itself,
    and a file damaged between their looks would split them)."""
    step = torch.tensor([resume["step"] if resume else -1], device=device.current_device())
    comm.broadcast(step, src=0)
    if step.item() == (resume["step"] if resume else -1):
        return resume
    return None if step.item() < 0 else checkpoint.at_step(settings.checkpoint_dir, step.item())


def _restore(trainer, ctx: ParallelContext, settings: RunSettings, resume: dict):
    """Load this rank's share of ``resume``: its own shard on the same layout (the five
    axes and the sharding), else the pieces of the old shards it needs
    (``reshard``). Returns (step, loss history)."""
    same = ("layout", "shard")
    optimizer = _optimizer(trainer)
    if all(resume["meta"].get(k) == settings.meta.get(k) for k in same):
        state = checkpoint.load(resume["path"], ctx.rank, manifest=resume)
        checkpoint.set_rng_state(state["rng"])
    else:       # no dropout or sampling: the RNG stays seeded as a fresh start would
        names = [name for name, _ in trainer.stage.named_parameters()]
        state = reshard.load(resume, GPTConfig(**settings.model),
                             Layout.of(settings.meta), ctx.rank, names,
                             trainer.params[0].dtype)
        state["optimizer"]["param_groups"] = optimizer.state_dict()["param_groups"]
    trainer.stage.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    for moments in trainer.opt.state.values():  # loaded onto the GPU, AdamW's step counts
        if torch.is_tensor(moments.get("step")):  # go back to the CPU it keeps them on
            moments["step"] = moments["step"].cpu()
    return state["step"], state["losses"]


def _check_finite(losses: list[float], trainer: HybridTrainer, step: int, saving: bool,
                  settings: RunSettings) -> None:
    """Every rank agrees (one all-reduce of a flag) whether the step's loss, and before a
    save every weight, is finite; if not, all raise before anything is saved."""
    bad = any(not math.isfinite(x) for x in losses)
    if saving:
        bad = bad or any(not torch.isfinite(q).all() for q in trainer.params)
    flag = torch.tensor([float(bad)], device=device.current_device())
    comm.all_reduce(flag, op=dist.ReduceOp.MAX)
    if flag.item():
        found = checkpoint.latest(settings.checkpoint_dir)
        kept = (f"the checkpoint of step {found.step} in {found.path} is kept"
                if found else "no checkpoint was saved before it")
        raise Diverged(f"the run diverged: a loss or weight is not finite at step {step} "
                       f"(lr={settings.lr}); step {step} is not saved, {kept}; train "
                       f"again with a smaller lr in a new checkpoint folder")


def train(settings: RunSettings, resume: dict | None,
          fail_at: tuple[int, int] | None = None) -> dict:
    """Rank side: build this rank's shard, load its checkpoint when resuming (resharded if
    it was saved on another layout), train to the last step, saving every
    ``checkpoint_every`` steps and at the end; stop with ``Diverged`` at a non-finite loss."""
    cfg = GPTConfig(**settings.model)
    books = StepRecorder(align=False)       # no barrier, no per-action timing: the step's seconds
    ctx, trainer = build_trainer(settings, books)
    start, history = 0, []
    torch.manual_seed(settings.seed + ctx.rank)  # reproducible, and restored on resume
    resume = _agreed_resume(settings, resume)
    if resume is not None:
        start, history = _restore(trainer, ctx, settings, resume)
    tokens, _ = corpus_tokens()
    seconds, saves, every = [], [], settings.checkpoint_every

    def batches(step: int):
        if fail_at == (ctx.rank, step + 1):
            raise RuntimeError(f"a simulated failure of rank {ctx.rank} at step {step + 1}")
        return lm_batch(tokens, settings.global_batch, cfg.seq, step, settings.seed)

    def on_step(step: int, out) -> None:
        saving = (step + 1) % every == 0 or step + 1 == settings.steps
        _check_finite(out.losses, trainer, step + 1, saving, settings)
        history.append(out.losses)
        seconds.append(books.read()[1])
        if saving:
            state = {"model": trainer.stage.state_dict(),
                     "optimizer": _optimizer(trainer).state_dict(),
                     "step": step + 1, "losses": history, "rng": checkpoint.rng_state(),
                     "coords": list(ctx.coords)}
            began = time.perf_counter()
            checkpoint.save(settings.checkpoint_dir, step + 1, state, settings.meta,
                            settings.keep)
            saves.append(time.perf_counter() - began)

    train_steps(trainer, batches, settings.steps, on_step, start=start)
    return {"rank": ctx.rank, "coords": ctx.coords, "losses": history, "seconds": seconds,
            "saves": saves, "param_count": sum(q.numel() for q in trainer.params),
            "info": labkit.rank_info()}


def summary(ranks: list[dict], settings: RunSettings, resume: dict | None) -> RunSummary:
    """Caller side: the whole loss curve (the global batch's mean loss per step, from the
    first step, including the steps before a resume), times, and where the checkpoint is."""
    losses = step_losses([r["coords"] for r in ranks], [r["losses"] for r in ranks])
    seconds = [max(r["seconds"][i] for r in ranks) for i in range(len(ranks[0]["seconds"]))]
    found = checkpoint.latest(settings.checkpoint_dir)
    return RunSummary(
        losses=losses, first_loss=losses[0], last_loss=losses[-1],
        resumed_from_step=resume["step"] if resume else None,
        resumed_from_layout=resume["meta"]["layout"] if resume else None,
        damaged_checkpoints=resume["damaged"] if resume else [],
        steps_run_now=len(seconds),
        step_time_s=statistics.median(seconds) if seconds else None,
        checkpoint_save_s=statistics.median(ranks[0]["saves"]) if seconds else None,
        checkpoint=found.path if found else None,
        param_count_per_rank=[r["param_count"] for r in ranks])


def resume_point(settings: RunSettings, flags: dict | None = None) -> dict | None:
    """Caller side, before any process: the manifest of the newest intact checkpoint to
    resume from (its ``damaged`` lists the newer ones skipped), or None. ValueError if it
    was written by other settings (another layout, world size or m is resharded, not
    refused; ``flags``, {setting: a lab's flag}, says what to pass), if every checkpoint is
    damaged, or if it is already past ``steps``."""
    resume = restart.check_resume(settings.checkpoint_dir, settings.world_size,
                                  settings.meta, may_differ=RESHARDABLE,
                                  check=reshard.mismatch, flags=flags)
    if resume and resume["step"] > settings.steps:
        raise ValueError(f"steps={settings.steps}: the checkpoint in {resume['path']} is "
                         f"already at step {resume['step']}; use steps >= {resume['step']}")
    return resume


def recover(settings: RunSettings) -> list[str]:
    """Caller side, holding the folder (``folder_lock.hold``), before ``resume_point``: an
    interrupted save completed, or set aside with every step folder after the newest
    verified checkpoint (``restart.recover``); one line per thing done."""
    return restart.recover(settings.checkpoint_dir, check=reshard.mismatch)


def run(settings: RunSettings, timeout: float = 600, fail_at: tuple[int, int] | None = None,
        backend: str = "auto") -> RunResult:
    """Caller side, holding the folder for the run (a second run in it is refused, naming
    this one's process): finish an interrupted save (``recover``), resume from the newest
    complete checkpoint in the folder (refused with a ValueError if it was written by other
    settings) or start at step 0; launch; summarize. A failing rank raises ``RankError``
    here; the checkpoints written so far stay."""
    from lessonlib.launcher import launch

    if fail_at is not None and not 0 <= fail_at[0] < settings.world_size:
        raise ValueError(f"fail_at={fail_at}: rank {fail_at[0]} is not in a world of "
                         f"{settings.world_size} ranks")
    with folder_lock.hold(settings.checkpoint_dir):
        recovered = recover(settings)
        resume = resume_point(settings)
        ranks = launch(train, settings.world_size, settings, resume, fail_at=fail_at,
                       backend=backend, timeout=timeout)
    return RunResult(**vars(summary(ranks, settings, resume)), recovered=recovered)
