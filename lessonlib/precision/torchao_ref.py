"""``Float8Linear`` against torchao's, on the same layer and the same inputs.

What it teaches: the reference to hold an FP8 layer to is the one the teams train with.
torchao (0.18) runs its ``Float8Linear`` on the CPU for the tensorwise and rowwise recipes
(``convert_to_float8_training`` with ``Float8LinearConfig.from_recipe_name``). What differs,
and why:

* **tensorwise**: the same casts (the FP8 bytes and scales are bit-equal: ``casts_equal``)
  and the same GEMMs; the forward output differs in float32's last bits only, because
  ``gemm.scaled_mm`` runs the tensorwise case through the rowwise kernel (``gemm``'s
  docstring); the two gradients come out bit-equal.
* **rowwise**: the same casts (scales rounded down to powers of 2 in both), but torchao
  rounds each rowwise GEMM's float32 product to bfloat16 (to "work around torch._scaled_mm
  not having float32 output type", its ``addmm_float8_unwrapped`` says; which output dtypes
  CUDA's rowwise kernels offer depends on the GPU and CUDA version) and scales it there;
  ours stays float32. Rounding ours to bfloat16 gives torchao's gradients bit for bit
  (``bf16_rounding_equal``); its output (the forward's fast-accumulating kernel writes
  bfloat16 directly) is within one bfloat16 ulp, 2^-8 of the product, the bias added after.
* **blockwise**: torchao's ``Float8BlockwiseLinear`` (``prototype.blockwise_fp8_training``)
  runs Triton kernels, asserts an SM90 GPU and a block of 128: no CPU equivalent. Ours is
  checked against the float32 product of its dequantized blocks and the error bound instead.

Laptop:  ``python -c "from lessonlib.precision import torchao_ref as t; print(t.compare())"``
GPU box: the same, on the CPU (torchao's CUDA paths are its own lesson).
"""
from __future__ import annotations

import copy
import logging
from dataclasses import dataclass

import torch
from torch import nn

from lessonlib.precision.fp8 import quantize_operand, recipe
from lessonlib.precision.linear import Float8Linear

BF16_ULP = 2.0 ** -8            # one bfloat16 ulp, relative: torchao's rowwise products


@dataclass(frozen=True)
class TorchaoDiff:
    recipe: str
    output_max_abs: float
    grad_input_max_abs: float
    grad_weight_max_abs: float
    casts_equal: bool             # our FP8 bytes and scales of x and W == torchao's
    bf16_rounding_equal: bool     # ours rounded to bf16 == torchao's (both gradients)
    output_within_bf16: bool      # |ours - theirs| <= 2^-8 |x W^T| (+ float32's last bits)


def _quiet_torchao() -> None:
    """torchao logs a warning for each of its CUDA-only kernel libraries a CPU cannot load,
    and torch one for an enum torchao registers with torch.compile (deprecated, harmless);
    neither matters to a CPU comparison, so only their errors are shown."""
    for name in ("torchao", "torch.utils._pytree"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _step(module, x, grad_out):
    x = x.clone().requires_grad_()
    y = module(x)
    y.backward(grad_out)
    weight = module[0].weight if isinstance(module, nn.Sequential) else module.weight
    return y.detach(), x.grad, weight.grad


def _their_casts(x, weight, name: str):
    """torchao's FP8 cast of x (forward) and W^T (forward): (data, scale) each."""
    _quiet_torchao()
    from torchao.float8.config import Float8LinearConfig
    from torchao.float8.float8_scaling_utils import (get_maybe_axiswise_dim,
                                                     hp_tensor_to_float8_dynamic)
    from torchao.float8.float8_training_tensor import LinearMMConfig
    c = Float8LinearConfig.from_recipe_name(name)
    out = []
    for t, cfg, dim in ((x, c.cast_config_input, -1), (weight.t(), c.cast_config_weight, 0)):
        f8 = hp_tensor_to_float8_dynamic(
            t, cfg.target_dtype, LinearMMConfig(), scaling_granularity=cfg.scaling_granularity,
            axiswise_dim=get_maybe_axiswise_dim(dim, cfg.scaling_granularity),
            round_scales_to_power_of_2=c.round_scales_to_power_of_2)
        out.append((f8._data, f8._scale))
    return out


def compare(name: str = "tensorwise", in_features: int = 32, out_features: int = 48,
            tokens: int = 64, seed: int = 0) -> TorchaoDiff:
    """One linear layer, one input and one output gradient, through ours and torchao's."""
    _quiet_torchao()
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    if name not in ("tensorwise", "rowwise"):
        raise ValueError(f"torchao runs {name!r} on the GPU only; compare tensorwise or rowwise")
    gen = torch.Generator().manual_seed(seed)
    dense = nn.Linear(in_features, out_features)
    with torch.no_grad():
        dense.weight.copy_(torch.randn(out_features, in_features, generator=gen) * 0.1)
        dense.bias.copy_(torch.randn(out_features, generator=gen) * 0.1)
    x = torch.randn(tokens, in_features, generator=gen)                       # (T, K)
    grad_out = torch.randn(tokens, out_features, generator=gen)                # (T, N)
    theirs = nn.Sequential(copy.deepcopy(dense))
    convert_to_float8_training(theirs, config=Float8LinearConfig.from_recipe_name(name))
    ours = Float8Linear.from_linear(copy.deepcopy(dense), name)
    mine, ref = _step(ours, x, grad_out), _step(theirs, x, grad_out)
    r = recipe(name)
    our_casts = [quantize_operand(x, r, r.forward, "a"),
                 quantize_operand(dense.weight.detach().t(), r, r.forward, "b", weight=True)]
    casts_equal = all(torch.equal(a.data.view(torch.uint8), d.view(torch.uint8))
                      and torch.equal(a.scale.reshape(s.shape), s)
                      for a, (d, s) in zip(our_casts, _their_casts(x, dense.weight.detach(), name)))
    product = (mine[0] - dense.bias.detach()).abs()
    slack = BF16_ULP if name == "rowwise" else 0.0
    within = bool(((mine[0] - ref[0]).abs() <= slack * product + 1e-5).all())
    rounded = all(torch.equal(m.to(torch.bfloat16).float(), t) for m, t in zip(mine[1:], ref[1:]))
    return TorchaoDiff(name, *[(m - t).abs().max().item() for m, t in zip(mine, ref)],
                       casts_equal, rounded, within)
