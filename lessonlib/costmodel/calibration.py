"""Calibrate the cost model with a measured matrix-product rate.

What it teaches: the cost model assumes large GEMMs reach ``gemm.GEMM_PEAK_FRACTION`` (0.65,
chosen on Megatron-LM 2021's Table 1) of a GPU's dense peak, smaller ones less by their shape. Measure the rate on a real GPU
(``labkit.gemm_rates``), and ``calibrate`` says which fraction of the preset's datasheet
peak it reached, and what that changes in the prediction for Megatron-LM 2021's 145.6 B row.
Pure arithmetic, like the rest of the cost model.

Laptop:  ``python -c "from lessonlib.costmodel.calibration import calibrate;
         print(calibrate([{'tflops': 500.0}], 'NVIDIA H100'))"``
GPU box: ``python labs/gpu_check.py`` measures the rates and calls this.
"""
from __future__ import annotations

import statistics

from . import gemm, throughput
from .hardware import GPUS, make_cluster
from .megatron2021 import load_table1, table1_layout, table1_model


def peak_preset(name: str):
    """The cost model's GPU preset whose name is in this device's name, if any."""
    for key in sorted(GPUS, key=len, reverse=True):
        if key.split("-")[0].upper() in name.upper():
            return GPUS[key]
    return None


def calibrate(rates: list[dict], gpu_name: str) -> dict:
    preset = peak_preset(gpu_name)
    out = {"device": gpu_name, "assumed_matmul_efficiency": gemm.GEMM_PEAK_FRACTION,
           "median_tflops": statistics.median(r["tflops"] for r in rates),
           "largest_gemm_tflops": rates[-1]["tflops"], "preset": None}
    if preset is None:
        return out
    eff = out["median_tflops"] * 1e12 / preset.peak_flops
    out.update(preset=preset.name, peak_tflops=preset.peak_flops / 1e12,
               measured_matmul_efficiency=eff,
               largest_gemm_efficiency=out["largest_gemm_tflops"] * 1e12 / preset.peak_flops)
    # What the measured efficiency changes in a prediction: Megatron-LM 2021's 145.6 B row,
    # on servers of this GPU.
    row = next(r for r in load_table1() if r["params_billion"] == 145.6)
    model, layout = table1_model(row), table1_layout(row)
    cluster = make_cluster(preset)
    default = throughput.estimate(model, layout, cluster).tflops_per_gpu
    try:
        gemm.GEMM_PEAK_FRACTION = eff
        measured = throughput.estimate(model, layout, cluster).tflops_per_gpu
    finally:
        gemm.GEMM_PEAK_FRACTION = out["assumed_matmul_efficiency"]
    out["prediction_145.6B"] = {"layout": layout.describe(), "cluster": f"8 x {preset.name}",
                                "tflops_per_gpu_assumed": default,
                                "tflops_per_gpu_measured_efficiency": measured}
    return out
