"""DualPipe's overlap checked and measured: what the tests and the notebook launch.

What it teaches: hiding the all-to-alls changes when a rank waits, not what it computes.
``rank_parity`` runs two micro-batches through one expert-parallel MoE block the DualPipe way
(B's forward alone, then the F&B slot: A's forward beside B's backward, then A's backward
alone), with and without overlap, in float64, against the one-process block on every
rank's micro-batches: outputs, input gradients and weight gradients, and the two runs
against each other (equal to the bit). ``timing`` repeats the F&B slot at a size where the
all-to-alls are a real part of it, both ways in turn (each slot's forward is the
next one's backward, as in DualPipe's steady state), and records each slot's time and the
seconds the rank was held in ``wait()`` or in a blocking call (``Ledger.exposed_seconds``).
``run_overlap`` launches both on 2 CPU ranks (one launch, about 2 s) and returns an
``OverlapReport``.

Laptop:  ``python -c "import lessonlib.expert_parallel.overlap_runs as o; print(o.run_overlap())"``
GPU box: the same call runs under NCCL when 2 GPUs are visible.
"""
from __future__ import annotations

import copy
import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from lessonlib import comm, device, launcher
from lessonlib.baseline import grads_as_model, rel_err
from lessonlib.data_parallel.ladder import sync_gradients
from lessonlib.expert_parallel.groups import ExpertParallelContext, expert_parameters
from lessonlib.expert_parallel.layer import expert_parallel
from lessonlib.expert_parallel.overlap import backward, forward, forward_backward
from lessonlib.models import corpus_config, moe_gpt

# the timed slot on 2 CPU ranks: about 60 ms, 10-20 % of it all-to-alls waited at once
# (8 MB sent per rank per slot); a wide h, k = 4 and a narrow expert (ffn_mult 1) make
# the transfers a real part of the slot
TIMING_SHAPE = dict(s=64, h=256, heads=4, ffn_mult=1, E=8, k=4, b=8)


def moe_block(s: int, h: int, heads: int, ffn_mult: int, E: int, k: int, seed: int = 0,
              **routing):
    """The first block of an MoE GPT (``moe_gpt``), its MoE layer with E experts, top-k."""
    cfg = corpus_config(seq=s, hidden=h, heads=heads, layers=1, ffn_mult=ffn_mult)
    return moe_gpt(cfg, E, k, seed=seed, **routing).blocks[0]


def ep_block(block, group):
    """This rank's copy of ``block``: attention replicated, the MoE layer expert-parallel."""
    twin = copy.deepcopy(block)
    twin.mlp = expert_parallel(block.mlp, group)
    return twin


def _worst(module, reference, attr=None) -> float:
    """Largest error of ``module``'s parameters (or ``.grad``) against ``reference``'s,
    relative to the largest reference value (a zero gradient stays comparable)."""
    want = dict(reference.named_parameters())
    scale = max(w.detach().abs().max().item() for w in want.values())
    return max(((getattr(p, attr) if attr else p) - want[n]).detach().abs().max().item()
               for n, p in module.named_parameters()) / scale


def _slot(block, mbs, overlap: bool):
    """B's forward, the F&B slot (A beside B), A's backward: [A's trip, B's trip]."""
    (xa, ya), (xb, yb) = mbs
    b = forward(block, xb, yb)
    a = forward_backward(block, xa, ya, b, overlap)
    backward(block, a)
    return [a, b]


def rank_parity(s=8, h=16, heads=2, ffn_mult=2, E=4, k=2, b=2, seed=0) -> dict:
    """On each rank: both ways against the one-process block, float64 (module docstring)."""
    ctx, dev = ExpertParallelContext.build(dist.get_world_size()), device.current_device()
    rank, d = dist.get_rank(), dist.get_world_size()
    full = moe_block(s, h, heads, ffn_mult, E, k, seed, capacity_factor=1.0).double().to(dev)
    gen = torch.Generator().manual_seed(seed + 1)
    data = [[[torch.randn(b, s, h, generator=gen, dtype=torch.float64).to(dev)
              for _ in "xy"] for _ in "AB"] for _ in range(d)]      # [rank][mb] (x, y)
    outs, xgrads = [], []
    for r in range(d):
        for x, y in data[r]:
            x = x.clone().requires_grad_()
            out = full(x)
            # every rank's loss over d: the mean the data-parallel average gives
            ((torch.nn.functional.mse_loss(out, y) + full.mlp.aux_loss) / d).backward()
            if r == rank:
                outs.append(out.detach())
                xgrads.append(d * x.grad)
    report, runs = {"rank": rank}, {}
    for overlap in (False, True):
        ep = ep_block(full, ctx.ep.group)
        with comm.ledger() as book:
            trips = _slot(ep, data[rank], overlap)
        sync_gradients(ep, None, expert_parameters(ep), ctx.edp.group, ctx.d)
        runs[overlap] = [t.out.detach() for t in trips] + [t.x.grad for t in trips] + [
            p.grad for p in ep.parameters()]
        report[overlap] = {
            "output": max(rel_err(t.out, o) for t, o in zip(trips, outs)),
            "input_grad": max(rel_err(t.x.grad, g) for t, g in zip(trips, xgrads)),
            "grads": _worst(ep, ep_block(grads_as_model(full), ctx.ep.group), "grad"),
            "events": book.events}
    report["overlap_vs_plain"] = max((p - q).abs().max().item()
                                     for p, q in zip(runs[True], runs[False]))
    ctx.destroy()
    return report


def timing(reps: int = 8, warmup: int = 1, seed: int = 0, shape: dict | None = None) -> dict:
    """On each rank: F&B slots in DualPipe's steady state, each slot's forward the next
    one's backward, overlapped and plain in turn, ``reps`` of each after ``warmup`` (float32):
    per way, each slot's seconds and exposed seconds; the bytes one slot's all-to-alls send."""
    ctx, dev = ExpertParallelContext.build(dist.get_world_size()), device.current_device()
    shape = {**TIMING_SHAPE, **(shape or {})}
    b, s, h = shape.pop("b"), shape["s"], shape["h"]
    block = ep_block(moe_block(**shape, seed=seed, capacity_factor=1.0).to(dev), ctx.ep.group)
    gen = torch.Generator().manual_seed(seed + 1 + dist.get_rank())
    # every slot the same micro-batch, so that both ways do the same work: two different
    # ones would route differently and load the ranks unevenly in a different way
    mb = [torch.randn(b, s, h, generator=gen).to(dev) for _ in "xy"]
    out = {False: {"slot_s": [], "exposed_s": []}, True: {"slot_s": [], "exposed_s": []}}
    trip = forward(block, *mb)
    for slot in range(2 * (warmup + reps)):
        overlap = slot % 2 == 1
        comm.barrier(ctx.ep.group)             # both ranks start the slot together
        with comm.ledger() as book:
            start = time.perf_counter()
            trip = forward_backward(block, *mb, trip, overlap)
            device.synchronize()
            seconds = time.perf_counter() - start
        if slot >= 2 * warmup:
            out[overlap]["slot_s"].append(seconds)
            out[overlap]["exposed_s"].append(book.exposed_seconds())
            out["sent_bytes"] = book.total_bytes("send")
    backward(block, trip)
    ctx.destroy()
    return out


def report(reps: int = 8, warmup: int = 1, shape: dict | None = None) -> dict:
    """One launch's worth: ``rank_parity`` and ``timing``."""
    return {"parity": rank_parity(), "timing": timing(reps, warmup, shape=shape)}


@dataclass
class OverlapReport:
    """The F&B slot on 2 CPU ranks, medians over repetitions of the slowest rank's value."""
    plain_exposed_s: float     # seconds held by communication, each all-to-all waited at once
    overlap_exposed_s: float   # the same with DualPipe's order of waits
    plain_slot_s: float        # the slot's wall time without overlap
    overlap_slot_s: float      # and with it
    sent_bytes: int            # what one rank's all-to-alls send in one slot
    reps: int
    parity_error: float        # worst relative error against one process (float64), both ways
    overlap_vs_plain: float    # largest difference between the two ways (0.0: to the bit)

    @property
    def exposed_ratio(self) -> float:
        return self.overlap_exposed_s / self.plain_exposed_s


def summarize(ranks: list[dict]) -> OverlapReport:
    """``report``'s ranks: per repetition the slowest rank, then the median over them."""
    t = [r["timing"] for r in ranks]
    p = [r["parity"][way][key] for r in ranks for way in (False, True)
         for key in ("output", "input_grad", "grads")]

    def median(way, key):
        return statistics.median(max(vals) for vals in zip(*(r[way][key] for r in t)))
    return OverlapReport(median(False, "exposed_s"), median(True, "exposed_s"),
                         median(False, "slot_s"), median(True, "slot_s"),
                         max(r["sent_bytes"] for r in t), len(t[0][False]["slot_s"]),
                         max(p), max(r["parity"]["overlap_vs_plain"] for r in ranks))


def run_overlap(reps: int = 8, warmup: int = 1, shape: dict | None = None,
                timeout: float = 120) -> OverlapReport:
    """``report`` on 2 CPU ranks (one launch), summarized."""
    return summarize(launcher.launch(report, 2, reps, warmup, shape=shape, timeout=timeout))
