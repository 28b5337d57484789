"""Train the tiny GPT in one process: the baseline every parallel run is compared with.

What it teaches: before splitting anything, know what one process does and how fast. The
loop records the loss and the wall time of each step; ``measured_flops`` turns the times
into FLOP/s with the same FLOP count the cost model uses for big models, so a laptop's
speed can be extrapolated to GPT-3 with the very same formula.

Laptop:  ``python -m lessonlib.train`` (200 steps, a few seconds on a laptop CPU)
GPU box: the same command; this baseline always runs on the CPU, so its numbers compare
         with the CPU ranks of the other lessons.
"""
from __future__ import annotations

import statistics
import time

import torch

from lessonlib import data
from lessonlib.models import GPTConfig, TinyGPT, lm_loss


def corpus_config(**overrides) -> GPTConfig:
    """The tiny GPT sized for the shipped corpus (its vocabulary is the corpus's characters)."""
    _, tok = data.corpus_tokens()
    return GPTConfig(**{"vocab": tok.vocab, **overrides})


def train_tiny_gpt(cfg: GPTConfig | None = None, steps: int = 200, batch: int = 16,
                   lr: float = 3e-3, seed: int = 0) -> dict:
    """Adam on the castle corpus; returns {"losses": [...], "step_times_s": [...], "cfg": cfg}."""
    cfg = cfg or corpus_config()
    tokens, _ = data.corpus_tokens()
    model = TinyGPT(cfg, seed=seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses, times = [], []
    for step in range(steps):
        x, y = data.lm_batch(tokens, batch, cfg.seq, step, seed)             # (b, s), (b, s)
        start = time.perf_counter()
        loss = lm_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
    return {"losses": losses, "step_times_s": times, "cfg": cfg, "batch": batch}


def flops_per_step(cfg: GPTConfig, batch: int) -> float:
    """Training FLOPs of one step, counted as the cost model counts them for GPT-3
    (forward + backward = 3 forward passes of 24bsh^2(1 + s/6h) per layer, plus the logits)."""
    from lessonlib.costmodel import GPT, model_flops_per_iteration

    shape = GPT(cfg.layers, cfg.hidden, cfg.heads, cfg.seq, cfg.vocab)
    return model_flops_per_iteration(shape, batch)


def measured_flops(run: dict, skip: int = 5) -> float:
    """Sustained FLOP/s of a ``train_tiny_gpt`` run: FLOPs per step / median step time."""
    return flops_per_step(run["cfg"], run["batch"]) / statistics.median(run["step_times_s"][skip:])


if __name__ == "__main__":
    result = train_tiny_gpt()
    print(f"loss {result['losses'][0]:.2f} -> {result['losses'][-1]:.2f} in "
          f"{len(result['losses'])} steps; {measured_flops(result) / 1e9:.2f} GFLOP/s")
