"""What every lab script shares: its command line, one result shape, and honest timing.

What it teaches: a benchmark is a claim about a ratio, so every lab times lessonlib and
PyTorch's own implementation in the same run, reports medians, and writes one JSON shape:

    {"lab": "ddp", "world_size": 2, "backend": "gloo", "device": "cpu",
     "settings": {...}, "results": {"lessonlib": {"step_time_s": ...}, "torch": {...}}}

so sweeps and notebooks can read any lab's output.

Laptop:  ``python labs/ddp.py --world-size 2 --json results/ddp.json``
GPU box: ``torchrun --nproc-per-node 8 labs/ddp.py --json results/ddp.json``
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from lessonlib import device, launcher


def parser(lab: str, description: str) -> argparse.ArgumentParser:
    """The flags every lab takes; a lab adds its own on the returned parser."""
    p = argparse.ArgumentParser(prog=f"labs/{lab}.py", description=description)
    p.add_argument("--world-size", type=int, default=2,
                   help="ranks to spawn (ignored under torchrun, which sets it)")
    p.add_argument("--backend", default="auto", choices=list(device.BACKENDS))
    p.add_argument("--steps", type=int, default=10, help="timed steps per implementation")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before ranks are stopped")
    p.add_argument("--json", type=Path, default=None, help="write the result here")
    return p


def world_size(args) -> int:
    """The run's world size: torchrun's when under torchrun, else ``--world-size``."""
    return int(os.environ["WORLD_SIZE"]) if launcher.under_torchrun() else args.world_size


def check_positive(p: argparse.ArgumentParser, args, *names: str) -> None:
    """Reject non-positive integer settings before any process starts."""
    for name in names:
        value = getattr(args, name.replace("-", "_"))
        if value is None or value < 1:
            p.error(f"--{name} must be a positive integer; got {value}")


def time_steps(step, steps: int, warmup: int) -> list[float]:
    """Wall time of each of ``steps`` calls to ``step()`` after ``warmup`` untimed ones.

    Ranks line up at a barrier before each step, so one rank's slowness is not hidden."""
    times = []
    for i in range(warmup + steps):
        dist.barrier()
        start = device.timer()
        step()
        elapsed = device.timer() - start
        if i >= warmup:
            times.append(elapsed)
        launcher.progress(f"timed step {i + 1} of {warmup + steps}")
    return times


def median(values) -> float:
    return float(statistics.median(values))


def rank_info() -> dict:
    """Call on a rank: its backend and device, for the result record."""
    return {"backend": dist.get_backend(), "device": device.describe()}


def result(lab: str, world_size: int, settings: dict, results: dict, info: dict) -> dict:
    """The shared result shape (see the module docstring); ``info`` from ``rank_info()``."""
    return {"lab": lab, "world_size": world_size, "backend": info["backend"],
            "device": info["device"], "settings": settings, "results": results,
            "unix_time": time.time()}


def emit(record: dict, path: Path | None) -> None:
    """Print the result (rank 0 only under torchrun) and write it as JSON if asked.

    Under torchrun or srun this is the rank's last act: it flushes and leaves at once
    (``os._exit(0)``), as ``lessonlib.launch``'s ranks do. Python's teardown after
    ``destroy_process_group`` can abort a rank (``terminate called without an active
    exception``, exit 134) when the rank hosting the rendezvous store has already exited,
    which srun then reports as a failed job."""
    if launcher.is_main_process():
        text = json.dumps(record, indent=2, sort_keys=True)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text + "\n")
        print(text, file=sys.stdout)
    if launcher.under_torchrun():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def add_gpt_flags(p: argparse.ArgumentParser, hidden: int = 64, seq: int = 32) -> None:
    """The tiny GPT's shape and the batch split of the labs that train it (hybrid, train)."""
    p.add_argument("--layers", type=int, default=4, help="L, transformer layers")
    p.add_argument("--hidden", type=int, default=hidden, help="h")
    p.add_argument("--heads", type=int, default=4, help="a")
    p.add_argument("--seq", type=int, default=seq, help="s, tokens per sequence")
    p.add_argument("--global-batch", type=int, default=32, help="B, sequences per step")
    # Not "--m": torchrun reads that as an abbreviation of its own flags and refuses it.
    p.add_argument("--microbatches", type=int, default=4,
                   help="m, micro-batches per replica per step")


def gpt_model(p: argparse.ArgumentParser, args) -> dict:
    """``add_gpt_flags``' values checked, as ``GPTConfig`` keywords (the corpus has 27
    characters)."""
    check_positive(p, args, "layers", "hidden", "heads", "seq", "global-batch", "microbatches")
    if args.hidden % args.heads:
        p.error(f"--hidden {args.hidden} must be divisible by --heads {args.heads}")
    return {"vocab": 27, "seq": args.seq, "hidden": args.hidden, "heads": args.heads,
            "layers": args.layers}


def gemm_rates(sizes: list[int], dtype_name: str, min_seconds: float) -> list[dict]:
    """Median TFLOP/s of ``n x n @ n x n`` products on this process's device (GPU 0 or CPU)."""
    dev = torch.device("cuda", 0) if device.gpu_count() else torch.device("cpu")
    dtype = getattr(torch, dtype_name)
    rows = []
    for n in sizes:
        a = torch.randn(n, n, device=dev, dtype=dtype)
        b = torch.randn(n, n, device=dev, dtype=dtype)
        for _ in range(3):                              # warm-up: kernels chosen, clocks up
            a @ b
        start = device.timer(dev)
        a @ b
        once = max(device.timer(dev) - start, 1e-6)
        calls = max(1, int(0.02 / once))                # >= 20 ms per sample
        samples = []
        deadline = time.perf_counter() + min_seconds
        while len(samples) < 5 or (time.perf_counter() < deadline and len(samples) < 30):
            start = device.timer(dev)
            for _ in range(calls):
                a @ b
            samples.append((device.timer(dev) - start) / calls)
        seconds = statistics.median(samples)
        rows.append({"n": n, "dtype": dtype_name, "seconds": seconds, "samples": len(samples),
                     "tflops": 2 * n ** 3 / seconds / 1e12})
        del a, b
    return rows
