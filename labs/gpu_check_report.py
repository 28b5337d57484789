"""labs/gpu_check.py's report: every point's row, rewritten as JSON and as a markdown table
after each point, so a run cut short still says what it saw; each point with its own
timeout, and a point that the budget no longer fits skipped and said so.

GPU box: used by ``python labs/gpu_check.py``; nothing to run on its own.
Laptop:  the same.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from gpu_check_labs import lab_summary, show
from gpu_check_plan import MODES

from lessonlib import gloo_cuda

POINT_CAP_S = {"versions": 30, "launch": 90, "gemm": 60, "curve": 90, "memory": 60,
               "lab": 120, "resume": 150}
POINT_MIN_S = {"versions": 1, "launch": 10, "gemm": 10, "curve": 20, "memory": 5,
               "lab": 20, "resume": 40}                           # else skip


class Report:
    """Every point's row, written out (JSON and markdown) after each one."""

    def __init__(self, out: Path, machine: dict, budget_s: float):
        self.out, self.machine, self.rows, self.extra = out, machine, [], {}
        self.deadline = time.monotonic() + budget_s
        out.mkdir(parents=True, exist_ok=True)
        (out / "points").mkdir(exist_ok=True)
        (out / "logs").mkdir(exist_ok=True)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, name: str, kind: str, fn, meta: dict | None = None) -> dict:
        """Run ``fn(timeout)`` as point ``name`` (``meta``: columns the row keeps whatever
        happens: its ranks, where they compute)."""
        timeout = min(POINT_CAP_S[kind], self.left())
        if timeout < POINT_MIN_S[kind]:          # too little left to be worth starting
            row = {"lab": name, "point": name, "status": "skipped",
                   "error": f"{max(self.left(), 0):.1f} s of --budget-s left, under the "
                            f"{POINT_MIN_S[kind]} s this point needs"}
        else:
            print(f"{name} (at most {timeout:.0f} s) ...", file=sys.stderr, flush=True)
            start = time.monotonic()
            try:
                row = {"lab": name, "status": "ok", **fn(timeout), "point": name}
            except Exception as exc:              # a point that fails is reported, not fatal
                row = {"lab": name, "point": name, "status": "failed",
                       "error": f"{type(exc).__name__}: "
                       f"{str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"[:300]}
            row.setdefault("seconds", round(time.monotonic() - start, 3))
        row = {**row, **(meta or {})}
        self.rows.append(row)
        self.write()
        return row

    def write(self) -> None:
        (self.out / "report.json").write_text(json.dumps(
            {"machine": self.machine, "points": self.rows, **self.extra}, indent=1,
            default=str) + "\n")
        (self.out / "report.md").write_text(markdown(self.machine, self.rows, self.extra))


def markdown(machine: dict, rows: list[dict], extra: dict) -> str:
    lines = [f"# GPU check: {machine['device']}", "",
             f"{machine['gpus']} GPU(s) visible; {machine['settings']} settings, a budget of "
             f"{machine['budget_s']:.0f} s.", "",
             "| point | ranks | where | status | seconds | parity | result |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.get('point', r['lab'])} | {show(r.get('world_size'))} | "
                     f"{MODES.get(r.get('mode'), '')} | {r['status']} | {show(r.get('seconds'))} "
                     f"| {show(r.get('parity'))} | {point_summary(r)} |")
    cut = [r["point"] for r in rows
           if r["status"] == "skipped" and "--budget-s" in (r.get("error") or "")]
    if cut:
        lines += ["", f"Cut by --budget-s ({len(cut)}): {', '.join(cut)}."]
    if any(r.get("mode") == "shared" for r in rows):
        lines += ["", f"Note: {gloo_cuda.NOTE}."]
    if not machine["gpus"]:
        lines += ["", "No GPU here: every point ran on CPU ranks; the shared-GPU and NCCL "
                  "points need a GPU (python labs/gpu_check.py --dry-run lists them)."]
    calib = extra.get("calibration")
    if calib and calib.get("preset"):
        lines += ["", f"Matrix products: best {calib['measured_mamf_tflops']:.4g} TFLOP/s = "
                  f"**{calib['measured_matmul_efficiency']:.2f}** of the {calib['preset']} dense "
                  f"peak ({calib['peak_tflops']:.0f} TFLOP/s); the cost model's ceiling is the "
                  f"published MAMF, {calib['assumed_mamf_tflops']:.4g} TFLOP/s, run in training at "
                  f"{calib.get('sustained_share', 1.0):.2f} of it (the sustained clock). Per size, "
                  "measured / predicted with the preset / with the refit: " + ", ".join(
                      f"n={g['n']}: {g['measured_tflops']:.3g} / "
                      f"{g['predicted_tflops_preset']:.3g} / {g['predicted_tflops_refit']:.3g}"
                      for g in calib["gemm_curve"]) + "."]
        fit = calib.get("allreduce_fit")
        if fit:
            lines.append(f"All-reduce over {machine['gpus']} GPUs: alpha "
                         f"{fit['alpha_s'] * 1e6:.3g} us per ring step, bus bandwidth "
                         f"{fit['bandwidth_Bps'] / 1e9:.4g} GB/s (fit to {fit['points']} sizes, "
                         f"{fit['rms_relative_error']:.0%} rms), the NVLink the refit uses.")
        if "prediction_145.6B" in calib:
            p = calib["prediction_145.6B"]
            lines.append(f"Megatron-LM 2021's 145.6 B row ({p['layout']}, {p['cluster']}): "
                         f"{p['tflops_per_gpu_preset']:.0f} TFLOP/s per GPU predicted with the "
                         f"preset, {p['tflops_per_gpu_refit']:.0f} with what this machine "
                         f"measured.")
    elif calib:
        lines += ["", f"Matrix products: median {calib['median_tflops']:.4g} TFLOP/s on "
                  f"{calib['device']} (no cost-model preset for it)."]
    return "\n".join(lines) + "\n"


def point_summary(row: dict) -> str:
    if row["lab"] == "versions" and row["status"] == "ok":
        return (f"Python {row['python']}, torch {row['torch']}, CUDA {row['cuda']}, "
                f"NCCL {row['nccl']}, {', '.join(row['gpus']) or 'no GPU'}")
    if row["lab"] == "launch" and row["status"] == "ok":
        return (f"1 rank on {row['backend']}: all-reduce of 4 kB in {row['all_reduce_s']:.3g} s "
                f"({row['timed_by']})")
    if row["lab"] == "allreduce curve" and row["status"] == "ok":
        return ", ".join(f"{size / 2**20:.3g} MiB: {seconds * 1e6:.4g} us"
                         for _, size, seconds in row["allreduce"])
    if row["lab"] == "gemm" and row["status"] == "ok":
        return ", ".join(f"n={g['n']}: {g['tflops']:.3g} TFLOP/s" for g in row["gemm"])
    if row["lab"] == "memory" and row["status"] == "ok":
        return memory_summary(row)
    if row.get("mfu") is not None:
        return f"{lab_summary(row)}; MFU {row['mfu']:.2f}"
    if row.get("point") == "train+resume" and row["status"] == "ok":
        return (f"{lab_summary(row)}; resumed from step "
                f"{row['results.lessonlib.resumed_from_step']}")
    return lab_summary(row)


def memory_summary(row: dict) -> str:
    """The memory point's line in the report."""
    if not row.get("measured"):
        return ("no GPU: peak memory not measured; predicted "
                + ", ".join(f"b={r['batch']}: {r['predicted_gib'] * 1024:.2f} MiB"
                            for r in row["memory"]))
    return "; ".join(f"b={r['batch']}: {r['allocated_gib'] * 1024:.0f} MiB allocated, "
                     f"{r['reserved_gib'] * 1024:.0f} reserved, "
                     f"{r['predicted_gib'] * 1024:.0f} predicted "
                     f"(allocated/predicted {r['allocated_over_predicted']:.2f})"
                     for r in row["memory"])
