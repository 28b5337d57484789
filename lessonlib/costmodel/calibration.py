"""Calibrate the cost model with what one machine measured: its GEMM rates and all-reduces.

What it teaches: the cost model prices a GEMM under the GPU's Maximum Achievable Matmul
FLOPS (``GPU.matmul_flops``, a published sweep's best rate; ``gemm.py``) and a collective by
the alpha-beta model of its link (``Cluster``'s latency and bandwidth, ``comm.py``). Measure
both on a real machine (``labkit.gemm_rates``; ``labs/gpu_check.py``'s all-reduce curve),
and ``calibrate`` refits them: the best measured GEMM rate becomes the GPU's MAMF (run, as
the preset's, at the share the part sustains in training: ``hardware.SUSTAINED``), a fit of
alpha and the bus bandwidth to the all-reduce times becomes the NVLink of its servers. It
returns the measured curve beside the preset's prediction of each point, and what the refit
changes in the prediction for Megatron-LM 2021's 145.6 B row. The refit is a new ``GPU`` and
``Cluster``: nothing global changes, and no cached price of the old GPU is reused.
Pure arithmetic, like the rest of the cost model.

Laptop:  ``python -c "from lessonlib.costmodel.calibration import calibrate;
         print(calibrate([{'n': 8192, 'tflops': 500.0}], 'NVIDIA H100'))"``
GPU box: ``python labs/gpu_check.py`` measures the curves and calls this.
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, replace

from . import gemm, throughput
from .alpha_beta import fit_alpha_beta
from .hardware import GPUS, make_cluster
from .megatron2021 import load_table1, table1_layout, table1_model


def peak_preset(name: str):
    """The cost model's GPU preset whose name is in this device's name, if any."""
    for key in sorted(GPUS, key=len, reverse=True):
        if key.split("-")[0].upper() in name.upper():
            return GPUS[key]
    return None


def refit_gpu(preset, rates: list[dict]):
    """``preset`` with the best measured rate of ``rates`` as its BF16 MAMF: a timing of
    seconds is a burst, so the refit runs it at the share the preset sustains in training
    (``GPU.clock_share``, ``hardware.SUSTAINED``)."""
    return replace(preset, matmul_flops=max(r["tflops"] for r in rates) * 1e12
                   * preset.clock_share)


def refit_cluster(cluster, allreduce: list[tuple]):
    """``cluster`` with the NVLink latency and bandwidth that an alpha-beta fit of the ring
    all-reduce gives to ``allreduce`` = [(ranks, bytes, seconds)]; the fit's bandwidth is
    the bus bandwidth NCCL reaches, so the link's rate is that over ``COMM_EFFICIENCY``
    (the share the model applies to every link)."""
    fit = fit_alpha_beta(allreduce, "ring")
    link = fit.bandwidth_Bps / throughput.COMM_EFFICIENCY
    return replace(cluster, nvlink_bytes_per_s=link, nvlink_latency_s=fit.alpha_s), fit


def calibrate(rates: list[dict], gpu_name: str, allreduce: list[tuple] | None = None) -> dict:
    """What ``rates`` (``labkit.gemm_rates`` rows: n, tflops) and ``allreduce`` ((ranks,
    bytes, seconds) points, None if not measured) say about the preset of ``gpu_name``."""
    out = {"device": gpu_name, "median_tflops": statistics.median(r["tflops"] for r in rates),
           "largest_gemm_tflops": rates[-1]["tflops"], "preset": None}
    if allreduce:
        out["allreduce_fit"] = asdict(fit_alpha_beta(allreduce, "ring"))
    preset = peak_preset(gpu_name)
    if preset is None:
        return out
    measured = refit_gpu(preset, rates)
    share = preset.clock_share      # what the part sustains of a burst (hardware.SUSTAINED)
    out.update(preset=preset.name, peak_tflops=preset.peak_flops / 1e12,
               assumed_mamf_tflops=gemm.matmul_flops(preset) / share / 1e12,
               sustained_share=share,
               measured_mamf_tflops=measured.matmul_flops / share / 1e12,
               measured_matmul_efficiency=measured.matmul_flops / share / preset.peak_flops,
               largest_gemm_efficiency=out["largest_gemm_tflops"] * 1e12 / preset.peak_flops)
    # burst against burst: the model's GEMM time over the sustained share, beside the timing
    out["gemm_curve"] = [
        {"n": r["n"], "measured_tflops": r["tflops"],
         **{f"predicted_tflops_{who}": 2 * r["n"] ** 3 / gemm.gemm_time_s(gpu, *[r["n"]] * 3)
            / share / 1e12 for who, gpu in (("preset", preset), ("refit", measured))}}
        for r in rates if "n" in r]
    # What the refit changes in a prediction: Megatron-LM 2021's 145.6 B row, on servers of
    # this GPU.
    row = next(r for r in load_table1() if r["params_billion"] == 145.6)
    model, layout = table1_model(row), table1_layout(row)
    cluster = make_cluster(preset)
    refit = make_cluster(measured)
    if allreduce:
        refit, _ = refit_cluster(refit, allreduce)
    out["prediction_145.6B"] = {
        "layout": layout.describe(), "cluster": f"8 x {preset.name}",
        "tflops_per_gpu_preset": throughput.estimate(model, layout, cluster).tflops_per_gpu,
        "tflops_per_gpu_refit": throughput.estimate(model, layout, refit).tflops_per_gpu}
    return out
