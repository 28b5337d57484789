"""Measuring data parallelism honestly, and the alpha-beta model fitted to the measurements.

What it teaches: a benchmark is a claim about a ratio. ``allreduce_bench`` and ``ddp_bench``
run on every rank: all ranks start each timed call at a barrier, the implementations take
turns (so background noise hits them alike), and the ledger counts the bytes. Back in the
caller, ``slowest_rank_median`` takes each call's slowest rank (a collective is done when
its last rank is) and the median over calls.

The alpha-beta model the measurements are fitted to is pure and lives in
``lessonlib.costmodel.alpha_beta``.

Laptop:  ``python labs/allreduce.py --world-size 4 --size-mb 16`` and ``python labs/ddp.py``
GPU box: ``torchrun --nproc-per-node 8 labs/allreduce.py`` (the same functions, on NCCL)
"""
from __future__ import annotations

import itertools
import statistics
import time
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.distributed as dist

from lessonlib import comm, device
from lessonlib.data import corpus_tokens, lm_batch, shard, stored
from lessonlib.data_parallel.collectives import torch_all_reduce
from lessonlib.data_parallel.ring import ALGORITHMS
from lessonlib.data_parallel.ladder_runs import check_rungs, replica_step, wrap
from lessonlib.instruments.breadcrumbs import progress
from lessonlib.lab import labkit
from lessonlib.models import TEN_M, GPTConfig, TinyGPT

ALL_ALGORITHMS = (*ALGORITHMS, "torch")   # the names ``costmodel.fits`` knows


def slowest_rank_median(per_rank_times) -> float:
    """Median over calls of the slowest rank's time for that call."""
    return float(statistics.median(max(call) for call in zip(*per_rank_times)))


def call_time(ranks, size: int, algorithm: str) -> float:
    """One algorithm's time at one size from every rank's ``allreduce_bench`` result: the
    median over calls of the slowest rank's time."""
    return slowest_rank_median([r.sizes[size][algorithm].times for r in ranks])


@dataclass(frozen=True)
class StoredSweep:
    """The all-reduce sweep shipped in ``data/`` (``labs/allreduce.py --sweep``): the command
    that made it and, per algorithm, the measured points and the alpha-beta model fitted to
    them with a link per rank (``fit``) and with one shared medium (``fit_shared``)."""
    command: str
    points: dict[str, list[dict]]
    fit: dict[str, dict]
    fit_shared: dict[str, dict]

    def best_fit(self, algorithm: str) -> dict:
        """The fit with the smaller rms relative error (a tie keeps the shared one)."""
        return min(self.fit_shared[algorithm], self.fit[algorithm],
                   key=lambda f: f["rms_relative_error"])


def stored_sweep(name: str = "dp_cpu_results.json") -> StoredSweep:
    """The stored all-reduce sweep of the record ``name`` in ``data/``."""
    sweep = stored(name)["allreduce_sweep"]
    results = sweep["results"]
    return StoredSweep(command=sweep["settings"]["command"],
                       points={alg: r["points"] for alg, r in results.items()},
                       fit={alg: r["fit"] for alg, r in results.items()},
                       fit_shared={alg: r["fit_shared"] for alg, r in results.items()})


# ---------------------------------------------------------------- on the ranks
@dataclass(frozen=True)
class AlgorithmRun:
    """One algorithm at one message size on one rank: the seconds of each timed call, the
    largest difference from ``dist.all_reduce``, the bytes the ledger saw it send and receive."""
    times: list[float]
    max_error: float
    bytes_sent: int
    bytes_received: int


@dataclass(frozen=True)
class BenchRun:
    """One rank's ``allreduce_bench``: ``sizes[size_bytes][algorithm]`` an ``AlgorithmRun``,
    and the rank's ``labkit.rank_info()``."""
    rank: int
    sizes: dict[int, dict[str, AlgorithmRun]]
    info: dict


def allreduce_bench(sizes_bytes, algorithms=ALL_ALGORITHMS, budget_s: float = 2.0,
                    min_iters: int = 3, max_iters: int = 20) -> BenchRun:
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
        checked, start = {}, time.perf_counter()
        for name in algorithms:
            x.copy_(data)
            with comm.ledger() as book:
                everything[name](x)
            error = (x - expected).abs().max().item() if numel else 0.0
            checked[name] = {"max_error": error, "bytes_sent": book.total_bytes("send"),
                             "bytes_received": book.total_bytes("recv")}
        once = torch.tensor([time.perf_counter() - start], device=dev)
        comm.all_reduce(once, op=dist.ReduceOp.MAX)       # every rank must pick the same count
        iters = int(min(max_iters, max(min_iters, budget_s // max(once.item(), 1e-9))))
        times = {name: [] for name in algorithms}
        for i in range(iters):
            for name in algorithms:
                x.copy_(data)
                comm.barrier()
                t0 = device.timer()
                everything[name](x, check=False)          # shapes were checked above
                times[name].append(device.timer() - t0)
            progress(f"{size} bytes, turn {i + 1} of {iters}")
        out[int(size)] = {name: AlgorithmRun(times=times[name], **checked[name])
                          for name in algorithms}
    return BenchRun(rank=rank, sizes=out, info=labkit.rank_info())


class AllReduceRecord(NamedTuple):
    """One rank's result for one algorithm at one size, from ``allreduce_bench``."""
    n: int
    rank: int
    size_bytes: int
    algorithm: str
    bytes_sent: int
    bytes_received: int
    max_error: float
    median_s: float


def records(runs_by_n: dict[int, list[BenchRun]]) -> list[AllReduceRecord]:
    """``{n: allreduce_bench's per-rank results}`` as one flat list of named rows."""
    return [AllReduceRecord(n, r.rank, size, name, run.bytes_sent, run.bytes_received,
                            run.max_error, statistics.median(run.times))
            for n, ranks in runs_by_n.items() for r in ranks
            for size, by_name in r.sizes.items() for name, run in by_name.items()]


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
        record["ledger"] = replica_step(ddp, after_backward, opt, x, y)[1].summary()

    return step
