"""What every lab script shares: its command line, one result shape, and honest timing.

What it teaches: a benchmark is a claim about a ratio, so every lab times lessonlib and
PyTorch's own implementation in the same run, reports medians, and writes one JSON shape:

    {"lab": "ddp", "world_size": 2, "backend": "gloo", "device": "cpu",
     "settings": {..., "dtype": "fp32"}, "results": {"lessonlib": {"step_time_s": ...}, ...},
     "rows": [{"implementation": "lessonlib", "world_size": 2, "step_time_s": ...}, ...],
     "headline": {"metric": "step_time_s", "predicted": None, "x": "world_size", ...},
     "machine": {"device": "cpu", "cpus": 2, "platform": ..., "torch": ...}}

``results`` keeps each lab's own nested detail; ``rows`` is the same run as a table with
stable columns: one row per implementation (and schedule, layer or layout where a lab
compares several), the settings that vary inside the run as columns of their own, and
every row of a lab carrying the same metric names, so a sweep's rows line up.
``headline`` names the metric a plot of a sweep draws, and the cost model's prediction of it
when the lab has one.

Every lab's ``main`` reads as the same five steps, one line each::

    args = labkit.parse(p, argv)                  # flags, world size, --json: labargs
    settings = check_settings(p, args) | {"dtype": args.dtype}   # before any process
    ranks = labkit.on_ranks(worker, args, settings)     # or the lab's own launches
    record = build_record(ranks, settings, args.world_size)      # rows stay rows
    return labkit.emit(record, args.json)

Laptop:  ``python labs/ddp.py --world-size 2 --json results/ddp.json``
GPU box: ``torchrun --nproc-per-node 8 labs/ddp.py --json results/ddp.json``
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from lessonlib import comm, device, launcher
from lessonlib.instruments import placement
# A lab's flags and their checks live in labargs: a lab imports them from there.
from lessonlib.lab.labargs import DTYPES, check_common, world_size


def parse(p: argparse.ArgumentParser, argv=None, fp32_only: str | None = None):
    """The lab's flags, with the world size settled and the shared ones checked (``--json``,
    ``--timeout``, ``--dtype``; ``fp32_only`` says why a lab refuses ``--dtype bf16``): a bad
    one stops the lab here with ``p.error``, before any process starts."""
    args = p.parse_args(argv)
    args.world_size = world_size(p, args)
    check_common(p, args, fp32_only)
    return args


def on_ranks(worker, args, settings: dict) -> list:
    """``worker(settings)`` on every rank, in ``--dtype``: what each rank returned."""
    return launcher.run(in_dtype(worker, args.dtype), args.world_size, settings,
                        backend=args.backend, timeout=args.timeout)


def _autocast_worker(worker, dtype: str, *args, **kwargs):
    """Run ``worker`` on this rank under bf16 autocast (weights stay fp32), or as it is."""
    with torch.autocast(device.current_device().type, dtype=DTYPES[dtype],
                        enabled=dtype != "fp32"):
        return worker(*args, **kwargs)


def in_dtype(worker, dtype: str):
    """``worker`` wrapped to run in ``--dtype``; a picklable callable for ``launcher.run``."""
    return functools.partial(_autocast_worker, worker, dtype)


def time_steps(step, steps: int, warmup: int) -> list[float]:
    """Wall time of each of ``steps`` calls to ``step()`` after ``warmup`` untimed ones.

    Ranks line up at a barrier before each step, so one rank's slowness is not hidden.
    Under the GPU audit (``placement``) the untimed steps are the audited pass (at least
    one) and the timed ones run with the audit paused, so no step time pays for it."""
    times = []
    warmup = max(warmup, 1) if placement.auditing() else warmup
    for i in range(warmup + steps):
        comm.barrier()
        with placement.paused() if i >= warmup else contextlib.nullcontext():
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


def machine(info: dict) -> dict:
    """The machine a run came from, for a record and a plot's title."""
    return {"device": info["device"], "cpus": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "torch": torch.__version__}


def result(lab: str, world_size: int, settings: dict, results: dict, info: dict,
           rows: list[dict] | None = None, headline: dict | None = None) -> dict:
    """The shared result shape (see the module docstring); ``info`` from ``rank_info()``."""
    record = {"lab": lab, "world_size": world_size, "backend": info["backend"],
              "device": info["device"], "settings": settings, "results": results,
              "unix_time": time.time(), "machine": machine(info)}
    if rows is not None:
        record["rows"], record["headline"] = rows, headline
    return record


def headline(metric: str, x: str, series: list[str], predicted: str | None = None) -> dict:
    """What a sweep's plot draws: ``metric`` (and ``predicted``, the cost model's value of it)
    against the swept setting, or against ``x`` when nothing is swept; one line per
    combination of the ``series`` columns."""
    return {"metric": metric, "predicted": predicted, "x": x, "series": series}


def stable_rows(rows: list[dict]) -> list[dict]:
    """Every row with every column any row has (None where it has no value), in one order."""
    names = list(dict.fromkeys(k for r in rows for k in r))
    return [{k: r.get(k) for k in names} for r in rows]


def emit(record: dict, path: Path | None) -> dict:
    """Print the result (rank 0 only under torchrun), write it as JSON if asked, return it.

    Under torchrun or srun this is the rank's last act: it flushes and leaves at once
    (``os._exit(0)``), as ``lessonlib.launch``'s ranks do. Python's teardown after
    ``destroy_process_group`` can abort a rank (``terminate called without an active
    exception``, exit 134) when the rank hosting the rendezvous store has already exited,
    which srun then reports as a failed job."""
    status = 0
    if launcher.is_main_process():
        text = json.dumps(record, indent=2, sort_keys=True)
        print(text, file=sys.stdout, flush=True)      # first: a failed write loses nothing
        if path is not None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text + "\n")
            except OSError as exc:
                print(f"labs/{record['lab']}.py: could not write the result to --json {path} "
                      f"({exc.strerror or exc}); it is printed in full above",
                      file=sys.stderr, flush=True)
                status = 1
    if launcher.under_torchrun():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    if status:
        sys.exit(status)
    return record


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
