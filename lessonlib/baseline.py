"""One process on the whole batch: the run every parallel scheme must reproduce, and the
comparisons that prove it.

What it teaches: a parallel implementation is right when it computes what one process
computes: the same losses, the same gradients, the same weights after a few steps, up to
float rounding. Every parity proof of the course (data, model, tensor, pipeline and 3-D
parallelism) trains its reference here with ``train_one_process`` and measures the
difference with the helpers below, so "equal to one process" means one thing everywhere.
``train_tiny_gpt`` is the first run of the course (notebook 01): the tiny GPT learning the
castle corpus, timed to estimate this machine's FLOP/s.

Laptop:  ``python -m lessonlib.baseline`` (200 steps, a few seconds on a laptop CPU)
GPU box: the same; the model stays on the CPU unless moved.
"""
from __future__ import annotations

import copy
import math
import statistics
import time
from dataclasses import dataclass

import torch
from torch import nn

from lessonlib import data
from lessonlib.costmodel import GPT, model_flops_per_iteration
from lessonlib.models import GPTConfig, TinyGPT, corpus_config, lm_loss

OPTIMIZERS = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}


# ---------------------------------------------------------------- the one-process run
def train_one_process(model: nn.Module, batch_of, steps: int, loss_fn=lm_loss,
                      optimizer: str = "sgd", lr: float = 0.1, microbatches: int = 1) -> dict:
    """Train ``model`` in place for ``steps`` steps on ``batch_of(step)`` = (inputs, targets).

    Returns {"losses", "step_times_s", "first_grads"} (``first_grads``: {parameter: its
    gradient in step 0}); with ``microbatches`` = m > 1 also "microbatch_losses", each
    step's loss of each of the m slices of the batch before the step (what a pipeline's
    last stage reports)."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer={optimizer!r}; use one of {sorted(OPTIMIZERS)}")
    opt = OPTIMIZERS[optimizer](model.parameters(), lr=lr)
    run = {"losses": [], "step_times_s": [], "first_grads": {}, "microbatch_losses": []}
    for step in range(steps):
        x, y = batch_of(step)
        if microbatches > 1:
            with torch.no_grad():
                run["microbatch_losses"].append(
                    [loss_fn(model(a), b).item()
                     for a, b in zip(x.chunk(microbatches), y.chunk(microbatches))])
        start = time.perf_counter()
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        if step == 0:
            run["first_grads"] = {p: p.grad.clone() for p in model.parameters()
                                  if p.grad is not None}
        opt.step()
        run["step_times_s"].append(time.perf_counter() - start)
        run["losses"].append(loss.item())
    return run


def corpus_batches(cfg: GPTConfig, batch: int, seed: int = 0):
    """``batch_of(step)`` for the castle corpus: batch ``step`` of (inputs, targets), each
    (batch, s), the same in every process."""
    tokens, _ = data.corpus_tokens()
    return lambda step: data.lm_batch(tokens, batch, cfg.seq, step, seed)    # (b, s) x 2


# ---------------------------------------------------------------- comparing with it
def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest difference relative to the largest value of the reference ``b`` (inf when
    either holds inf or NaN)."""
    err = ((a.detach() - b.detach()).abs().max() / b.detach().abs().max().clamp_min(1e-30)).item()
    return err if math.isfinite(err) else math.inf


def flat(tensors) -> torch.Tensor:
    """The tensors as one 1-D tensor (on the CPU), to compare shards with a whole."""
    return torch.cat([t.detach().cpu().reshape(-1) for t in tensors])


def max_abs_diff(got, want) -> float:
    """Largest absolute difference between two equally long lists of tensors."""
    return max((a.detach().cpu() - b.detach().cpu()).abs().max().item()
               for a, b in zip(got, want, strict=True))


def grads_as_model(module: nn.Module, grads: dict | None = None) -> nn.Module:
    """A copy of ``module`` whose weights are its gradients (``p.grad``, or ``grads[p]``):
    cutting or slicing it the way a parallel copy was cut gives each rank's expected
    gradient shards."""
    twin = copy.deepcopy(module)
    with torch.no_grad():
        for p, q in zip(module.parameters(), twin.parameters()):
            q.copy_(p.grad if grads is None else grads[p])
    return twin


# ---------------------------------------------------------------- the course's first run
@dataclass
class TinyGPTRun:
    """``train_tiny_gpt``'s run: each step's loss and seconds, the model's shape, the batch."""
    losses: list
    step_times_s: list
    cfg: GPTConfig
    batch: int


def train_tiny_gpt(cfg: GPTConfig | None = None, steps: int = 200, batch: int = 16,
                   lr: float = 3e-3, seed: int = 0) -> TinyGPTRun:
    """Adam on the castle corpus, in one process."""
    cfg = cfg or corpus_config()
    run = train_one_process(TinyGPT(cfg, seed=seed), corpus_batches(cfg, batch, seed), steps,
                            optimizer="adam", lr=lr)
    return TinyGPTRun(run["losses"], run["step_times_s"], cfg, batch)


def flops_per_step(cfg: GPTConfig, batch: int) -> float:
    """Training FLOPs of one step, counted as the cost model counts them for GPT-3
    (forward + backward = 3 forward passes of 24bsh^2(1 + s/6h) per layer, plus the logits)."""
    shape = GPT(cfg.layers, cfg.hidden, cfg.heads, cfg.seq, cfg.vocab)
    return model_flops_per_iteration(shape, batch)


def measured_flops(run: TinyGPTRun, skip: int = 5) -> float:
    """Sustained FLOP/s of a ``train_tiny_gpt`` run: FLOPs per step / median step time."""
    return flops_per_step(run.cfg, run.batch) / statistics.median(run.step_times_s[skip:])


if __name__ == "__main__":
    result = train_tiny_gpt()
    print(f"loss {result['losses'][0]:.2f} -> {result['losses'][-1]:.2f} in "
          f"{len(result.losses)} steps; {measured_flops(result) / 1e9:.2f} GFLOP/s")
