"""What the MoE lesson measures: load, drops, the all-to-all's bytes and time.

What it teaches: an MoE layer's cost is set by its routing. ``balance_study`` trains the
tiny MoE GPT on the course's corpus with and without the auxiliary loss and records how
many tokens each expert was sent, step by step (the histogram), and what share of the
routing choices a capacity factor of 1.0, 1.25 or 2.0 drops. ``time_layer`` times the
e-rank layer's step and the all-to-alls inside it (from the ledger: a batch of sends and
receives is one all-to-all, as long as its slowest part). ``alltoall_sweep`` times bare
all-to-alls of growing size, the points the alpha-beta model is fitted to.

Laptop:  ``python labs/ep.py --world-size 4`` (``time_layer``); ``balance_study`` runs in
one process.
GPU box: the same under NCCL; the ledger's times are CUDA events.
"""
from __future__ import annotations

import statistics

import torch
import torch.distributed as dist
import torch.nn.functional as F

from lessonlib import comm, device
from lessonlib.baseline import corpus_batches
from lessonlib.expert_parallel.layer import expert_parallel
from lessonlib.expert_parallel.runs import expected_bytes, sent_and_received
from lessonlib.models import MOE_CONFIG, MoELayer, aux_loss, init_weights_, lm_loss, moe_gpt

CAPACITY_FACTORS = (1.0, 1.25, 2.0)


def balance_study(balance: bool, n_experts: int = 8, top_k: int = 2, steps: int = 60,
                  batch: int = 16, seed: int = 0, factors=CAPACITY_FACTORS) -> dict:
    """Train ``moe_gpt`` (AdamW) on the corpus, with the auxiliary loss in the objective or
    not; return the choices each expert of the first layer was sent at every step, the
    language-model losses, and the dropped share of a held-out batch at each capacity
    factor, over every MoE layer."""
    torch.manual_seed(seed)
    model = moe_gpt(MOE_CONFIG, n_experts, top_k, seed=seed)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    batches, load, losses = corpus_batches(MOE_CONFIG, batch, seed), [], []
    for step in range(steps):
        x, y = batches(step)
        loss = lm_loss(model(x), y)
        (loss + aux_loss(model) if balance else loss).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        load.append(model.blocks[0].mlp.stats["routed_per_expert"])
        losses.append(loss.item())
    x, _ = batches(10_000)
    layers, dropped = [b.mlp for b in model.blocks], {}
    with torch.no_grad():
        for factor in factors:
            for layer in layers:
                layer.capacity_factor = factor
            model(x)
            choices = top_k * x.numel()
            dropped[factor] = sum(m.stats["dropped"] for m in layers) / (choices * len(layers))
    return {"balance": balance, "E": n_experts, "k": top_k, "load": load, "losses": losses,
            "dropped_share": dropped, "imbalance": imbalance(load[steps // 2:])}


def imbalance(load: list[list[int]]) -> float:
    """The busiest expert's load over the mean load, averaged over steps (1 = even)."""
    return statistics.mean(max(step) * len(step) / sum(step) for step in load)


def alltoall_seconds(events) -> float:
    """Seconds spent in all-to-alls: each batch of sends and receives counted once, for its
    longest part (every part of a batch is timed from its start to its wait)."""
    batches: dict = {}
    for ev in events:
        if ev.batch is not None:
            batches[ev.batch] = max(batches.get(ev.batch, 0.0), ev.seconds)
    return sum(batches.values())


def time_layer(n_experts: int, top_k: int, capacity_factor: float, b: int, s: int, h: int,
               steps: int, warmup: int, seed: int = 0) -> dict:
    """On each rank of the world (e = world size): the expert-parallel layer's forward and
    backward, ``warmup`` + ``steps`` times, each step's time and all-to-all time; the first
    step's output against the one-process layer, and its bytes against the routing."""
    dev, rank = device.current_device(), dist.get_rank()
    full = init_weights_(MoELayer(h, n_experts, top_k, capacity_factor), seed).to(dev)
    ep = expert_parallel(full)
    gen = torch.Generator().manual_seed(seed + 1 + rank)
    x = torch.randn(b, s, h, generator=gen).to(dev).requires_grad_()          # (b, s, h)
    y = torch.randn(b, s, h, generator=gen).to(dev)
    step_s, a2a_s = [], []
    for i in range(warmup + steps):
        dist.barrier()
        with comm.ledger() as book:
            start = device.timer()
            loss = F.mse_loss(ep(x), y) + ep.stats["aux_loss"]
            loss.backward()
            elapsed = device.timer() - start
        if i == 0:
            first = {"events": book.events, "stats": dict(ep.stats)}
        if i >= warmup:
            step_s.append(elapsed)
            a2a_s.append(alltoall_seconds(book.events))
        ep.zero_grad(set_to_none=True)
        x.grad = None
    with torch.no_grad():
        error = (ep(x) - full(x)).abs().max().item()
    stats = {k: v for k, v in first["stats"].items() if k != "aux_loss"}
    return {"rank": rank, "e": dist.get_world_size(), "step_s": step_s, "alltoall_s": a2a_s,
            "output_max_abs_error": error, "stats": stats,
            "bytes": sent_and_received(first["events"], rank),
            "expected_bytes": expected_bytes(stats, n_experts, h, x.element_size(),
                                             return_element_size=_compute_size(x)),
            "events": first["events"]}


def _compute_size(x: torch.Tensor) -> int:
    """Bytes per element the experts compute in: autocast's dtype when it is on."""
    kind = x.device.type
    if torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind).itemsize
    return x.element_size()


def alltoall_sweep(sizes_bytes=(2**10, 2**14, 2**17, 2**20), repeats: int = 7) -> list:
    """Seconds of one all-to-all of equal slices, for each total size a rank sends:
    [(e, bytes_per_rank, seconds)], the points ``costmodel.alpha_beta.fit_alpha_beta`` takes
    (with the all-to-all's terms, ``costmodel.moe.alltoall_terms``). The fastest of
    ``repeats``: CPU ranks share their cores with whatever else runs, and load only adds."""
    e, dev, points = dist.get_world_size(), device.current_device(), []
    for size in sizes_bytes:
        rows = max(e, size // 4 // e * e)
        send, recv = torch.ones(rows, device=dev), torch.empty(rows, device=dev)
        times = []
        for _ in range(repeats + 1):
            dist.barrier()
            start = device.timer()
            comm.all_to_all_single(recv, send)
            times.append(device.timer() - start)
        points.append((e, rows * 4, min(times[1:])))
    return points
