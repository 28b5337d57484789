"""What the FP8 lesson measures on the tiny GPT, in one process, in seconds.

* ``gemm_errors``: the relative error ``||Y8 - Y|| / ||Y||`` of one real GEMM (the first
  block's ``fc1``: its input is the LayerNorm's output on a batch of the corpus) under each
  recipe against float64, with 3 of the activations' channels multiplied by ``factor`` and
  the weight's matching columns divided by it, so that the exact product is unchanged and
  only the spread of the activations grows. e4m3's range (448 down to its smallest normal
  2^-6, a factor 2^14.8 ~ 28,700) absorbs x100 outliers: every recipe keeps its ~4 % error
  from 3 mantissa bits. Past that range, one scale for the tensor pushes the ordinary values
  under e4m3's smallest normal, where they lose their digits; a scale per row, and better a
  scale per 1 x b tile, keeps each block's own range (DeepSeek-V3 §3.3.2's reason for
  fine-grained scaling).
* ``loss_curves``: the tiny GPT trained ``steps`` steps in bfloat16 (parameters and
  activations, no autocast) and with each recipe's ``Float8Linear`` layers (the rest of the
  model in bfloat16), from the same weights on the same batches; ``LossCurves.band`` is the
  largest relative gap of an FP8 run's final loss (mean of the last 10 steps) from BF16's.

Laptop:  ``python -c "from lessonlib.precision import fp8_runs; print(fp8_runs.gemm_errors())"``
GPU box: the same, in one process.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from lessonlib.data import corpus_tokens, lm_batch
from lessonlib.models import TINY, GPTConfig, TinyGPT, lm_loss
from lessonlib.precision.fp8 import E4M3, RECIPES, quantize_operand, recipe
from lessonlib.precision.gemm import scaled_mm
from lessonlib.precision.linear import convert_to_float8

TINY_BLOCK = 16                 # the tiny GPT's h = 32: blockwise tiles of 1 x 16, 16 x 16
FACTORS = (1, 100, 10_000, 100_000)
LOSS_BAND = 0.05                # FP8 final loss within 5 % of BF16's (measured: see the tests)


def real_gemm(cfg: GPTConfig = TINY, batch: int = 8, seed: int = 0, dev=None):
    """The first block's ``fc1`` on a corpus batch: (its input (b*s, h), its weight (4h, h))."""
    model = TinyGPT(cfg, seed).to(dev)
    tokens, _ = corpus_tokens()
    idx = lm_batch(tokens, batch, cfg.seq, 0, seed)[0].to(dev)
    seen = {}
    fc1 = model.blocks[0].mlp.fc1
    handle = fc1.register_forward_hook(lambda m, args, out: seen.update(x=args[0]))
    with torch.no_grad():
        model(idx)
    handle.remove()
    return seen["x"].reshape(-1, cfg.hidden).detach(), fc1.weight.detach()   # (T, h), (4h, h)


def with_outliers(x: torch.Tensor, w: torch.Tensor, factor: float, channels: int = 3,
                  seed: int = 0):
    """``x`` with ``channels`` channels times ``factor``, ``w``'s columns divided by it."""
    picked = torch.randperm(x.shape[1], generator=torch.Generator().manual_seed(seed))
    picked = picked[:channels].to(x.device)
    x, w = x.clone(), w.clone()
    x[:, picked] *= factor
    w[:, picked] /= factor
    return x, w


def fp8_gemm(x: torch.Tensor, w: torch.Tensor, recipe_name: str, block: int = TINY_BLOCK):
    """``x @ w^T`` as ``Float8Linear``'s forward runs it: (T, K) @ (K, N) in float32."""
    r = recipe(recipe_name, block)
    return scaled_mm(quantize_operand(x, r, E4M3, "a"),
                     quantize_operand(w.t(), r, E4M3, "b", weight=True))


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


@dataclass(frozen=True)
class GemmError:
    recipe: str
    factor: float               # the outlier channels' magnitude against the rest
    relative_error: float


def gemm_errors(factors=FACTORS, block: int = TINY_BLOCK, seed: int = 0,
                dev=None) -> list[GemmError]:
    """Each recipe's GEMM error against float64 on the tiny GPT's activations, per factor."""
    x, w = real_gemm(seed=seed, dev=dev)
    rows = []
    for factor in factors:
        xf, wf = with_outliers(x, w, factor, seed=seed)
        exact = xf.double() @ wf.double().t()
        rows += [GemmError(name, factor, relative_error(fp8_gemm(xf, wf, name, block), exact))
                 for name in RECIPES]
    return rows


# ---------------------------------------------------------------- training
def train(model: torch.nn.Module, steps: int, batch: int = 8, lr: float = 3e-3,
          seed: int = 0) -> list[float]:
    """``steps`` AdamW steps on corpus batches; the loss of each step."""
    tokens, _ = corpus_tokens()
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    seq, losses = model.cfg.seq, []
    dev = next(model.parameters()).device
    for step in range(steps):
        idx, targets = (t.to(dev) for t in lm_batch(tokens, batch, seq, step, seed))
        loss = lm_loss(model(idx).float(), targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@dataclass(frozen=True)
class LossCurves:
    steps: int
    losses: dict[str, list[float]]      # "bf16" and each recipe: the loss of every step
    final: dict[str, float]             # mean of the last 10 steps
    gap: dict[str, float]               # each recipe's final loss / BF16's - 1

    @property
    def band(self) -> float:
        """The largest |gap| of an FP8 recipe from BF16."""
        return max(abs(g) for g in self.gap.values())


def loss_curves(steps: int = 200, cfg: GPTConfig = TINY, block: int = TINY_BLOCK,
                recipes=tuple(RECIPES), seed: int = 0) -> LossCurves:
    """BF16 and each FP8 recipe trained ``steps`` steps from the same bfloat16 weights."""
    start = TinyGPT(cfg, seed).to(torch.bfloat16)
    runs = {"bf16": copy.deepcopy(start)}
    runs.update({name: convert_to_float8(copy.deepcopy(start), name, block) for name in recipes})
    losses = {name: train(model, steps, seed=seed) for name, model in runs.items()}
    final = {name: sum(l[-10:]) / len(l[-10:]) for name, l in losses.items()}
    gap = {name: final[name] / final["bf16"] - 1 for name in recipes}
    return LossCurves(steps, losses, final, gap)
