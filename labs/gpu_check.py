"""Check a GPU machine in minutes, most telling runs first: versions, NCCL, every lab, a resume.

What it teaches: before trusting a cluster's numbers, check that every piece runs on it and
how fast its matrix products really are. In this order, each point with its own short
timeout and the whole run inside ``--budget-s`` (a point that would not fit is skipped and
said so), writing ``report.json`` and ``report.md`` after every point, so a run cut short
still reports what it saw:

1. versions: Python, torch, CUDA, NCCL, each GPU;
2. a 1-rank launch on NCCL (gloo on a CPU) that all-reduces through ``lessonlib.comm``: the
   process group starts, and the ledger's CUDA-event timing reads back;
3. bf16 matrix products, against the GPU's dense peak from ``lessonlib.costmodel``: the best
   rate is the GPU's Maximum Achievable Matmul FLOPS that the cost model takes from a
   published sweep, now measured, and ``calibrate`` refits the model's GEMM curve with it;
   with two GPUs or more, NCCL's all-reduce over all of them at a few message sizes
   (``labs/allreduce.py --sweep``), to which ``calibrate`` fits the NVLink's alpha and beta;
   then the peak memory of the DDP lab's training step (``torch.cuda.max_memory_allocated``
   and ``max_memory_reserved``) beside the cost model's count (``peak_memory``; without a GPU
   it is predicted only, and the report says so);
4. each lab at 2-4 ranks that share ``cuda:0`` over gloo with CUDA tensors (the shared-GPU
   mode of ``lessonlib.device``; send and receive go through the CPU, ``lessonlib.gloo_cuda``),
   the hybrid lab also on two five-axis layouts, with tiny settings: every multi-rank code
   path runs on the GPU, and each point reports its parity with one process;
5. each lab once, at sizes that make a GPU work (bf16 where the lab takes it), on NCCL at the
   largest world size the visible GPUs allow (one GPU is fine: each lab says what it does
   with one rank); the GPT labs' MFU;
6. train a few steps with checkpoints, then run again: it must resume.

Every lab runs with ``lessonlib.instruments.placement``'s audit on: a lab whose ranks compute on anything
but their GPU says so in the table. ``--dry-run`` prints the plan (``gpu_check_plan``: each
point's ranks, backend, device, parity check, estimated time, and whether it needs a GPU)
and runs nothing, on any machine.

It runs from a plain checkout with nothing installed but torch (2.5 or newer), numpy,
matplotlib and cloudpickle, on Python 3.10 to 3.12: it puts the checkout on the path of
itself and of every lab it starts. With the default ``--budget-s 420`` it takes about 7
minutes at most on a GPU box; on a machine without a GPU it says so and stops, and
``--allow-cpu`` runs the same points on two CPU ranks (gloo) with tiny settings.

GPU box: python labs/gpu_check.py --budget-s 420 [--out results/gpu_check]
Laptop:  python labs/gpu_check.py --budget-s 420 --dry-run   (or --allow-cpu --quick)
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "labs")]          # nothing installed: the checkout
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))

import sweep  # noqa: E402  (labs/sweep.py: runs one lab and turns its record into a row)
from gpu_check_labs import GENERIC, LABS, Lab, lab_summary, parity_of  # noqa: E402, F401
from gpu_check_plan import listing, plan  # noqa: E402
from gpu_check_report import POINT_MIN_S, Report, markdown  # noqa: E402
from sweep_points import check_folder  # noqa: E402

from lessonlib import argcheck, device  # noqa: E402
from lessonlib.costmodel import layer_bytes  # noqa: E402
from lessonlib.costmodel.calibration import calibrate  # noqa: E402
from lessonlib.costmodel.memory import course_layer_activation_bytes  # noqa: E402
from lessonlib.instruments import placement
from lessonlib.lab.labkit import gemm_rates  # noqa: E402
from lessonlib.models import TEN_M, TINY, TinyGPT, count_parameters, lm_loss  # noqa: E402

GIB = 2**30
FLOAT = 4                                  # bytes per float32 element


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


# The memory point: the DDP lab's model (TEN_M on a GPU, TINY on CPU ranks) trains two float32
# AdamW steps on one device at the lab's batch and at eight times it; on a GPU the allocator's
# peaks are read after them (allocated: the tensors; reserved: what the caching allocator holds,
# fragmentation included, torchtitan's published "Memory(GiB)"), beside what the cost model
# counts at 4 bytes per element: 16 bytes per parameter (weights, gradients, Adam's moments),
# each layer's activations (``course_layer_activation_bytes``, exact on CPU ranks; a GPU's
# attention kernel keeps a little more), the output layer (final LayerNorm's input and
# statistics, the head's input, the loss's float32 peak) and the input batch.
def predicted_bytes(cfg, b: int, parameters: int) -> dict:
    """What the cost model counts for one float32 AdamW step of ``cfg`` at batch ``b``."""
    s, h, V = cfg.seq, cfg.hidden, cfg.vocab
    layers = cfg.layers * course_layer_activation_bytes(b, s, h, cfg.heads, element_size=FLOAT)
    output = b * s * FLOAT * (h + 2 + h) + layer_bytes.loss_bytes(s, b, V)   # LN, head, loss
    parts = {"state": 16 * parameters, "activations": layers, "output": output,
             "batch": 2 * 8 * b * s}                  # int64 inputs and targets
    return {**parts, "total": sum(parts.values())}


def step_peak(cfg, b: int, gpu) -> tuple[int, int]:
    """(peak allocated, peak reserved) bytes over two AdamW steps on ``gpu`` (a CUDA device)."""
    import torch
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(gpu)
    model = TinyGPT(cfg).to(gpu)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(cfg.vocab, (b, cfg.seq), device=gpu)
    for _ in range(2):                             # the second step holds Adam's moments
        lm_loss(model(x), x).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize(gpu)
    peaks = torch.cuda.max_memory_allocated(gpu), torch.cuda.max_memory_reserved(gpu)
    del model, opt, x
    return peaks


def peak_memory(gpu: bool, batch: int) -> dict:
    """The memory point's row: per batch, predicted GiB and, on a GPU, measured GiB."""
    cfg = TEN_M if gpu else TINY
    parameters = count_parameters(TinyGPT(cfg))
    rows = []
    for b in (batch, 8 * batch):
        row = {"batch": b, "predicted_gib": predicted_bytes(cfg, b, parameters)["total"] / GIB}
        if gpu:
            allocated, reserved = step_peak(cfg, b, _first_device(gpu))
            row.update(allocated_gib=allocated / GIB, reserved_gib=reserved / GIB,
                       allocated_over_predicted=allocated / GIB / row["predicted_gib"])
        rows.append(row)
    return {"memory": rows, "measured": gpu, "parameters": parameters,
            "model": "TEN_M" if gpu else "TINY"}


CURVE_SIZES_KB = (64, 1024, 16384, 262144)      # 64 kB to 256 MB: latency to bandwidth


def allreduce_curve(ranks: int, out: Path, timeout: float, backend: str = "nccl",
                    sizes_kb=CURVE_SIZES_KB) -> dict:
    """The backend's all-reduce over ``ranks`` (every visible GPU, on NCCL) at ``sizes_kb``:
    (ranks, bytes, seconds) points, timed by ``labs/allreduce.py --sweep`` in its own
    processes."""
    record = out / "allreduce_curve.json"
    subprocess.run([sys.executable, str(ROOT / "labs" / "allreduce.py"), "--sweep",
                    "--algorithms", "torch", "--backend", backend, "--world-sizes", str(ranks),
                    "--sizes-kb", ",".join(map(str, sizes_kb)), "--budget-s", "1",
                    "--json", str(record)], check=True, timeout=timeout, capture_output=True)
    points = json.loads(record.read_text())["results"]["torch"]["points"]
    return {"allreduce": [(q["world_size"], q["size_bytes"], q["time_s"]) for q in points]}


def _first_device(gpu: bool):
    import torch
    return torch.device("cuda", 0) if gpu else torch.device("cpu")


def lab_point(name: str, point: dict, out: Path, index: int, timeout: float, gpu: bool) -> dict:
    opts = argparse.Namespace(launcher="local", python=sys.executable, nproc_per_node=None,
                              point_timeout=timeout)
    os.environ[placement.AUDIT_ENV] = str((out / "audit" / f"{index:04d}").resolve())
    try:
        row = sweep.run_point(index, name, point, out, opts)
    finally:
        os.environ.pop(placement.AUDIT_ENV)
    row["off_device"] = placement.findings(out / "audit" / f"{index:04d}", name) if gpu else None
    row["parity"] = parity_of(row)
    return row


def planned_point(p, out: Path, index: int, timeout: float, gpu: bool) -> dict:
    """One point of the plan; the shared-GPU ones with ``device.SHARED_GPU_ENV`` set."""
    if p.mode == "shared":
        os.environ[device.SHARED_GPU_ENV] = "1"
    try:
        if p.name == "train+resume":
            return resume_point(p.job(), out, index, timeout, gpu)
        return lab_point(p.lab, p.job(), out, index, timeout, gpu)
    finally:
        os.environ.pop(device.SHARED_GPU_ENV, None)


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


def parse_args(argv=None):
    p = argcheck.LabParser(prog="labs/gpu_check.py", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=None,
                   help="report folder (default results/gpu_check-<date>-<time>)")
    p.add_argument("--budget-s", type=float, default=420.0,
                   help="seconds for the whole check; points that would not fit are skipped")
    p.add_argument("--allow-cpu", action="store_true",
                   help="without a GPU, run the multi-rank points on CPU ranks, tiny settings")
    p.add_argument("--dry-run", action="store_true",
                   help="print the plan (every point, its parity check, estimated time and "
                        "whether it needs a GPU) and run nothing")
    p.add_argument("--quick", action="store_true", help="tiny settings and small products")
    p.add_argument("--max-world-size", type=int, default=None,
                   help="cap the ranks per point (default: every visible GPU on NCCL, "
                        "2-4 on the shared GPU)")
    p.add_argument("--sizes", default=None,
                   help="matrix sizes, comma-separated (default 1024,4096,8192 on a GPU)")
    p.add_argument("--labs", default=None, help="only these labs, comma-separated "
                   "(none: only versions, the launch and the products)")
    return p, p.parse_args(argv)


def main(argv=None) -> int:
    parser, opts = parse_args(argv)
    gpus = device.gpu_count()
    if gpus == 0 and not (opts.allow_cpu or opts.dry_run):
        print("No GPU is visible here (torch sees 0 CUDA devices), so there is nothing to "
              "check. Run this on a GPU machine, add --allow-cpu to try the checks on CPU "
              "ranks, or --dry-run to see the plan.", file=sys.stderr)
        return 1
    for flag, value in (("--max-world-size", opts.max_world_size), ("--budget-s", opts.budget_s)):
        if value is not None and not value > 0:
            parser.error(f"{flag} must be positive; got {value}")
    first = sum(POINT_MIN_S[kind] for kind in ("versions", "launch", "gemm"))
    if opts.budget_s < first:
        parser.error(f"--budget-s {opts.budget_s:g} is shorter than the {first} s the first "
                     f"checks (versions, a launch, the GEMMs) need at least; use --budget-s "
                     f"{first} or more (the default 420 s runs every lab point)")
    out = opts.out or Path("results", f"gpu_check-{time.strftime('%Y%m%d-%H%M%S')}")
    if not opts.dry_run:
        check_folder(parser, out)          # a file, the kernel's, not writable: one line
    try:
        sizes = [int(s) for s in opts.sizes.split(",")] if opts.sizes else (
            ([256, 512] if opts.quick else [1024, 4096, 8192]) if gpus else
            ([64, 128] if opts.quick else [128, 256, 512]))
        assert sizes and min(sizes) >= 1
    except (ValueError, AssertionError):
        parser.error(f"--sizes must be positive integers, e.g. 1024,4096; got {opts.sizes}")
    planned = gpus or (1 if opts.dry_run else 0)       # a dry run without a GPU: one GPU's plan
    points = plan(sweep.available_labs(), min(opts.max_world_size or planned, planned),
                  opts.quick or not gpus and not opts.dry_run)
    points = [p for p in points if not (opts.max_world_size and p.ranks
                                        and p.ranks > opts.max_world_size)]
    if opts.labs is not None:
        wanted = {x.strip() for x in opts.labs.split(",") if x.strip()}
        unknown = wanted - set(LABS) - set(sweep.available_labs())
        if unknown:
            parser.error(f"--labs: no lab called {', '.join(sorted(unknown))}; choose from "
                         f"{', '.join(sorted(set(LABS) | set(sweep.available_labs())))}")
        points = [p for p in points if p.lab in wanted]
    if opts.dry_run:
        print(f"# GPU check plan ({gpus or 'no'} GPU visible"
              f"{'' if gpus else '; listed as on a one-GPU machine'})\n")
        print(listing(points, opts.budget_s, planned))
        return 0
    gpu, backend = bool(gpus), "nccl" if gpus else "gloo"
    machine = {"device": device.describe(_first_device(gpu)), "gpus": gpus, "backend": backend,
               "settings": "tiny" if (opts.quick or not gpus) else "short",
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
    ddp = LABS["ddp"].tiny if opts.quick or not gpus else LABS["ddp"].short
    report.run("memory", "memory", lambda t: peak_memory(gpu, int(ddp["batch"])))
    if gpus >= 2:                    # one GPU has no link to time
        curve = report.run("allreduce curve", "curve",
                           lambda t: allreduce_curve(gpus, out, t), {"world_size": gpus})
        if curve["status"] == "ok" and row["status"] == "ok":
            report.extra["calibration"] = calibrate(row["gemm"], machine["device"],
                                                    curve["allreduce"])
    for index, p in enumerate(points):
        meta = {"mode": p.mode, "world_size": p.ranks, "parity_check": p.parity}
        if p.ranks is None:
            report.rows.append({"lab": p.lab, "point": p.name, "status": "skipped",
                                "error": p.note, **meta})
            continue
        row = report.run(p.name, "resume" if p.name == "train+resume" else "lab",
                         lambda t, p=p, i=index: planned_point(p, out, 2 * i, t, gpu), meta)
        row["mfu"] = mfu(row, report.extra.get("calibration", {}).get("peak_tflops"))
    report.write()
    print(markdown(machine, report.rows, report.extra))
    print(f"written: {out / 'report.md'} and {out / 'report.json'}", file=sys.stderr)
    return 0 if all(r["status"] in ("ok", "skipped") for r in report.rows) else 1


if __name__ == "__main__":
    sys.exit(main())
