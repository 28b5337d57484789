"""Measuring data parallelism honestly, and the alpha-beta model fitted to the measurements.

What it teaches: a benchmark is a claim about a ratio. ``allreduce_bench`` and ``ddp_bench``
run on every rank: all ranks start each timed call at a barrier, the implementations take
turns (so background noise hits them alike), and the ledger counts the bytes. Back in the
caller, ``slowest_rank_median`` takes each call's slowest rank (a collective is done when
its last rank is) and the median over calls.

The model: a message of S bytes costs alpha + S/B. ``allreduce_terms`` says how many
latencies and how many bytes each algorithm pays (from ``lessonlib.costmodel``), either on
its busiest link (a cluster, where every GPU has its own links) or in total (CPU ranks on
one machine, sharing it), ``fit_alpha_beta`` fits alpha and B to measured times, and
``bucketed_step`` predicts when the buckets of a DDP step finish if each starts when its
gradients are ready and the link is free.

Laptop:  ``python labs/allreduce.py --world-size 4 --size-mb 16`` and ``python labs/ddp.py``
GPU box: ``torchrun --nproc-per-node 8 labs/allreduce.py`` (the same functions, on NCCL)
"""
from __future__ import annotations

import itertools
import math
import statistics
import time

import numpy as np
import torch
import torch.distributed as dist

from lessonlib import comm, device, labkit, progress
from lessonlib.collectives import ALGORITHMS, torch_all_reduce
from lessonlib.costmodel.comm import parameter_server_time_s, ring_allreduce_time_s
from lessonlib.data import corpus_tokens, lm_batch, shard
from lessonlib.dp_runs import TEN_M, check_rungs, wrap
from lessonlib.models import GPTConfig, TinyGPT, lm_loss

ALL_ALGORITHMS = (*ALGORITHMS, "torch")


# ---------------------------------------------------------------- the alpha-beta model
LINKS = ("dedicated", "shared")


def allreduce_terms(algorithm: str, n: int, size_bytes: float,
                    links: str = "dedicated") -> tuple[float, float]:
    """(latencies paid, bytes that set the pace) of one all-reduce of S bytes.

    ``links="dedicated"``: every rank has its own link (GPUs on NVLink or InfiniBand), so the
    pace is set by the busiest link: ring and torch (gloo's and NCCL's rings) 2(n-1)/n x S,
    parameter server 2(n-1) x S, naive ring (n-1) x S. ``links="shared"``: all ranks share
    one medium (CPU ranks on one machine share its cores and memory bus), so the pace is set
    by the bytes *all* ranks move: 2(n-1) x S for the ring and the server alike, n(n-1) x S
    for the naive ring."""
    if links not in LINKS:
        raise ValueError(f"links={links!r} must be one of {LINKS}")
    if algorithm in ("ring", "torch"):
        latencies = ring_allreduce_time_s(n, 0, 1, 1)
        per_rank = ring_allreduce_time_s(n, size_bytes, 1)
        return latencies, per_rank * (n if links == "shared" else 1)
    if algorithm == "parameter_server":
        return parameter_server_time_s(n, 0, 1, 1), parameter_server_time_s(n, size_bytes, 1)
    if algorithm == "naive_ring":
        return float(n - 1), float((n - 1) * size_bytes) * (n if links == "shared" else 1)
    raise ValueError(f"algorithm={algorithm!r} must be one of {ALL_ALGORITHMS}")


def predict_s(algorithm: str, n: int, size_bytes: float, alpha_s: float, bandwidth: float,
              links: str = "dedicated") -> float:
    """alpha-beta time of one all-reduce; ``bandwidth`` in bytes per second."""
    latencies, nbytes = allreduce_terms(algorithm, n, size_bytes, links)
    return latencies * alpha_s + nbytes / bandwidth


def predict_from_fit(algorithm: str, n: int, size_bytes: float, fit: dict) -> float:
    """``predict_s`` with the alpha, B and link model of a ``fit_alpha_beta`` result."""
    return predict_s(algorithm, n, size_bytes, fit["alpha_s"], fit["bandwidth_Bps"],
                     fit.get("links", "dedicated"))


def fit_alpha_beta(points, algorithm: str, links: str = "dedicated") -> dict:
    """Least-squares alpha (s) and B (bytes/s) from ``points`` = [(n, size_bytes, time_s)],
    on relative error so that 1 KB and 64 MB messages count alike."""
    rows, used = [], []
    for n, size, t in points:
        latencies, nbytes = allreduce_terms(algorithm, n, size, links)
        if t > 0 and (latencies or nbytes):
            rows.append([latencies / t, nbytes / t])
            used.append((n, size, t))
    if len(rows) < 2:
        raise ValueError(f"fitting alpha and B needs at least 2 measured points with n > 1; "
                         f"got {len(rows)}")
    a = np.array(rows)
    alpha, inv_bw = np.linalg.lstsq(a, np.ones(len(rows)), rcond=None)[0]
    if alpha < 0:                                   # latency below resolution: bandwidth only
        alpha, inv_bw = 0.0, float(np.linalg.lstsq(a[:, 1:], np.ones(len(rows)), rcond=None)[0][0])
    inv_bw = max(inv_bw, 1e-15)
    errors = [predict_s(algorithm, n, s, alpha, 1 / inv_bw, links) / t - 1 for n, s, t in used]
    return {"alpha_s": float(alpha), "bandwidth_Bps": float(1 / inv_bw), "links": links,
            "rms_relative_error": float(math.sqrt(sum(e * e for e in errors) / len(errors))),
            "points": len(used)}


def bucketed_step(grad_bytes: float, n: int, bucket_bytes: float, backward_s: float,
                  fit: dict, overlap: bool = True) -> dict:
    """Predicted end of a DDP step's communication, measured from the start of backward.

    Gradients become ready at a steady rate during ``backward_s``; bucket j's ring
    all-reduce starts when its last gradient is ready (or, without overlap, when backward
    ends) and the previous bucket is done; each takes the ring time ``fit`` predicts (a
    ``fit_alpha_beta`` result). Returns the buckets' (ready, start, end) and the
    communication left exposed after backward."""
    if bucket_bytes <= 0 or grad_bytes < 0:
        raise ValueError(f"bucket_bytes={bucket_bytes} must be > 0 and grad_bytes={grad_bytes} "
                         f">= 0")
    k = max(1, math.ceil(grad_bytes / bucket_bytes))
    sizes = [min(bucket_bytes, grad_bytes - j * bucket_bytes) for j in range(k)]
    buckets, done, filled = [], 0.0, 0.0
    for size in sizes:
        filled += size
        ready = backward_s * filled / grad_bytes if grad_bytes else backward_s
        start = max(ready if overlap else backward_s, done)
        done = start + (predict_from_fit("ring", n, size, fit) if n > 1 else 0.0)
        buckets.append((ready, start, done))
    return {"buckets": buckets, "end_s": max(done, backward_s),
            "exposed_s": max(0.0, done - backward_s)}


def slowest_rank_median(per_rank_times) -> float:
    """Median over calls of the slowest rank's time for that call."""
    return float(statistics.median(max(call) for call in zip(*per_rank_times)))


# ---------------------------------------------------------------- on the ranks
def allreduce_bench(sizes_bytes, algorithms=ALL_ALGORITHMS, budget_s: float = 2.0,
                    min_iters: int = 3, max_iters: int = 20) -> dict:
    """For each size: run every algorithm once against ``dist.all_reduce`` (ledger on),
    then time them in turns; the number of turns fits ``budget_s`` (at least ``min_iters``)."""
    everything = {**ALGORITHMS, "torch": torch_all_reduce}
    bad = [a for a in algorithms if a not in everything]
    if bad:
        raise ValueError(f"algorithms={list(algorithms)}: unknown {bad}; use {list(everything)}")
    rank, dev = dist.get_rank(), device.current_device()
    out = {}
    for size in sizes_bytes:
        numel = int(size) // 4                                          # float32
        data = torch.randn(numel, generator=torch.Generator().manual_seed(rank)).to(dev)
        expected = data.clone()
        comm.all_reduce(expected)
        x = torch.empty_like(data)
        row, start = {}, time.perf_counter()
        for name in algorithms:
            x.copy_(data)
            with comm.ledger() as book:
                everything[name](x)
            error = (x - expected).abs().max().item() if numel else 0.0
            row[name] = {"times": [], "max_error": error, "bytes_sent": book.total_bytes("send"),
                         "bytes_received": book.total_bytes("recv")}
        once = torch.tensor([time.perf_counter() - start], device=dev)
        comm.all_reduce(once, op=dist.ReduceOp.MAX)       # every rank must pick the same count
        iters = int(min(max_iters, max(min_iters, budget_s // max(once.item(), 1e-9))))
        for i in range(iters):
            for name in algorithms:
                x.copy_(data)
                comm.barrier()
                t0 = device.timer()
                everything[name](x, check=False)          # shapes were checked above
                row[name]["times"].append(device.timer() - t0)
            progress(f"{size} bytes, turn {i + 1} of {iters}")
        out[int(size)] = row
    return {"rank": rank, "sizes": out, "info": labkit.rank_info()}


def ddp_bench(rungs=("bucketed", "naive", "torch"), cfg: GPTConfig = TEN_M, batch: int = 4,
              steps: int = 10, warmup: int = 2, rounds: int = 2,
              bucket_cap_mb: float = 25.0) -> dict:
    """Per rung: this rank's step times and the messages one step sends (from the ledger;
    PyTorch's DDP talks to the process group from C++, so the ledger cannot see it).

    After ``warmup`` untimed steps each, the rungs take turns step by step, ``steps`` x
    ``rounds`` times, so a burst of background load slows them all alike."""
    rank = dist.get_rank()
    tokens, _ = corpus_tokens()
    out, steppers = {}, {}
    for rung in check_rungs(rungs):
        model = TinyGPT(cfg, 0).to(device.current_device())
        ddp, after_backward = wrap(rung, model, bucket_cap_mb=bucket_cap_mb)
        out[rung] = {"times": [], "ledger": {}}
        steppers[rung] = _stepper(ddp, after_backward, out[rung], tokens, cfg, batch)
    for step in steppers.values():
        labkit.time_steps(step, 0, warmup)
    for _ in range(steps * rounds):
        for rung, step in steppers.items():
            out[rung]["times"] += labkit.time_steps(step, 1, 0)
    params = list(model.parameters())
    return {"rank": rank, "runs": out, "parameters": sum(p.numel() for p in params),
            "gradient_bytes": sum(p.numel() * p.element_size() for p in params),
            "info": labkit.rank_info()}


def _stepper(ddp, after_backward, record: dict, tokens, cfg: GPTConfig, batch: int):
    """One SGD step of one rung on its own sequence of batches; keeps the step's ledger."""
    rank, n, dev = dist.get_rank(), dist.get_world_size(), device.current_device()
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-4)
    batches = itertools.count()

    def step():
        x, y = lm_batch(tokens, batch * n, cfg.seq, next(batches), 0)
        x, y = shard(x, rank, n).to(dev), shard(y, rank, n).to(dev)
        with comm.ledger() as book:
            loss = lm_loss(ddp(x), y)
            opt.zero_grad()
            loss.backward()
            after_backward()
        opt.step()
        record["ledger"] = book.summary()

    return step
