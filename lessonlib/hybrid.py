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

The builder and the trainer are those of every layout (``hybrid_axes``: ``build_stage``,
``HybridTrainer``) at c = e = 1 on this grid; here are lesson 05's run and its counts. Every
rank builds its shard from the same full model (cut, then split), so the run equals one
process training the dense model on the whole batch; ``train`` checks that on the ranks and
``parity_summary`` in the caller. ``expected_traffic`` says how many messages and
bytes each rank should send per step, which the ranks' ledgers confirm.

Laptop:  ``python -c "import lessonlib as L; print(L.hybrid.parity_summary(
         L.hybrid.run(2, 2, 2)))"``  (8 CPU ranks, d = p = t = 2)
GPU box: ``torchrun --nproc-per-node 8 labs/hybrid.py --layouts t2p2d2`` (NCCL, one GPU per rank).
"""
from __future__ import annotations

import statistics

from lessonlib import comm, device
from lessonlib.baseline import corpus_batches, max_abs_diff
from lessonlib.grid import ParallelContext
from lessonlib.grid_layout import check_grid
from lessonlib.hybrid_axes.build import build_stage, check_3d_layout, stage_counts
from lessonlib.hybrid_axes.runs import StepTraffic, largest, reference, step_losses
from lessonlib.hybrid_axes.trainer import HybridTrainer
from lessonlib.instruments import placement
from lessonlib.instruments.breadcrumbs import progress
from lessonlib.launcher import launch
from lessonlib.models import HYBRID_CONFIG, GPTConfig, TinyGPT
from lessonlib.tensor_parallel.parallelize import param_bytes


# ---------------------------------------------------------------- the run and its proof
def train(dp: int, pp: int, tp: int, cfg: GPTConfig = HYBRID_CONFIG, m: int = 2,
          global_batch: int = 8, steps: int = 3, lr: float = 0.1, seed: int = 0,
          check: bool = True, warmup: int = 0) -> dict:
    """Rank side: train ``steps`` SGD steps on the (dp, pp, tp) grid. With ``check``, also
    train the dense model in this process and compare this rank's shard of it (gradients of
    the first step, weights after the last) with the rank's own. Step times and idle shares
    are medians over the steps after the first ``warmup``; ``traffic`` holds one
    ``StepTraffic`` per step."""
    check_3d_layout(cfg, dp, pp, tp, global_batch, m)
    if not 0 <= warmup < steps:
        raise ValueError(f"warmup={warmup} must be at least 0 and below steps={steps}: the "
                         f"times are medians over the steps after the warm-up")
    ctx = ParallelContext.build(dp, pp, tp)
    batch_of = corpus_batches(cfg, global_batch, seed)
    trainer = HybridTrainer(TinyGPT(cfg, seed), ctx, m, global_batch, lr)   # c = e = 1
    losses, seconds, idle, first_grads, books = [], [], [], None, []
    for step in range(steps):
        progress(f"hybrid step {step}")
        x, y = batch_of(step)                                            # (B, s)
        comm.barrier()  # every rank starts the step together, so times compare
        with placement.timed(step, warmup):
            out = trainer.step(x, y, timeline=True)
        if first_grads is None:  # after the DP all-reduce: the gradients the optimizer used
            first_grads = [p.grad.detach().clone() for p in trainer.params]
        losses.append(out["losses"])
        if step >= warmup:
            seconds.append(out["seconds"])
            idle.append(out["idle_share"])
        books.append(StepTraffic(pipe=out["pipe"], dp=out["dp"]))
    result = {"rank": ctx.rank, "coords": ctx.coords, "losses": losses,
              "step_time_s": statistics.median(seconds), "idle_share": statistics.median(idle),
              "traffic": books,
              "param_bytes": param_bytes(trainer.stage),
              "param_count": sum(p.numel() for p in trainer.params),
              "peak_stash": out["peak_stash"]}
    if check:
        dense, dense_grads, dense_losses = reference(TinyGPT(cfg, seed), global_batch, steps,
                                                     lr, seed, device.current_device())
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
    check_3d_layout(cfg, dp, pp, tp, global_batch, m)
    check_grid(dp * pp * tp, dp, pp, tp)
    return launch(train, dp * pp * tp, dp, pp, tp, cfg=cfg, m=m, global_batch=global_batch,
                  timeout=timeout, **settings)


def parity_summary(per_rank: list[dict], cfg: GPTConfig = HYBRID_CONFIG,
                   global_batch: int = 8, lr: float = 0.1, seed: int = 0) -> dict:
    """Caller side: the run's losses against one process (computed here) and the ranks'
    largest gradient and weight differences from their shard of the dense model."""
    losses = step_losses(per_rank)
    _, _, dense = reference(TinyGPT(cfg, seed), global_batch, len(losses), lr, seed)
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
    b = check_3d_layout(cfg, dp, pp, tp, global_batch, m)
    layers = stage_counts(cfg.layers, pp)[stage] - (stage == 0) - (stage == pp - 1)
    act = 4 * b * cfg.seq * cfg.hidden
    boundaries = (stage > 0) + (stage < pp - 1)
    tp_calls = 4 * layers * m if tp > 1 else 0
    return {"tp_all_reduce": {"calls": tp_calls, "bytes": tp_calls * act},
            "pp_send": {"calls": boundaries * m, "bytes": boundaries * m * act},
            "dp_all_reduce": {"calls": int(dp > 1), "bytes": 4 * param_count * (dp > 1)}}


def measured_traffic(book: StepTraffic) -> dict:
    """The same three numbers read from one step's ledgers (``train``'s ``traffic[i]``)."""
    pipe, dp = book.pipe, book.dp
    zero = {"calls": 0, "bytes": 0}
    keep = lambda d: {"calls": d["calls"], "bytes": d["bytes"]}  # noqa: E731
    return {"tp_all_reduce": keep(pipe.get("all_reduce", zero)),
            "pp_send": keep(pipe.get("send", zero)),
            "dp_all_reduce": keep(dp.get("all_reduce", zero))}
