"""The runs behind the data-parallel lesson: the functions notebook 02 and the tests launch
on their ranks (spawned ranks can only run module functions); the benchmarks are in
``lessonlib.data_parallel.bench``.

What it teaches: parity with one process is the proof. ``wrap`` puts any rung of the ladder,
or PyTorch's own DDP, behind one interface; ``train_replicas`` starts every rank from its
own random weights and trains on its shard, ``train_single`` trains one process on the full
batch, and the two must agree. ``step_timeline`` records one step on each rank: when
backward computed and when each all-reduce ran, to see overlap (or its absence): the
bucketed rung's stamps are taken by ``recorder.BucketRecorder``, the recorder ``DataParallel``
is handed. Results come back as records (``SingleRun``, ``ReplicaRun``, ``BucketSweep``).

One job: the rank side of the data-parallel lesson's runs; its length is their records.

Laptop:  ``python -c "import lessonlib as L; print(L.launch(L.data_parallel.ladder_runs.demo, 2))"``
GPU box: the labs run these under torchrun: ``torchrun --nproc-per-node 8 labs/ddp.py``
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import nn

from lessonlib import comm, device
from lessonlib.baseline import corpus_batches, train_one_process
from lessonlib.data import shard
from lessonlib.data_parallel.ddp import DataParallel
from lessonlib.data_parallel.ladder import (AsyncGradientHooks, allreduce_flat_gradients,
                                            allreduce_gradients, gradients, replicate)
from lessonlib.data_parallel.recorder import BucketRecorder
from lessonlib.instruments.breadcrumbs import progress
from lessonlib.models import TIMELINE_MODEL, TINY, GPTConfig, TinyGPT, lm_loss

RUNGS = {"naive": "(a) one all-reduce per gradient, after backward",
         "flat": "(b) one flattened all-reduce, after backward",
         "async": "(c) one async all-reduce per gradient, from hooks during backward",
         "bucketed": "(d) lessonlib.DataParallel: buckets launched as they fill",
         "torch": "PyTorch's DistributedDataParallel"}


class Bar(NamedTuple):
    """One interval of ``step_timeline``: what ran, in seconds from the step's start."""
    what: str
    start: float
    end: float


@dataclass(frozen=True)
class CapRun:
    """One bucket cap of ``bucket_sweep``: the buckets it makes, the median of backward's
    compute time and of the communication left after it (seconds)."""
    buckets: int
    backward_s: float
    exposed_s: float


@dataclass(frozen=True)
class BucketSweep:
    """One rank's ``bucket_sweep``: a ``CapRun`` per cap (MiB) and the gradients' bytes."""
    rank: int
    caps: dict[float, CapRun]
    gradient_bytes: int


def check_rungs(rungs) -> list[str]:
    rungs = list(rungs)
    bad = [r for r in rungs if r not in RUNGS]
    if bad or not rungs:
        raise ValueError(f"rungs={rungs} must be a non-empty list drawn from {list(RUNGS)}")
    return rungs


def wrap(rung: str, model: nn.Module, group=None, bucket_cap_mb: float = 25.0):
    """(the model to call, what to call after ``loss.backward()``) for one rung."""
    check_rungs([rung])
    nothing = lambda: None  # noqa: E731  (rungs c, d and torch finish inside backward)
    if rung == "naive":
        return replicate(model, group), lambda: allreduce_gradients(model, group)
    if rung == "flat":
        return replicate(model, group), lambda: allreduce_flat_gradients(gradients(model), group)
    if rung == "async":
        return AsyncGradientHooks(model, group).module, nothing
    if rung == "bucketed":
        return DataParallel(model, bucket_cap_mb=bucket_cap_mb, group=group,
                            recorder=BucketRecorder()), nothing
    dev = device.current_device()
    ids = [dev] if dev.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(model, device_ids=ids, process_group=group,
                                               bucket_cap_mb=bucket_cap_mb), nothing


def replica_step(ddp, after_backward, opt, x, y):
    """One training step of one replica on its shard (x, y): forward, backward, the rung's
    gradient sync (``after_backward``), the optimizer step. Returns (loss, the ledger of
    what the step sent; a sharded optimizer's step sends too, so it is inside)."""
    with comm.ledger() as book:
        loss = lm_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        after_backward()
        opt.step()
    return loss, book


@dataclass
class SingleRun:
    """``train_single``: each step's loss and the weights after the last, as one vector."""
    losses: list
    weights: torch.Tensor


@dataclass
class ReplicaRun:
    """One rank's ``train_replicas``: each step's shard loss, the weights it started from and
    ended with (vectors), its buckets (None outside lessonlib's bucketed rungs) and each
    step's ledger summary ({op: {"calls", "bytes"}})."""
    rank: int
    losses: list
    start: torch.Tensor
    buckets: int | None
    weights: torch.Tensor
    comm: list


def train_single(cfg: GPTConfig = TINY, steps: int = 20, global_batch: int = 16,
                 lr: float = 3e-3, seed: int = 0) -> SingleRun:
    """One process on the full batch: the run every data-parallel run must reproduce."""
    model = TinyGPT(cfg, seed)
    run = train_one_process(model, corpus_batches(cfg, global_batch, seed), steps,
                            optimizer="adamw", lr=lr)
    return SingleRun(run["losses"], nn.utils.parameters_to_vector(model.parameters()))


def train_replicas(rung: str = "bucketed", cfg: GPTConfig = TINY, steps: int = 20,
                   global_batch: int = 16, lr: float = 3e-3, seed: int = 0,
                   bucket_cap_mb: float = 0.01) -> ReplicaRun:
    """On each rank: start from *its own* random weights, wrap, train on its shard of each
    global batch."""
    rank, n = dist.get_rank(), dist.get_world_size()
    dev = device.current_device()
    model = TinyGPT(cfg, seed + 7919 * rank).to(dev)       # different on every rank
    start = nn.utils.parameters_to_vector(model.parameters()).clone()
    ddp, after_backward = wrap(rung, model, bucket_cap_mb=bucket_cap_mb)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses, comm_per_step, batch_of = [], [], corpus_batches(cfg, global_batch, seed)
    for step in range(steps):
        x, y = (shard(t, rank, n).to(dev) for t in batch_of(step))
        loss, book = replica_step(ddp, after_backward, opt, x, y)
        losses.append(loss.item())
        comm_per_step.append(book.summary())
        progress(f"{rung} step {step + 1} of {steps}")
    buckets = len(ddp.buckets) if isinstance(ddp, DataParallel) else None
    return ReplicaRun(rank, losses, start, buckets,
                      nn.utils.parameters_to_vector(model.parameters()), comm_per_step)


def ladder_messages(rungs=("naive", "flat", "async", "bucketed"), cfg: GPTConfig = TINY,
                    bucket_cap_mb: float = 0.01) -> dict:
    """What one training step of each rung sends, from the ledger: {rung: summary}."""
    rank, n, dev = dist.get_rank(), dist.get_world_size(), device.current_device()
    out = {}
    for rung in check_rungs(rungs):
        model = TinyGPT(cfg, 0).to(dev)
        ddp, after_backward = wrap(rung, model, bucket_cap_mb=bucket_cap_mb)
        x, y = (shard(t, rank, n).to(dev) for t in corpus_batches(cfg, 4 * n)(0))
        with comm.ledger() as book:
            lm_loss(ddp(x), y).backward()
            after_backward()
        out[rung] = book.summary()
    return out


def step_timeline(cfg: GPTConfig = TIMELINE_MODEL, batch: int = 4, bucket_cap_mb: float = 2.0,
                  rungs=("naive", "bucketed"), warmup: int = 2) -> dict[str, list[Bar]]:
    """One training step per rung on this rank, as ``Bar(what, start, end)`` intervals in
    seconds from the step's start: forward, backward's compute, and each all-reduce."""
    rank, n = dist.get_rank(), dist.get_world_size()
    dev = device.current_device()
    out = {}
    for rung in check_rungs(rungs):
        model = TinyGPT(cfg, 0).to(dev)
        ddp, after_backward = wrap(rung, model, bucket_cap_mb=bucket_cap_mb)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        batch_of = corpus_batches(cfg, batch * n)
        for step in range(warmup + 1):
            x, y = (t.to(dev) for t in batch_of(step))
            x, y = shard(x, rank, n), shard(y, rank, n)
            comm.barrier()
            t0 = device.timer()
            loss = lm_loss(ddp(x), y)
            t_fwd = device.timer()
            opt.zero_grad()
            loss.backward()
            t_bwd = device.timer()
            after_backward()
            t_comm = device.timer()
            opt.step()
            t_end = device.timer()
        bars = [("forward", t0, t_fwd)]
        if rung == "bucketed":
            line = ddp.timeline
            bars.append(("backward", t_fwd, line["backward_computed_at"]))
            bars += [(f"bucket {b['bucket']}", b["launched_at"], b["done_at"])
                     for b in line["buckets"]]
        else:
            bars += [("backward", t_fwd, t_bwd), ("all-reduce", t_bwd, t_comm)]
        bars.append(("optimizer", t_comm, t_end))
        out[rung] = [Bar(what, a - t0, b - t0) for what, a, b in bars]
    return out


def bucket_sweep(caps_mb=(0.25, 1.0, 4.0, 16.0), cfg: GPTConfig = TIMELINE_MODEL,
                 batch: int = 4, steps: int = 4) -> BucketSweep:
    """For each bucket cap: the buckets it makes, and the median over ``steps`` steps of
    backward's compute time and of the communication left after it (from the end of
    backward's compute to ``loss.backward()`` returning)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    dev = device.current_device()
    out = {}
    for cap in caps_mb:
        model = TinyGPT(cfg, 0).to(dev)
        ddp = DataParallel(model, bucket_cap_mb=cap, recorder=BucketRecorder())
        computed, exposed, batch_of = [], [], corpus_batches(cfg, batch * n)
        for step in range(steps + 1):                       # the first step warms up
            x, y = (shard(t, rank, n).to(dev) for t in batch_of(step))
            model.zero_grad()
            loss = lm_loss(ddp(x), y)
            comm.barrier()
            t0 = device.timer()
            loss.backward()
            t1 = device.timer()
            if step:
                computed.append(ddp.timeline["backward_computed_at"] - t0)
                exposed.append(t1 - ddp.timeline["backward_computed_at"])
        out[cap] = CapRun(buckets=len(ddp.buckets), backward_s=statistics.median(computed),
                          exposed_s=statistics.median(exposed))
        progress(f"bucket cap {cap} MiB done")
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return BucketSweep(rank=rank, caps=out, gradient_bytes=grad_bytes)


def demo() -> dict:
    """Two tiny steps of rung (d): this rank's losses and how many all-reduces each took."""
    result = train_replicas("bucketed", steps=2)
    return {"losses": result.losses, "buckets": result.buckets,
            "all_reduces": [s["all_reduce"]["calls"] for s in result.comm]}
