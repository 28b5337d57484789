"""ZeRO stages 0-3 timed against FSDP2's ``fully_shard``: what sharding saves and costs.

What it teaches: sharding is a trade. Each stage trains the same tiny GPT on every rank's
shard of each batch; for each one a rank reports its step times, the bytes it holds for the
model's state (and, on a GPU, ``max_memory_allocated`` during its steps) and what one step
sends (from the ledger; PyTorch's own runs call ``torch.distributed`` directly, out of its
sight), and the seconds each timed step's communication held the rank (``exposed``, the
ledger's: what prefetching hides). The stages run in blocks that take turns ``rounds`` times, so a burst of background
load slows them all alike; each block starts from freshly built weights, so a GPU's peak is
that stage's alone.

Laptop:  ``python labs/zero.py --world-size 2 --json results/zero.json``
GPU box: ``torchrun --nproc-per-node 8 labs/zero.py --json results/zero.json`` (NCCL)
"""
from __future__ import annotations

import itertools

import torch
import torch.distributed as dist

from lessonlib import comm, device
from lessonlib.data import corpus_tokens
from lessonlib.data_parallel.zero_runs import (build_model, check_choices, held_bytes, setup,
                                               train_step)
from lessonlib.lab import labkit
from lessonlib.models import GPTConfig


def zero_bench(stages=("0", "1", "2", "3", "torch-fsdp2"), cfg: GPTConfig | None = None,
               optimizer: str = "adamw", batch: int = 4, steps: int = 10, warmup: int = 2,
               rounds: int = 3, compute_dtype: str | None = None) -> dict:
    """Per stage: this rank's step times, bytes held after a step, GPU peak (None on CPU)
    and one step's ledger."""
    for stage in stages:
        check_choices(stage, optimizer)
    cfg = cfg or GPTConfig(vocab=27, seq=32, hidden=64, heads=4, layers=4)
    dtype = {None: None, "bfloat16": torch.bfloat16}[compute_dtype]
    rank, dev = dist.get_rank(), device.current_device()
    out = {s: {"times": [], "held": {}, "ledger": {}, "peak_bytes": None, "exposed": []}
           for s in stages}
    tokens, _ = corpus_tokens()
    for _ in range(rounds):
        for stage in stages:
            model = build_model(cfg, 0).to(dev)
            params = sum(p.numel() for p in model.parameters())
            model, opt, sync = setup(stage, model, optimizer, dtype)
            step = _stepper(stage, model, opt, sync, out[stage], tokens, cfg, batch)
            timed_from = len(out[stage]["exposed"])
            labkit.time_steps(step, 0, warmup)
            del out[stage]["exposed"][timed_from:]             # the warm-up steps'
            device.reset_peak_memory()
            out[stage]["times"] += labkit.time_steps(step, steps, 0)
            peak = device.peak_memory_bytes()
            if peak is not None:
                out[stage]["peak_bytes"] = max(peak, out[stage]["peak_bytes"] or 0)
            del model, opt, step
    return {"rank": rank, "runs": out, "parameters": params, "info": labkit.rank_info()}


def _stepper(stage, model, opt, sync, record: dict, tokens, cfg: GPTConfig, batch: int):
    """One training step on its own sequence of batches; keeps the step's ledger, its
    exposed communication seconds and the bytes held after it."""
    batches, n = itertools.count(), dist.get_world_size()

    def step():
        with comm.ledger() as book:
            record["ledger"] = train_step(model, opt, sync, tokens, cfg, batch * n,
                                          next(batches))
        record["exposed"].append(book.exposed_seconds())
        if not record["held"]:                   # the same every step: count it once
            record["held"] = held_bytes(stage, model, opt)

    return step
