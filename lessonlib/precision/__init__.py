"""Low precision: FP8 training as the frontier does it (DeepSeek-V3 §3.3, torchao's Float8).

Read in this order, each file one idea:

* ``fp8``: the two formats (e4m3: max 448, 3 mantissa bits; e5m2: max 57344, 2 bits), the
  three recipes (tensorwise, rowwise, DeepSeek-V3's blockwise: 1 x 128 tiles for
  activations and gradients, 128 x 128 blocks for weights) and ``quantize``, one scale per
  block of a 2-D tensor;
* ``gemm``: ``scaled_mm``, the FP8 GEMM through ``torch._scaled_mm`` (tensorwise and
  rowwise in one call; blockwise one K-block at a time, promoted to float32 and summed, as
  DeepSeek-V3 §3.3.2 does);
* ``linear``: ``Float8Linear`` (forward GEMM in e4m3, both backward GEMMs with the gradient
  in e5m2 or e4m3 as the recipe says, master weights in the module's dtype) and
  ``convert_to_float8``, which keeps the head and routers in high precision;
* ``fp8_runs``: what the lesson measures in one process: each recipe's GEMM error on the tiny
  GPT's activations with and without outlier channels, and loss curves against BF16;
* ``torchao_ref``: ours against torchao's ``Float8Linear`` (tensorwise, rowwise; its
  blockwise needs a Hopper GPU);
* ``fsdp_float8``: ``Float8AllGatherFSDP``, FSDP all-gathering Float8Linear weights as e4m3
  bytes with a scale agreed over the group: half of BF16's bytes in the ledger.

    from lessonlib.precision import Float8Linear, convert_to_float8, gemm_errors, loss_curves

Laptop:  ``python labs/fp8.py`` (GEMM error and step time per recipe)
GPU box: ``python labs/fp8.py`` on an H100: also the FP8 GEMM rate against BF16's
"""
from lessonlib.precision.fp8 import (E4M3, E5M2, FORMATS, RECIPES, Recipe, Scaled, largest,
                                     quantize, quantize_operand, recipe, relative_step)
from lessonlib.precision.fp8_runs import (GemmError, LossCurves, fp8_gemm, gemm_errors,
                                          loss_curves, real_gemm, with_outliers)
from lessonlib.precision.gemm import scaled_mm
from lessonlib.precision.linear import Float8Linear, convert_to_float8, float8_layers

__all__ = ["E4M3", "E5M2", "FORMATS", "RECIPES", "Recipe", "Scaled", "largest", "quantize",
           "quantize_operand", "recipe", "relative_step", "scaled_mm", "Float8Linear",
           "convert_to_float8", "float8_layers", "GemmError", "LossCurves", "fp8_gemm",
           "gemm_errors", "loss_curves", "real_gemm", "with_outliers"]
