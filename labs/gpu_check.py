"""Check a GPU machine in minutes, most telling runs first: versions, NCCL, every lab, a resume.

What it teaches: before trusting a cluster's numbers, check that every piece runs on it and
how fast its matrix products really are. In this order, each point with its own short
timeout and the whole run inside ``--budget-s`` (a point that would not fit is skipped and
said so), writing ``report.json`` and ``report.md`` after every point, so a run cut short
still reports what it saw:

1. versions: Python, torch, CUDA, NCCL, each GPU;
2. a 1-rank launch on NCCL (gloo on a CPU) that all-reduces through ``lessonlib.comm``: the
   process group starts, and the ledger's CUDA-event timing reads back;
3. bf16 matrix products, against the GPU's dense peak from ``lessonlib.costmodel``: the
   ratio is what the cost model's ``MATMUL_EFFICIENCY`` assumes (0.6), now measured;
4. each lab in ``labs/`` once, at sizes that make a GPU work (bf16 where the lab takes it),
   on NCCL at the largest world size the visible GPUs allow (one GPU is fine: each lab says
   what it does with one rank), with ``lessonlib.placement``'s audit on: a lab whose ranks
   compute on anything but their own GPU says so in the table; the GPT labs' MFU;
5. train a few steps with checkpoints, then run again: it must resume.

It runs from a plain checkout with nothing installed but torch (2.5 or newer), numpy,
matplotlib and cloudpickle, on Python 3.10 to 3.12: it puts the checkout on the path of
itself and of every lab it starts. With the default ``--budget-s 420`` it takes about 7
minutes at most on a GPU box; on a machine without a GPU it says so and stops, and
``--allow-cpu`` runs the same points on two CPU ranks (gloo) with tiny settings.

GPU box: python labs/gpu_check.py --budget-s 420 [--out results/gpu_check]
Laptop:  python labs/gpu_check.py --allow-cpu --quick
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "labs")]          # nothing installed: the checkout
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))

import sweep  # noqa: E402  (labs/sweep.py: runs one lab and turns its record into a row)
from gpu_check_labs import GENERIC, LABS, Lab, lab_summary, plan, show  # noqa: E402, F401

from lessonlib import argcheck, device, placement  # noqa: E402
from lessonlib.costmodel import throughput  # noqa: E402, F401 (its MATMUL_EFFICIENCY)
from lessonlib.costmodel.calibration import calibrate  # noqa: E402
from lessonlib.labkit import gemm_rates  # noqa: E402

POINT_CAP_S = {"versions": 30, "launch": 90, "gemm": 60, "lab": 120, "resume": 150}
POINT_MIN_S = {"versions": 1, "launch": 10, "gemm": 10, "lab": 20, "resume": 40}  # else skip


# ---------------------------------------------------------------- the points
def versions() -> dict:
    import numpy
    import torch

    gpus = device.gpu_count()
    nccl = torch.cuda.nccl.version() if gpus and hasattr(torch.cuda, "nccl") else None
    return {"python": platform.python_version(), "torch": torch.__version__,
            "numpy": numpy.__version__, "cuda": torch.version.cuda,
            "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl,
            "gpus": [device.describe(torch.device("cuda", i)) for i in range(gpus)]}


def one_rank_launch(backend: str, timeout: float) -> dict:
    import lessonlib
    from lessonlib import comm

    [r] = lessonlib.launch(comm.demo_ledger, 1, backend=backend, timeout=timeout)
    return {"backend": backend, "sum": r["sum"], "all_reduce_s": r["all_reduce"]["seconds"],
            "timed_by": "CUDA events" if backend == "nccl" else "wall clock"}


def gemm(gpu: bool, quick: bool, sizes) -> dict:
    name = device.describe(_first_device(gpu))
    rates = gemm_rates(sizes, "bfloat16" if gpu else "float32", 0.3 if quick else 1.0)
    return {"gemm": rates, "calibration": calibrate(rates, name)}


def _first_device(gpu: bool):
    import torch
    return torch.device("cuda", 0) if gpu else torch.device("cpu")


def lab_point(name: str, point: dict, out: Path, index: int, timeout: float, gpu: bool) -> dict:
    opts = argparse.Namespace(launcher="local", python=sys.executable, nproc_per_node=None,
                              point_timeout=timeout)
    row = sweep.run_point(index, name, point, out, opts)
    row["off_device"] = placement.findings(out / "audit", name) if gpu else None
    return row


def resume_point(point: dict, out: Path, index: int, timeout: float, gpu: bool) -> dict:
    """The train lab twice on one checkpoint folder: fresh, then two checkpoints further."""
    point = {**point, "checkpoint-dir": str(out / "checkpoints")}
    first = lab_point("train", point, out, index, timeout / 2, gpu)
    if first["status"] != "ok":
        return first
    again = {k: v for k, v in point.items() if k != "fresh"}
    again["steps"] = str(int(point["steps"]) + 2 * int(point["checkpoint-every"]))
    second = lab_point("train", again, out, index + 1, timeout / 2, gpu)
    second["seconds"] = first["seconds"] + second.get("seconds", 0)
    if second["status"] == "ok" and not second.get("results.lessonlib.resumed_from_step"):
        second.update(status="failed", error="the second run did not resume from a checkpoint")
    return second


def mfu(row: dict, peak_tflops: float | None) -> float | None:
    """Model FLOPs utilisation of a GPT lab's lessonlib run: 6 N FLOPs per token (forward and
    backward, Kaplan et al. 2020) at its tokens per second, over the ranks' dense peak."""
    n, world = row.get("settings.parameters"), int(row.get("world_size") or 1)
    tokens = row.get("results.lessonlib.tokens_per_s")
    if tokens is None and row.get("results.lessonlib.step_time_s") and row.get("settings.batch_per_rank"):
        tokens = (row["settings.batch_per_rank"] * row["settings.config.seq"] * world
                  / row["results.lessonlib.step_time_s"])
    if not (n and tokens and peak_tflops):
        return None
    return 6 * n * tokens / (world * peak_tflops * 1e12)


# ---------------------------------------------------------------- the run
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

    def run(self, name: str, kind: str, fn) -> dict:
        timeout = min(POINT_CAP_S[kind], self.left())
        if timeout < POINT_MIN_S[kind]:          # too little left to be worth starting
            row = {"lab": name, "point": name, "status": "skipped",
                   "error": f"{max(self.left(), 0):.0f} s of --budget-s left, under the "
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
             f"{machine['gpus']} GPU(s) visible; labs on {machine['backend']} ranks, "
             f"{machine['settings']} settings, a budget of {machine['budget_s']:.0f} s.", "",
             "| point | ranks | status | seconds | result |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.get('point', r['lab'])} | {show(r.get('world_size'))} | {r['status']} | "
                     f"{show(r.get('seconds'))} | {point_summary(r)} |")
    calib = extra.get("calibration")
    if calib and calib.get("preset"):
        lines += ["", f"Matrix products: median {calib['median_tflops']:.4g} TFLOP/s = "
                  f"**{calib['measured_matmul_efficiency']:.2f}** of the {calib['preset']} dense "
                  f"peak ({calib['peak_tflops']:.0f} TFLOP/s); the cost model assumes "
                  f"MATMUL_EFFICIENCY = {calib['assumed_matmul_efficiency']}."]
        if "prediction_145.6B" in calib:
            p = calib["prediction_145.6B"]
            lines.append(f"Megatron-LM 2021's 145.6 B row ({p['layout']}, {p['cluster']}): "
                         f"{p['tflops_per_gpu_assumed']:.0f} TFLOP/s per GPU predicted with the "
                         f"assumption, {p['tflops_per_gpu_measured_efficiency']:.0f} with the "
                         f"measured efficiency.")
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
    if row["lab"] == "gemm" and row["status"] == "ok":
        return ", ".join(f"n={g['n']}: {g['tflops']:.3g} TFLOP/s" for g in row["gemm"])
    if row.get("mfu") is not None:
        return f"{lab_summary(row)}; MFU {row['mfu']:.2f}"
    if row.get("point") == "train+resume" and row["status"] == "ok":
        return (f"{lab_summary(row)}; resumed from step "
                f"{row['results.lessonlib.resumed_from_step']}")
    return lab_summary(row)


def parse_args(argv=None):
    p = argcheck.LabParser(prog="labs/gpu_check.py", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=None,
                   help="report folder (default results/gpu_check-<date>-<time>)")
    p.add_argument("--budget-s", type=float, default=420.0,
                   help="seconds for the whole check; points that would not fit are skipped")
    p.add_argument("--allow-cpu", action="store_true",
                   help="without a GPU, run the checks on 2 CPU ranks with tiny settings")
    p.add_argument("--quick", action="store_true", help="tiny settings and small products")
    p.add_argument("--max-world-size", type=int, default=None,
                   help="cap the ranks per lab (default: every visible GPU; 2 on CPU)")
    p.add_argument("--sizes", default=None,
                   help="matrix sizes, comma-separated (default 1024,4096,8192 on a GPU)")
    p.add_argument("--labs", default=None, help="only these labs, comma-separated "
                   "(none: only versions, the launch and the products)")
    return p, p.parse_args(argv)


def main(argv=None) -> int:
    parser, opts = parse_args(argv)
    gpus = device.gpu_count()
    if gpus == 0 and not opts.allow_cpu:
        print("No GPU is visible here (torch sees 0 CUDA devices), so there is nothing to "
              "check. Run this on a GPU machine, or add --allow-cpu to try the checks on CPU "
              "ranks.", file=sys.stderr)
        return 1
    for flag, value in (("--max-world-size", opts.max_world_size), ("--budget-s", opts.budget_s)):
        if value is not None and not value > 0:
            parser.error(f"{flag} must be positive; got {value}")
    try:
        sizes = [int(s) for s in opts.sizes.split(",")] if opts.sizes else (
            ([256, 512] if opts.quick else [1024, 4096, 8192]) if gpus else
            ([64, 128] if opts.quick else [128, 256, 512]))
        assert sizes and min(sizes) >= 1
    except (ValueError, AssertionError):
        parser.error(f"--sizes must be positive integers, e.g. 1024,4096; got {opts.sizes}")
    n_ranks = min(opts.max_world_size or gpus or 2, gpus or 2)
    jobs, skipped = plan(n_ranks, bool(gpus), opts.quick)
    if opts.labs is not None:
        wanted = {x.strip() for x in opts.labs.split(",") if x.strip()}
        unknown = wanted - set(LABS) - set(sweep.available_labs())
        if unknown:
            parser.error(f"--labs: no lab called {', '.join(sorted(unknown))}; choose from "
                         f"{', '.join(sorted(set(LABS) | set(sweep.available_labs())))}")
        jobs = [j for j in jobs if j[0] in wanted]
        skipped = [s for s in skipped if s["lab"] in wanted]
    out = opts.out or Path("results", f"gpu_check-{time.strftime('%Y%m%d-%H%M%S')}")
    gpu, backend = bool(gpus), "nccl" if gpus else "gloo"
    machine = {"device": device.describe(_first_device(gpu)), "gpus": gpus, "backend": backend,
               "settings": "tiny" if (opts.quick or not gpus) else "short", "ranks": n_ranks,
               "budget_s": opts.budget_s}
    if not gpus:
        print("No GPU visible: running the checks on CPU ranks (gloo) with tiny settings.",
              file=sys.stderr)
    report = Report(out, machine, opts.budget_s)
    report.run("versions", "versions", lambda t: versions())
    report.run("launch", "launch", lambda t: one_rank_launch(backend, t))
    row = report.run("gemm", "gemm", lambda t: gemm(gpu, opts.quick, sizes))
    if row["status"] == "ok":
        report.extra["calibration"] = row["calibration"]
    os.environ[placement.AUDIT_ENV] = str((out / "audit").resolve())   # the labs inherit it
    for index, (name, [point]) in enumerate(jobs):
        if name == "train":
            report.run("train+resume", "resume",
                       lambda t, p=point, i=index: resume_point(p, out, 2 * i, t, gpu))
        else:
            row = report.run(name, "lab",
                             lambda t, n=name, p=point, i=index: lab_point(n, p, out, 2 * i, t, gpu))
            row["mfu"] = mfu(row, report.extra.get("calibration", {}).get("peak_tflops"))
            report.write()
    os.environ.pop(placement.AUDIT_ENV)
    report.rows += skipped
    report.write()
    print(markdown(machine, report.rows, report.extra))
    print(f"written: {out / 'report.md'} and {out / 'report.json'}", file=sys.stderr)
    return 0 if all(r["status"] in ("ok", "skipped") for r in report.rows) else 1


if __name__ == "__main__":
    sys.exit(main())
