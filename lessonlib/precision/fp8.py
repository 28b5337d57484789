"""The two FP8 formats and the three ways to scale a matrix into them.

What it teaches: an FP8 number has 8 bits, so a tensor can only be stored in FP8 after it is
multiplied by a *scale* that brings its largest value to the format's largest. Two formats
(Micikevicius et al. 2022, "FP8 formats for deep learning"):

* ``float8_e4m3fn``: 4 exponent bits, 3 mantissa bits, largest 448: more precision, less
  range. Weights and activations, the forward GEMM's operands.
* ``float8_e5m2``: 5 exponent bits, 2 mantissa bits, largest 57344: more range, less
  precision. Gradients, whose spread of magnitudes is wider (torchao's tensorwise recipe).

A recipe says how finely the scales are cut. Each operand of a GEMM ``A (M, K) @ B (K, N)``
is cut into blocks along the contraction dim K, one scale per block, ``scale = max / amax``
of the block (the block's largest |value| lands on the format's largest):

* **tensorwise**: one block, the whole matrix (torchao's default recipe);
* **rowwise**: one scale per row of A and per column of B, i.e. per output row and column
  (torchao's rowwise recipe, e4m3 for all three GEMMs, scales rounded down to powers of 2);
* **blockwise**: DeepSeek-V3 §3.3.2: 1 x 128 tiles for activations (one scale per token per
  128 channels), 128 x 128 blocks for weights; the paper does not state the activation
  gradients' tile, and they get the activations' 1 x 128 here. ``block`` is a parameter so
  that tiny tensors can use 1 x 16 and 16 x 16. e4m3 everywhere (DeepSeek-V3 §3.3.2): the
  fine scales give the gradients the range e5m2 would have bought.

``quantize(x, dtype, block)`` covers all three: ``block = (rows, cols)`` of one scale, the
whole matrix for tensorwise, ``(1, K)`` for a row. ``Scaled`` keeps the FP8 data with its
scales: ``x ~ data / scale`` block by block (the scale multiplies, as torchao's does;
``torch._scaled_mm`` takes the reciprocal).

Per element, after scaling, a value in e4m3's normal range is off by at most half a unit in
the last place: relative error <= 2^-4 (3 mantissa bits); e5m2: <= 2^-3. Values below the
smallest normal (2^-6 for e4m3, 2^-14 for e5m2, after scaling) lose relative precision: that
is where a coarse scale hurts, when one outlier forces every other value of its block down.

Laptop:  ``python -c "from lessonlib.precision import gemm_errors; print(gemm_errors())"``
GPU box: the same; the scales are computed where the tensor lives.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
FORMATS = {"e4m3": E4M3, "e5m2": E5M2}
EPS = 1e-12                       # the smallest amax a scale is taken from (torchao's EPS)
MANTISSA_BITS = {E4M3: 3, E5M2: 2}


def largest(dtype: torch.dtype) -> float:
    """The format's largest finite value: 448 (e4m3), 57344 (e5m2)."""
    return float(torch.finfo(dtype).max)


def relative_step(dtype: torch.dtype) -> float:
    """The worst relative rounding error of one normal value: half an ulp, 2^-(m+1)."""
    return 2.0 ** -(MANTISSA_BITS[dtype] + 1)


@dataclass(frozen=True)
class Recipe:
    """How a Float8Linear casts its three GEMMs' operands: the format of the inputs and
    weights (forward) and of the output gradient (both backward GEMMs), how they are
    blocked, and whether scales are rounded down to powers of 2."""
    name: str
    forward: torch.dtype           # x and W
    gradient: torch.dtype          # dL/dy
    granularity: str               # "tensor", "row" or "block"
    block: int = 128               # blockwise: tiles 1 x block, weight blocks block x block
    power_of_two: bool = False     # torchao's rowwise recipe rounds scales down to 2^k


RECIPES = {
    "tensorwise": Recipe("tensorwise", E4M3, E5M2, "tensor"),
    "rowwise": Recipe("rowwise", E4M3, E4M3, "row", power_of_two=True),
    "blockwise": Recipe("blockwise", E4M3, E4M3, "block"),
}


def recipe(name: str | Recipe, block: int | None = None) -> Recipe:
    """The recipe called ``name`` (``block`` sets blockwise's tile); a bad name is refused."""
    if isinstance(name, Recipe):
        return name
    if name not in RECIPES:
        raise ValueError(f"unknown FP8 recipe {name!r}: use one of {', '.join(RECIPES)}")
    r = RECIPES[name]
    if block is not None:
        if not isinstance(block, int) or block < 1:
            raise ValueError(f"block={block!r} must be a positive int")
        r = Recipe(r.name, r.forward, r.gradient, r.granularity, block, r.power_of_two)
    return r


def operand_block(r: Recipe, shape, side: str, weight: bool = False) -> tuple[int, int]:
    """The block one scale covers, for operand ``side`` ("a": (M, K), "b": (K, N)) of a GEMM
    under recipe ``r``; ``weight``: blockwise cuts weights into square blocks."""
    rows, cols = shape
    if r.granularity == "tensor":
        return rows, cols
    if r.granularity == "row":
        return (1, cols) if side == "a" else (rows, 1)
    if weight:
        return r.block, r.block
    return (1, r.block) if side == "a" else (r.block, 1)


@dataclass(frozen=True)
class Scaled:
    """An FP8 matrix and its scales: ``data (R, C)`` in FP8, ``scale (R/br, C/bc)`` float32,
    one per ``block = (br, bc)``; the value is ``data / scale`` block by block."""
    data: torch.Tensor
    scale: torch.Tensor
    block: tuple[int, int]

    def dequantize(self, dtype=torch.float32) -> torch.Tensor:
        br, bc = self.block
        per_element = self.scale.repeat_interleave(br, 0).repeat_interleave(bc, 1)
        return (self.data.to(torch.float32) / per_element).to(dtype)

    @property
    def t(self) -> "Scaled":
        """The transpose: the same bytes read as (C, R), the scales and the block swapped."""
        return Scaled(self.data.t(), self.scale.t(), self.block[::-1])


def check_block(shape, block: tuple[int, int]) -> None:
    for dim, (size, b) in enumerate(zip(shape, block)):
        if size % b:
            raise ValueError(f"FP8 block {block[0]}x{block[1]} does not divide the tensor's "
                             f"shape {tuple(shape)} (dim {dim}: {size} % {b} != 0); pick a "
                             f"block that divides it")


def amax_to_scale(amax: torch.Tensor, dtype: torch.dtype, power_of_two: bool = False):
    """``max / amax`` in float32 (divided in float64, as torchao does, so that the scale is
    the same however it is computed); rounded down to 2^k if asked."""
    scale = (largest(dtype) / amax.to(torch.float64).clamp(min=EPS)).to(torch.float32)
    return torch.exp2(torch.floor(torch.log2(scale))) if power_of_two else scale


def block_amax(x: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """The largest |value| of each block: (R, C) -> (R/br, C/bc)."""
    (rows, cols), (br, bc) = x.shape, block
    blocks = x.detach().abs().reshape(rows // br, br, cols // bc, bc)
    return blocks.amax(dim=(1, 3))


def cast(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype,
         block: tuple[int, int]) -> torch.Tensor:
    """``x * scale`` in float32, saturated to the format's range, rounded to FP8."""
    br, bc = block
    per_element = scale.repeat_interleave(br, 0).repeat_interleave(bc, 1)
    top = largest(dtype)
    return (x.detach().to(torch.float32) * per_element).clamp(-top, top).to(dtype)


def quantize(x: torch.Tensor, dtype: torch.dtype, block: tuple[int, int] | None = None,
             power_of_two: bool = False) -> Scaled:
    """A 2-D ``x`` in FP8 with one scale per ``block`` (default: the whole tensor)."""
    if x.ndim != 2:
        raise ValueError(f"quantize takes a 2-D tensor; got shape {tuple(x.shape)}")
    block = tuple(block or x.shape)
    check_block(x.shape, block)
    scale = amax_to_scale(block_amax(x, block), dtype, power_of_two)
    return Scaled(cast(x, scale, dtype, block), scale, block)


def quantize_operand(x: torch.Tensor, r: Recipe, dtype: torch.dtype, side: str,
                     weight: bool = False) -> Scaled:
    """Operand ``side`` of a GEMM under recipe ``r`` (see ``operand_block``)."""
    return quantize(x, dtype, operand_block(r, x.shape, side, weight), r.power_of_two)
