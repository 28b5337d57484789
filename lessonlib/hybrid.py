"""Hybrid 3-D parallelism: the tiny GPT trained with tensor, pipeline and data parallelism at once.

What it teaches: the three strategies compose, each on its own axis of the (dp, pp, tp) grid
(``lessonlib.grid``), as in Megatron-LM 2021 (Narayanan et al., §2-3):

1. **pipeline** (pp axis): the dense model is cut into p stages of whole transformer layers,
   the embedding on the first stage and the head on the last;
2. **tensor** (tp axis): inside a stage, every layer's attention and MLP are split over the
   t ranks of the TP group (Megatron's column- and row-parallel layers, ``tensor_parallel``);
   the activations that cross a stage boundary are whole (b, s, h) tensors, the same on the
   t ranks of a stage (each sends its copy to its peer: no scatter/gather optimisation);
3. **data** (dp axis): each of the d replicas takes its rows of the global batch B, cuts
   them into m micro-batches of b = B/(d m) sequences, and runs them through its pipeline with
   1F1B (``pipeline.executor``); after the last backward of the step, *one* all-reduce of all
   the stage's gradients over the DP group, divided by d, then the optimizer step.

Every rank builds its shard from the same full model (cut, then split), so the run equals
one process training the dense model on the whole batch; ``train`` checks that on the
ranks and ``parity_summary`` in the caller. ``expected_traffic`` says how many messages and
bytes each rank should send per step, which the ranks' ledgers confirm.

Laptop:  ``python -c "import lessonlib as L; print(L.hybrid.parity_summary(
         L.hybrid.run(2, 2, 2)))"``  (8 CPU ranks, d = p = t = 2)
GPU box: ``torchrun --nproc-per-node 8 labs/hybrid.py --layouts t2p2d2`` (NCCL, one GPU per rank).
"""
from __future__ import annotations

import statistics
import time

import torch
from torch import nn

from lessonlib import comm, device, placement
from lessonlib.argcheck import positive_int
from lessonlib.baseline import corpus_batches, grads_as_model, max_abs_diff, train_one_process
from lessonlib.breadcrumbs import progress
from lessonlib.data import shard
from lessonlib.data_parallel.ladder import allreduce_flat_gradients
from lessonlib.grid import AXES, ParallelContext, check_grid
from lessonlib.launcher import launch
from lessonlib.models import HYBRID_CONFIG, Block, GPTConfig, TinyGPT, lm_loss
from lessonlib.pipeline.executor import PipelineExecutor
from lessonlib.pipeline.schedules import make
from lessonlib.pipeline.timeline import StepTimeline
from lessonlib.layer_split import split_layers
from lessonlib.tensor_parallel.parallelize import param_bytes, parallelize_block

# ---------------------------------------------------------------- checks (pure, before any process)
def check_layout(cfg: GPTConfig, dp: int, pp: int, tp: int, global_batch: int, m: int) -> int:
    """Raise ValueError naming the setting if (dp, pp, tp, B, m) cannot train ``cfg``;
    return the micro-batch size b = B / (d m)."""
    for name, value in (("dp", dp), ("pp", pp), ("tp", tp), ("global_batch", global_batch),
                        ("m", m)):
        positive_int(name, value)
    if pp > cfg.layers:
        raise ValueError(f"pp={pp} stages but the model has layers={cfg.layers}: every stage "
                         f"needs at least one transformer layer; use pp <= {cfg.layers} or a "
                         f"deeper model")
    for setting, value in (("heads", cfg.heads), ("hidden", cfg.hidden)):
        if value % tp:
            ok = [k for k in range(1, cfg.heads + 1) if cfg.heads % k == 0 and cfg.hidden % k == 0]
            raise ValueError(f"tp={tp} must divide {setting}={value} (each TP rank takes an "
                             f"equal share); use tp in {ok}")
    if global_batch % (dp * m):
        ok = dp * m * max(1, round(global_batch / (dp * m)))
        raise ValueError(f"global_batch={global_batch} is not divisible by dp*m = {dp}*{m} = "
                         f"{dp * m}: each of the d replicas needs m equal micro-batches; use "
                         f"global_batch={ok}, or change m")
    return global_batch // (dp * m)


def stage_counts(layers: int, pp: int) -> list[int]:
    """Parts per stage for ``TinyGPT.parts()`` = [embed, L blocks, head]: the L blocks as even
    as possible (earlier stages take the extra one), the embedding on the first stage and the
    head on the last."""
    blocks = [layers // pp + (1 if s < layers % pp else 0) for s in range(pp)]
    blocks[0] += 1
    blocks[-1] += 1
    return blocks


# ---------------------------------------------------------------- building a rank's shard
def build_stage(model: TinyGPT, ctx: ParallelContext) -> nn.Sequential:
    """This rank's shard: the pipeline stage ``ctx.pp_rank`` of ``model``, with every
    transformer layer split over the TP group. Copies; sends nothing."""
    stage = split_layers(model, ctx.pp, stage_counts(model.cfg.layers, ctx.pp))[ctx.pp_rank]
    return nn.Sequential(*(parallelize_block(part, ctx.tp_group) if isinstance(part, Block)
                           else part for part in stage))


def sync_gradients(stage: nn.Module, ctx: ParallelContext) -> None:
    """Average the stage's gradients over the d replicas: the data-parallel room's rung (b),
    one all-reduce of one flat buffer, on this rank's data-parallel group."""
    if ctx.dp > 1:
        allreduce_flat_gradients(stage, group=ctx.dp_group)


class HybridTrainer:
    """One rank of a (dp, pp, tp) run: its stage shard, a 1F1B executor on its pipeline,
    and an optimizer over the shard (``"sgd"``, or ``"adamw"``, whose per-weight moments are
    shards too). ``step(x, y)`` takes the *global* batch (every rank builds the same one)."""

    OPTIMIZERS = {"sgd": torch.optim.SGD, "adamw": torch.optim.AdamW}

    def __init__(self, model: TinyGPT, ctx: ParallelContext, m: int, global_batch: int,
                 lr: float = 0.1, schedule: str = "1f1b", optimizer: str = "sgd"):
        if optimizer not in self.OPTIMIZERS:
            raise ValueError(f"optimizer={optimizer!r}; use one of {sorted(self.OPTIMIZERS)}")
        cfg = model.cfg
        self.b = check_layout(cfg, ctx.dp, ctx.pp, ctx.tp, global_batch, m)
        self.ctx, self.m = ctx, m
        self.stage = build_stage(model, ctx).to(device.current_device())
        self.params = list(self.stage.parameters())
        self.timeline = StepTimeline(f"pipeline stage {ctx.pp_rank}", group=ctx.pp_group)
        self.executor = PipelineExecutor(
            make(schedule, ctx.pp, m), ctx.pp_rank, [self.stage], lm_loss,
            (self.b, cfg.seq, cfg.hidden), stage_ranks=ctx.pp_ranks, group=ctx.pp_group,
            recorder=self.timeline)
        self.opt = self.OPTIMIZERS[optimizer](self.params, lr=lr)

    def step(self, x, y, timeline: bool = True) -> dict:
        """Forward and backward of this replica's rows through the pipeline, one DP
        all-reduce, one optimizer step. Returns this rank's losses (last stage), ledgers,
        and the share of the pipeline's wall time this stage spent outside F and B (None
        with ``timeline=False``: then no barrier, no action timing, one host sync at the
        end for the step's seconds)."""
        ctx, dev = self.ctx, device.current_device()
        x, y = shard(x, ctx.dp_rank, ctx.dp).to(dev), shard(y, ctx.dp_rank, ctx.dp).to(dev)
        self.opt.zero_grad(set_to_none=False)
        start = device.timer() if timeline else time.perf_counter()
        self.timeline.on = timeline
        with comm.ledger() as pipe_book:
            result = self.executor.step(x if ctx.is_first_stage else None,
                                        y if ctx.is_last_stage else None)
        with comm.ledger() as dp_book:
            sync_gradients(self.stage, ctx)
        self.opt.step()
        busy = sum(s.end - s.start for s in result.spans if s.kind in ("F", "B"))
        return {"losses": result.losses, "seconds": device.timer() - start,
                "pipe": pipe_book, "dp": dp_book, "peak_stash": result.peak_stash,
                "idle_share": 1 - busy / result.wall_s if timeline else None}


# ---------------------------------------------------------------- the run and its proof
def reference(cfg: GPTConfig = HYBRID_CONFIG, global_batch: int = 8, steps: int = 3,
              lr: float = 0.1, seed: int = 0, dev=None):
    """One process, whole batch: (model after the steps, model of first-step grads, losses),
    computed on ``dev`` (the CPU by default; a rank's own device inside ``train``)."""
    model = TinyGPT(cfg, seed).to(dev)
    batch_of = corpus_batches(cfg, global_batch, seed)
    run = train_one_process(model, lambda step: tuple(t.to(dev) for t in batch_of(step)),
                            steps, lr=lr)
    return model, grads_as_model(model, run["first_grads"]), run["losses"]


def train(dp: int, pp: int, tp: int, cfg: GPTConfig = HYBRID_CONFIG, m: int = 2,
          global_batch: int = 8, steps: int = 3, lr: float = 0.1, seed: int = 0,
          check: bool = True, warmup: int = 0) -> dict:
    """Rank side: train ``steps`` SGD steps on the (dp, pp, tp) grid. With ``check``, also
    train the dense model in this process and compare this rank's shard of it (gradients of
    the first step, weights after the last) with the rank's own. Step times and idle shares
    are medians over the steps after the first ``warmup``."""
    check_layout(cfg, dp, pp, tp, global_batch, m)
    if not 0 <= warmup < steps:
        raise ValueError(f"warmup={warmup} must be at least 0 and below steps={steps}: the "
                         f"times are medians over the steps after the warm-up")
    ctx = ParallelContext.build(dp, pp, tp)
    batch_of = corpus_batches(cfg, global_batch, seed)
    trainer = HybridTrainer(TinyGPT(cfg, seed), ctx, m, global_batch, lr)
    losses, seconds, idle, first_grads, books = [], [], [], None, []
    for step in range(steps):
        progress(f"hybrid step {step}")
        x, y = batch_of(step)                                            # (B, s)
        comm.barrier()  # every rank starts the step together, so times compare
        with placement.timed(step, warmup):
            out = trainer.step(x, y)
        if first_grads is None:  # after the DP all-reduce: the gradients the optimizer used
            first_grads = [p.grad.detach().clone() for p in trainer.params]
        losses.append(out["losses"])
        if step >= warmup:
            seconds.append(out["seconds"])
            idle.append(out["idle_share"])
        books.append({"pipe": out["pipe"].summary(), "dp": out["dp"].summary()})
    result = {"rank": ctx.rank, "coords": ctx.coords, "losses": losses,
              "step_time_s": statistics.median(seconds), "idle_share": statistics.median(idle),
              "traffic": books,
              "param_bytes": param_bytes(trainer.stage),
              "param_count": sum(p.numel() for p in trainer.params),
              "peak_stash": out["peak_stash"]}
    if check:
        dense, dense_grads, dense_losses = reference(cfg, global_batch, steps, lr, seed,
                                                     device.current_device())
        result.update(
            max_grad_diff=max_abs_diff(first_grads, build_stage(dense_grads, ctx).parameters()),
            max_weight_diff=max_abs_diff(trainer.params, build_stage(dense, ctx).parameters()),
                      dense_losses=dense_losses)
    ctx.destroy()          # each layout makes its own groups: free them before the next
    return result


def train_layouts(layouts, **settings) -> list[dict]:
    """Rank side: ``train`` each (dp, pp, tp) of ``layouts`` in turn, in one launch (the
    world size must be the product of each); one result per layout."""
    return [train(dp, pp, tp, **settings) for dp, pp, tp in layouts]


def run(dp: int, pp: int, tp: int, cfg: GPTConfig = HYBRID_CONFIG, m: int = 2,
        global_batch: int = 8, timeout: float = 180, **settings) -> list[dict]:
    """Caller side: check the layout, then ``launch`` ``train`` on dp*pp*tp ranks."""
    check_layout(cfg, dp, pp, tp, global_batch, m)
    check_grid(dp * pp * tp, dp, pp, tp)
    return launch(train, dp * pp * tp, dp, pp, tp, cfg=cfg, m=m, global_batch=global_batch,
                  timeout=timeout, **settings)


def step_losses(per_rank: list[dict]) -> list[float]:
    """The global batch's mean loss per step, from the last stages' micro-batch losses
    (mean over the m micro-batches of each replica, then over the d replicas)."""
    places = [dict(zip(AXES, r["coords"])) for r in per_rank]     # {"dp": i, "pp": j, "tp": k}
    last_stage = max(place["pp"] for place in places)
    last = [r for r, place in zip(per_rank, places)
            if place["pp"] == last_stage and place["tp"] == 0]
    return [statistics.fmean(statistics.fmean(r["losses"][s]) for r in last)
            for s in range(len(last[0]["losses"]))]


def largest(per_rank: list[dict], key: str) -> float:
    """The largest ``key`` over the ranks; a rank that did not report it is an error."""
    missing = [r.get("rank") for r in per_rank if key not in r]
    if missing:
        raise ValueError(f"rank(s) {missing} did not report {key}: train them with "
                         f"check=True (the default) to compare them with one process")
    return max(r[key] for r in per_rank)


def parity_summary(per_rank: list[dict], cfg: GPTConfig = HYBRID_CONFIG,
                   global_batch: int = 8, lr: float = 0.1, seed: int = 0) -> dict:
    """Caller side: the run's losses against one process (computed here) and the ranks'
    largest gradient and weight differences from their shard of the dense model."""
    losses = step_losses(per_rank)
    _, _, dense = reference(cfg, global_batch, len(losses), lr, seed)
    return {"losses": losses, "dense_losses": dense,
            "max_loss_diff": max(abs(a - b) for a, b in zip(losses, dense)),
            "max_grad_diff": largest(per_rank, "max_grad_diff"),
            "max_weight_diff": largest(per_rank, "max_weight_diff")}


def expected_param_count(cfg: GPTConfig, pp: int, tp: int, stage: int) -> int:
    """Parameters on one rank of pipeline stage ``stage``: per layer, the split matrices and
    their biases (12h^2 + 7h) / t and the replicated LayerNorms and row-parallel biases (6h);
    the embeddings (V + s) h on the first stage, the head's LayerNorm and V x h on the last."""
    h = cfg.hidden
    layers = stage_counts(cfg.layers, pp)[stage] - (stage == 0) - (stage == pp - 1)
    count = layers * ((12 * h * h + 7 * h) // tp + 6 * h)
    count += (cfg.vocab + cfg.seq) * h if stage == 0 else 0
    return count + (2 * h + cfg.vocab * h if stage == pp - 1 else 0)


def expected_traffic(cfg: GPTConfig, dp: int, pp: int, tp: int, global_batch: int, m: int,
                     stage: int, param_count: int) -> dict:
    """Messages one rank of pipeline stage ``stage`` sends per step, and their payload bytes
    (float32). TP: 4 all-reduces of b*s*h per layer per micro-batch (g twice forward, f
    twice backward; Megatron-LM 2021 §3.2). PP: one (b, s, h) activation forward and one
    gradient backward per micro-batch and boundary. DP: one all-reduce of the stage's grads."""
    b = check_layout(cfg, dp, pp, tp, global_batch, m)
    layers = stage_counts(cfg.layers, pp)[stage] - (stage == 0) - (stage == pp - 1)
    act = 4 * b * cfg.seq * cfg.hidden
    boundaries = (stage > 0) + (stage < pp - 1)
    tp_calls = 4 * layers * m if tp > 1 else 0
    return {"tp_all_reduce": {"calls": tp_calls, "bytes": tp_calls * act},
            "pp_send": {"calls": boundaries * m, "bytes": boundaries * m * act},
            "dp_all_reduce": {"calls": int(dp > 1), "bytes": 4 * param_count * (dp > 1)}}


def measured_traffic(book: dict) -> dict:
    """The same three numbers read from one step's ledgers (``train``'s ``traffic[i]``)."""
    pipe, dp = book["pipe"], book["dp"]
    zero = {"calls": 0, "bytes": 0}
    keep = lambda d: {"calls": d["calls"], "bytes": d["bytes"]}  # noqa: E731
    return {"tp_all_reduce": keep(pipe.get("all_reduce", zero)),
            "pp_send": keep(pipe.get("send", zero)),
            "dp_all_reduce": keep(dp.get("all_reduce", zero))}
