"""Check a GPU machine: every lab at the largest world size it allows, and the GEMM rate.

What it teaches: before trusting a cluster's numbers, check that every piece runs on it and
how fast its matrix products really are. This script

1. runs each lab in ``labs/`` once with short settings, on NCCL at the largest world size
   the visible GPUs allow (one GPU is fine: each lab says what it does with one rank), with
   ``lessonlib.placement``'s audit on: a lab whose ranks compute on anything but their
   own GPU says so in the table;
2. times bf16 matrix products from 1024 to 8192 and compares the median TFLOP/s with the
   GPU's dense peak from ``lessonlib.costmodel``: the ratio is what the cost model's
   ``MATMUL_EFFICIENCY`` assumes (0.6, chosen on Megatron-LM 2021's Table 1), now measured;
3. writes ``report.md`` and ``report.json`` (plus each lab's JSON and log) to a folder.

On a machine without a GPU it says so and stops; ``--allow-cpu`` runs the same checks on
two CPU ranks (gloo) with tiny settings and fp32 products, to test the script itself.

GPU box: python labs/gpu_check.py [--out results/gpu_check]
Laptop:  python labs/gpu_check.py --allow-cpu --quick
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import sweep  # labs/sweep.py: runs one lab and turns its record into a row

from lessonlib import device, placement
from lessonlib.costmodel import throughput  # noqa: F401 (its MATMUL_EFFICIENCY, for readers)
from lessonlib.costmodel.calibration import calibrate
from lessonlib.labkit import gemm_rates


@dataclass
class Lab:
    """How to run one lab briefly; ``largest(n)`` is the biggest world size <= n it takes."""

    tiny: dict                     # CPU ranks, seconds per lab
    short: dict                    # a GPU, still seconds, sizes that make the GPU work
    at_one: str                    # what the lab shows with a single rank
    largest: object = staticmethod(lambda n: n)
    metrics: dict = field(default_factory=dict)   # label -> flat result column


def _divisor_at_most(n: int, of: int) -> int:
    return max(k for k in range(1, min(n, of) + 1) if of % k == 0)


def _power_of_two_at_most(n: int, cap: int = 8) -> int:
    k = 1
    while k * 2 <= min(n, cap):
        k *= 2
    return k


LABS = {
    "launch_overhead": Lab(
        tiny={"repeats": "1"}, short={"repeats": "3"},
        at_one="starts one rank that all-reduces one number with itself: the fixed cost of a launch",
        metrics={"launch s": "results.lessonlib.total_s"}),
    "allreduce": Lab(
        tiny={"size-mb": "0.25", "budget-s": "0.3"}, short={"size-mb": "256", "budget-s": "2"},
        at_one="skipped: an all-reduce over one rank moves no bytes (bus bandwidth factor "
               "2(n-1)/n = 0); it needs 2 ranks",
        largest=lambda n: n if n >= 2 else None,
        metrics={"ring busbw GB/s": "results.ring.busbw_GBps",
                 "torch busbw GB/s": "results.torch.busbw_GBps"}),
    "ddp": Lab(
        tiny={"model": "tiny", "steps": "2", "warmup": "1", "rounds": "1", "batch": "2"},
        short={"model": "10M", "steps": "5", "warmup": "2", "rounds": "1", "batch": "8"},
        at_one="one replica: the gradient all-reduce spans a group of one, so the step time "
               "is the baseline that scaling efficiency divides by",
        metrics={"lessonlib step s": "results.lessonlib.step_time_s",
                 "torch DDP step s": "results.torch.step_time_s"}),
    "mp": Lab(
        tiny={"steps": "2", "warmup": "1", "rounds": "1", "layers": "4", "hidden": "32"},
        short={"steps": "5", "warmup": "2", "rounds": "2", "layers": "16", "hidden": "1024",
               "batch": "32"},
        at_one="p = 1: the whole model on one rank, nothing idles; the baseline the split "
               "is measured against",
        metrics={"p=1 step s": "results.lessonlib.by_p.1.step_time_s"}),
    "tp": Lab(
        tiny={"steps": "2", "warmup": "1", "batch": "2", "seq": "16", "hidden": "32", "heads": "4"},
        short={"steps": "5", "warmup": "2", "batch": "8", "seq": "512", "hidden": "1024",
               "heads": "16", "sequence-parallel": "true", "recompute": "selective"},
        at_one="t = 1: the unsharded layer, f and g are identities and no all-reduce runs; "
               "the dense baseline",
        largest=lambda n: _divisor_at_most(n, 16),
        metrics={"lessonlib step s": "results.lessonlib.step_time_s",
                 "torch step s": "results.torch.step_time_s",
                 "output error": "results.lessonlib.layers.block.output_max_abs_error"}),
    "pp": Lab(
        tiny={"steps": "2", "warmup": "1", "microbatches": "2", "width": "32",
              "layers-per-stage": "2", "microbatch-size": "8", "schedules": "1f1b zb-h1 zbv"},
        short={"steps": "5", "warmup": "2", "microbatches": "4 8", "width": "2048",
               "layers-per-stage": "4", "microbatch-size": "256",
               "schedules": "gpipe 1f1b zb-h1 zbv"},
        at_one="p = 1: one stage holds every layer; nothing is sent and the theory's bubble "
               "(p-1)/(m+p-1) is 0, so what it measures is the schedule's own overhead",
        metrics={"lessonlib step s": "results.lessonlib.step_time_s",
                 "torch step s": "results.torch.step_time_s"}),
    "hybrid": Lab(
        tiny={"steps": "2", "warmup": "1", "layers": "2", "hidden": "32", "heads": "2",
              "seq": "16", "global-batch": "8", "microbatches": "2"},
        short={"steps": "3", "warmup": "1"},
        at_one="only the layout t1p1d1: plain training on one GPU, checked against one process",
        largest=_power_of_two_at_most,
        metrics={"layouts": "settings.layouts"}),
    "train": Lab(
        tiny={"steps": "20", "checkpoint-every": "10", "layers": "2", "hidden": "32",
              "seq": "16", "global-batch": "8", "microbatches": "2", "fresh": "true"},
        short={"steps": "100", "checkpoint-every": "50", "layers": "8", "hidden": "1024",
               "heads": "16", "seq": "512", "fresh": "true"},
        at_one="t1p1d1: plain training with checkpoints every N steps (--fresh: from step 0)",
        largest=_power_of_two_at_most,
        metrics={"step s": "results.lessonlib.step_time_s",
                 "checkpoint save s": "results.lessonlib.checkpoint_save_s"}),
    "zero": Lab(
        tiny={"steps": "2", "warmup": "1", "rounds": "1", "layers": "2", "hidden": "16",
              "heads": "4", "seq": "8"},
        short={"steps": "3", "warmup": "1", "rounds": "1", "layers": "8", "hidden": "1024",
               "heads": "16", "seq": "512"},
        at_one="d = 1: nothing to shard, every stage holds the whole model state; the "
               "baseline each stage's memory is divided from",
        metrics={"lessonlib stage-3 step s": "results.lessonlib.step_time_s",
                 "torch fully_shard step s": "results.torch.step_time_s"}),
    "ep": Lab(
        tiny={"steps": "2", "warmup": "1", "experts": "4", "batch": "2", "seq": "16",
              "hidden": "32"},
        short={"steps": "5", "warmup": "2", "experts": "8", "batch": "8", "seq": "1024",
               "hidden": "1024"},
        at_one="e = 1: every expert on one rank; the all-to-alls only copy to itself",
        largest=lambda n: _divisor_at_most(n, 8),
        metrics={"step s": "results.lessonlib.step_time_s",
                 "all-to-all share": "results.lessonlib.moe_layer.alltoall_share",
                 "torch all-to-all s": "results.torch.step_time_s"}),
}
GENERIC = Lab(tiny={"steps": "2", "warmup": "1"}, short={"steps": "3", "warmup": "1"},
              at_one="(a lab this script has no notes for: run with its defaults)",
              metrics={"lessonlib step s": "results.lessonlib.step_time_s",
                       "torch step s": "results.torch.step_time_s"})


# ---------------------------------------------------------------- the labs
def plan(n_ranks: int, gpu: bool, quick: bool) -> tuple[list, list[dict]]:
    """(jobs for sweep, rows for labs that do not run), in a fixed order."""
    present = sweep.available_labs()
    jobs, skipped = [], []
    for name in list(LABS) + [lab for lab in present if lab not in LABS]:
        lab = LABS.get(name, GENERIC)
        if name not in present:
            skipped.append({"lab": name, "status": "skipped",
                            "error": f"labs/{name}.py is not there yet"})
            continue
        ranks = lab.largest(n_ranks)
        if ranks is None:
            skipped.append({"lab": name, "status": "skipped", "world_size": n_ranks,
                            "error": lab.at_one})
            continue
        settings = lab.tiny if (quick or not gpu) else lab.short
        jobs.append((name, [{"world_size": str(ranks), "backend": "nccl" if gpu else "gloo",
                             **settings}]))
    return jobs, skipped


def _show(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, list):
        return ",".join(map(str, value))
    return "" if value is None else str(value)


def lab_summary(row: dict) -> str:
    lab = LABS.get(row["lab"], GENERIC)
    if row["status"] != "ok":
        return row.get("error") or ""
    shown = [f"{label} {_show(row[col])}" for label, col in lab.metrics.items() if col in row]
    errors = [v for k, v in row.items() if k.endswith("max_weight_diff_vs_one_process")]
    if errors:
        shown.append(f"max weight diff vs one process {max(errors):.2g}")
    if row.get("off_device"):
        shown.append("NOT ALL ON THE GPU: " + " / ".join(row["off_device"]))
    elif row.get("off_device") == []:
        shown.append("every compute call on the GPU")
    return "; ".join(shown)


# ---------------------------------------------------------------- the report
def markdown(machine: dict, rows: list[dict], rates: list[dict], calib: dict) -> str:
    lines = [f"# GPU check: {machine['device']}", "",
             f"{machine['gpus']} GPU(s) visible; labs ran on {machine['backend']} ranks, "
             f"{machine['settings']} settings; torch {machine['torch']}.", "",
             "| lab | ranks | status | seconds | result |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['lab']} | {_show(r.get('world_size'))} | {r['status']} | "
                     f"{_show(r.get('seconds'))} | {lab_summary(r)} |")
    if machine["gpus"] == 1:
        lines += ["", "With one GPU each lab runs one rank:", ""]
        lines += [f"- **{name}**: {lab.at_one}" for name, lab in LABS.items()]
    lines += ["", f"## Matrix products ({rates[0]['dtype']})", "",
              "| n | TFLOP/s (median) | samples |", "|---|---|---|"]
    lines += [f"| {r['n']} | {r['tflops']:.3g} | {r['samples']} |" for r in rates]
    lines.append("")
    if calib.get("preset"):
        p = calib["prediction_145.6B"]
        lines += [f"Median {calib['median_tflops']:.4g} TFLOP/s = "
                  f"**{calib['measured_matmul_efficiency']:.2f}** of the {calib['preset']} "
                  f"dense peak ({calib['peak_tflops']:.0f} TFLOP/s, datasheet); the largest "
                  f"product reaches {calib['largest_gemm_efficiency']:.2f}. The cost model "
                  f"assumes MATMUL_EFFICIENCY = {calib['assumed_matmul_efficiency']}.",
                  "", f"Megatron-LM 2021's 145.6 B row ({p['layout']}) on servers of "
                  f"{p['cluster']}: {p['tflops_per_gpu_assumed']:.0f} TFLOP/s per GPU predicted with "
                  f"the assumption, {p['tflops_per_gpu_measured_efficiency']:.0f} with the "
                  f"measured efficiency. To predict with it: "
                  f"`lessonlib.costmodel.throughput.MATMUL_EFFICIENCY = "
                  f"{calib['measured_matmul_efficiency']:.2f}`."]
    else:
        lines.append(f"Median {calib['median_tflops']:.4g} TFLOP/s on {calib['device']}: no "
                     f"cost-model preset matches this device, so no efficiency is computed.")
    return "\n".join(lines) + "\n"


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="labs/gpu_check.py", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=None,
                   help="report folder (default results/gpu_check-<date>-<time>)")
    p.add_argument("--allow-cpu", action="store_true",
                   help="without a GPU, run the checks on 2 CPU ranks with tiny settings")
    p.add_argument("--quick", action="store_true", help="tiny settings and small products")
    p.add_argument("--max-world-size", type=int, default=None,
                   help="cap the ranks per lab (default: every visible GPU; 2 on CPU)")
    p.add_argument("--sizes", default=None,
                   help="matrix sizes, comma-separated (default 1024,2048,4096,8192 on a GPU)")
    p.add_argument("--labs", default=None, help="only these labs, comma-separated")
    p.add_argument("--point-timeout", type=float, default=900.0, help="seconds per lab")
    return p, p.parse_args(argv)


def main(argv=None) -> int:
    parser, opts = parse_args(argv)
    gpus = device.gpu_count()
    if gpus == 0 and not opts.allow_cpu:
        print("No GPU is visible here (torch sees 0 CUDA devices), so there is nothing to "
              "check. Run this on a GPU machine, or add --allow-cpu to try the checks on CPU "
              "ranks.", file=sys.stderr)
        return 1
    if opts.max_world_size is not None and opts.max_world_size < 1:
        parser.error(f"--max-world-size must be a positive integer; got {opts.max_world_size}")
    if opts.sizes:
        try:
            sizes = [int(s) for s in opts.sizes.split(",")]
            assert sizes and min(sizes) >= 1
        except (ValueError, AssertionError):
            parser.error(f"--sizes must be positive integers, e.g. 1024,4096; got {opts.sizes}")
    else:
        sizes = ([256, 512] if opts.quick else [1024, 2048, 4096, 8192]) if gpus else (
            [64, 128] if opts.quick else [128, 256, 512])
    n_ranks = opts.max_world_size or (gpus if gpus else 2)
    if gpus:
        n_ranks = min(n_ranks, gpus)
    jobs, skipped = plan(n_ranks, bool(gpus), opts.quick)
    if opts.labs:
        wanted = {x.strip() for x in opts.labs.split(",")}
        unknown = wanted - set(LABS) - set(sweep.available_labs())
        if unknown:
            parser.error(f"--labs: no lab called {', '.join(sorted(unknown))}; choose from "
                         f"{', '.join(sorted(set(LABS) | set(sweep.available_labs())))}")
        jobs = [j for j in jobs if j[0] in wanted]
        skipped = [s for s in skipped if s["lab"] in wanted]
    out = opts.out or Path("results", f"gpu_check-{time.strftime('%Y%m%d-%H%M%S')}")
    import torch

    name = device.describe(torch.device("cuda", 0) if gpus else torch.device("cpu"))
    machine = {"device": name, "gpus": gpus, "backend": "nccl" if gpus else "gloo",
               "settings": "tiny" if (opts.quick or not gpus) else "short",
               "torch": torch.__version__, "ranks": n_ranks}
    if not gpus:
        print("No GPU visible: running the checks on CPU ranks (gloo) with tiny settings.",
              file=sys.stderr)
    run_opts = argparse.Namespace(launcher="local", python=sys.executable, nproc_per_node=None,
                                  point_timeout=opts.point_timeout)
    os.environ[placement.AUDIT_ENV] = str((out / "audit").resolve())   # the labs inherit it
    rows = sweep.sweep(jobs, out, run_opts) if jobs else []
    os.environ.pop(placement.AUDIT_ENV)
    for row in rows:
        row["off_device"] = placement.findings(out / "audit", row["lab"]) if gpus else None
    rows += skipped
    print(f"timing {'bf16' if gpus else 'fp32'} matrix products {sizes} ...", file=sys.stderr)
    rates = gemm_rates(sizes, "bfloat16" if gpus else "float32", 0.5 if opts.quick else 2.0)
    calib = calibrate(rates, name)
    report = markdown(machine, rows, rates, calib)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text(report)
    (out / "report.json").write_text(json.dumps(
        {"machine": machine, "labs": rows, "gemm": rates, "calibration": calib},
        indent=1, default=str) + "\n")
    print(report)
    print(f"written: {out / 'report.md'} and {out / 'report.json'}", file=sys.stderr)
    return 0 if all(r["status"] in ("ok", "skipped") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
