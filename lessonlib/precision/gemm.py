"""The FP8 GEMM: two scaled FP8 matrices in, a float32 (or bf16) product out.

What it teaches: the hardware multiplies FP8 numbers and accumulates in higher precision;
the scales are applied to the product, not the inputs. ``torch._scaled_mm(a, b, scale_a,
scale_b)`` computes ``(a * scale_a) @ (b * scale_b)`` with the *dequantizing* scales (our
``1 / scale``), and on the CPU (torch 2.13) it accepts two layouts of scales:

* tensorwise: one scale per operand, (1, 1) each;
* rowwise: ``scale_a`` (M, 1) and ``scale_b`` (1, N), one per output row and column.

``scaled_mm`` sends the tensorwise case through the rowwise kernel too, its one scale
broadcast to every row and column: the same products, the scales applied in another order
(results differ from the tensorwise kernel's in float32's last bits), and on the CPU about
200x faster (measured, torch 2.13: 25 ms against 0.13 ms for a 128 x 32 x 96 GEMM).
Anything finer (its error message says so) is refused. DeepSeek-V3's blocks vary along K, the
contraction dim, so their scales cannot be pulled out of the sum over K. DeepSeek-V3 §3.3.2
runs the tensor cores on one K-interval at a time and *promotes* each partial sum to FP32,
multiplying it by its scales there. ``scaled_mm`` does the same: for each K-block of width
``bk`` it calls ``torch._scaled_mm`` rowwise on that slice (A's tile scale per row, B's block
scale spread over its columns) and adds the float32 partial products: FP8 products, float32
accumulation across blocks, nothing dequantized to full precision first.

Laptop:  ``python -c "from lessonlib.precision import gemm_errors; print(gemm_errors())"``
GPU box: the same; on CUDA ``torch._scaled_mm`` needs compute capability 8.9 or newer.
"""
from __future__ import annotations

import torch

from lessonlib.precision.fp8 import Scaled


def _dequantizing(scale: torch.Tensor) -> torch.Tensor:
    return scale.reciprocal()


def _kernel(a, b, scale_a, scale_b, out_dtype):
    """``torch._scaled_mm`` with per-row and per-column scales. CUDA's rowwise kernel has
    written only bfloat16 ("Only bf16 high precision output types are supported for row-wise
    scaling"): there it writes bfloat16, upcast, as torchao's Float8 does."""
    kernel_dtype = torch.bfloat16 if a.is_cuda and out_dtype == torch.float32 else out_dtype
    return torch._scaled_mm(a.contiguous(), _layout_b(b), scale_a=scale_a.contiguous(),
                            scale_b=scale_b.contiguous(), out_dtype=kernel_dtype).to(out_dtype)


def _layout_b(data: torch.Tensor) -> torch.Tensor:
    """``_scaled_mm`` reads B column-major (torchao passes it so): same values, that layout."""
    return data.t().contiguous().t()


def scaled_mm(a: Scaled, b: Scaled, out_dtype=torch.float32) -> torch.Tensor:
    """``a (M, K) @ b (K, N)`` from FP8 data and scales: (M, N) in ``out_dtype``."""
    (m, k), n = a.data.shape, b.data.shape[1]
    if a.block[1] == k and b.block[0] == k:              # tensorwise or rowwise: one call
        return _kernel(a.data, b.data, _dequantizing(a.scale).expand(m, 1),
                       _dequantizing(b.scale).expand(1, n), out_dtype)
    return blockwise_mm(a, b).to(out_dtype)


def blockwise_mm(a: Scaled, b: Scaled) -> torch.Tensor:
    """Per K-block partial products in FP8, each promoted to float32 with its scales and
    summed there (DeepSeek-V3 §3.3.2): (M, K) @ (K, N) -> (M, N) float32."""
    bk = a.block[1]
    if b.block[0] != bk:
        raise ValueError(f"blockwise GEMM: A's tiles are {bk} wide along K but B's blocks "
                         f"are {b.block[0]} tall")
    out = None
    for i in range(a.data.shape[1] // bk):
        ks = slice(i * bk, (i + 1) * bk)
        scale_a = _dequantizing(a.scale[:, i:i + 1])                             # (M, 1)
        scale_b = _dequantizing(b.scale[i:i + 1]).repeat_interleave(b.block[1], 1)  # (1, N)
        part = _kernel(a.data[:, ks], b.data[ks], scale_a, scale_b, torch.float32)  # (M, N)
        out = part if out is None else out + part
    return out
