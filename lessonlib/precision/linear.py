"""``Float8Linear``: a linear layer whose three GEMMs run in FP8, and the model swap.

What it teaches: a linear layer is three GEMMs, and FP8 training casts the operands of each
just before it, keeping everything else as it was:

* forward:      y = x @ W^T            x, W in e4m3;
* grad_input:   dL/dx = dL/dy @ W      dL/dy in the recipe's gradient format (e5m2 for
                                       tensorwise, e4m3 for rowwise and blockwise);
* grad_weight:  dL/dW = dL/dy^T @ x    the same.

Each operand is scaled along that GEMM's contraction dim (``fp8.operand_block``), so the
row- and blockwise recipes quantize x and dL/dy again, the other way, for grad_weight. The
layer's weight (the master weight, what the optimizer steps) and bias stay in the module's
dtype; the GEMMs' products come back in the input's dtype; the bias is added after.

What stays in high precision, as the teams state it. DeepSeek-V3 §3.3.1 keeps "the embedding
module, the output head, MoE gating modules, normalization operators, and attention
operators" in BF16 or FP32, and the master weights, weight gradients and optimizer states in
higher precision. torchao's ``convert_to_float8_training`` swaps ``nn.Linear`` modules only
(a ``module_filter_fn`` leaves out others; its docs leave the output head and small layers in
high precision). ``convert_to_float8`` here swaps every ``nn.Linear`` of the model except
the output head (``models.Head``) and an MoE router (``moe.MoELayer.router``); embeddings,
LayerNorms and attention's softmax are not linear layers and stay as they are.

Laptop:  ``python -c "from lessonlib.precision import loss_curves; print(loss_curves(steps=20))"``
GPU box: the same; the FP8 GEMMs run on the GPU's FP8 tensor cores (H100 and newer).
"""
from __future__ import annotations

import torch
from torch import nn

from lessonlib.models import Head
from lessonlib.models.moe import MoELayer
from lessonlib.precision.fp8 import Recipe, Scaled, quantize_operand, recipe
from lessonlib.precision.gemm import scaled_mm


class Float8Matmul(torch.autograd.Function):
    """``x (T, K) @ W^T`` with all three GEMMs in FP8. ``w8``: the weight already cast
    (FSDP's FP8 all-gather attaches it to the gathered weight as ``weight.float8``;
    tensorwise) or None to cast ``weight`` here."""

    @staticmethod
    def forward(ctx, x, weight, r: Recipe, w8: Scaled | None):
        ctx.r, ctx.w8 = r, w8
        ctx.save_for_backward(x, weight)
        weight_t = w8.t if w8 is not None else quantize_operand(weight.t(), r, r.forward, "b",
                                                                 weight=True)
        x8 = quantize_operand(x, r, r.forward, "a")
        return scaled_mm(x8, weight_t, x.dtype)                                  # (T, N)

    @staticmethod
    def backward(ctx, grad_out):                                                 # (T, N)
        x, weight = ctx.saved_tensors
        r, dtype = ctx.r, ctx.r.gradient
        grad_x = grad_w = None
        if ctx.needs_input_grad[0]:
            w8 = ctx.w8 if ctx.w8 is not None else quantize_operand(weight, r, r.forward, "b",
                                                                     weight=True)
            g8 = quantize_operand(grad_out, r, dtype, "a")
            grad_x = scaled_mm(g8, w8, x.dtype)                                  # (T, K)
        if ctx.needs_input_grad[1]:
            g8_t = quantize_operand(grad_out.t(), r, dtype, "a")                 # (N, T)
            x8 = quantize_operand(x, r, r.forward, "b")                          # (T, K)
            grad_w = scaled_mm(g8_t, x8, weight.dtype)                           # (N, K)
        return grad_x, grad_w, None, None


class Float8Linear(nn.Linear):
    """``nn.Linear`` whose GEMMs run in FP8 under ``recipe``; build it with ``from_linear``."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 recipe_name: str | Recipe = "tensorwise", block: int | None = None,
                 device=None, dtype=None):
        super().__init__(in_features, out_features, bias, device, dtype)
        self.recipe = recipe(recipe_name, block)

    @classmethod
    def from_linear(cls, linear: nn.Linear, recipe_name: str | Recipe = "tensorwise",
                    block: int | None = None) -> "Float8Linear":
        """The same layer, the same parameters (shared, not copied)."""
        with torch.device("meta"):
            new = cls(linear.in_features, linear.out_features, False, recipe_name, block)
        new.weight, new.bias = linear.weight, linear.bias
        return new

    def forward(self, x):
        flat = x.reshape(-1, x.shape[-1])                                         # (T, K)
        w8 = getattr(self.weight, "float8", None)      # cast already: FSDP's FP8 all-gather
        y = Float8Matmul.apply(flat, self.weight, self.recipe, w8)                # (T, N)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.reshape(*x.shape[:-1], y.shape[-1])

    def extra_repr(self) -> str:
        r = self.recipe
        return f"{super().extra_repr()}, recipe={r.name}" + (
            f", block={r.block}" if r.granularity == "block" else "")


def kept_in_high_precision(name: str, module: nn.Module, parent: nn.Module) -> bool:
    """The linear layers the teams keep out of FP8: the output head and MoE routers."""
    return isinstance(parent, (Head, MoELayer)) and name.rsplit(".", 1)[-1] in ("out", "router")


def convert_to_float8(model: nn.Module, recipe_name: str | Recipe = "tensorwise",
                      block: int | None = None) -> nn.Module:
    """Swap ``model``'s ``nn.Linear`` layers for ``Float8Linear`` (in place; the model is
    returned), leaving the head and routers in high precision (see the module docstring)."""
    r = recipe(recipe_name, block)
    for parent_name, parent in list(model.named_modules()):
        for name, child in list(parent.named_children()):
            full = f"{parent_name}.{name}" if parent_name else name
            if type(child) is nn.Linear and not kept_in_high_precision(full, child, parent):
                setattr(parent, name, Float8Linear.from_linear(child, r))
    return model


def float8_layers(model: nn.Module) -> list[str]:
    """The names of ``model``'s ``Float8Linear`` layers."""
    return [n for n, m in model.named_modules() if isinstance(m, Float8Linear)]
