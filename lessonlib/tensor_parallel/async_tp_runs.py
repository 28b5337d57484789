"""Overlap you can see: exposed communication with and without overlap, on real ranks.

What it teaches: overlap does not make communication cheaper, it hides it. The ledger notes,
for every call, how long it held the rank (``Event.exposed``: a blocking call whole, an
asynchronous one inside ``wait()``). Two overlaps, each against its plain version on the same
weights and batches:

* **FSDP prefetch** (``FullyShardedDataParallel(prefetch=True)``): the next unit's
  all-gather is posted before this unit computes, so it travels during the compute;
  without prefetch every gather is waited on as soon as it is posted;
* **async TP** (``async_tp.enable_async_tp``): the sequence-parallel MLP's all-gather and
  reduce-scatter cut into the t ranks' pieces, each piece's transfer hidden behind the
  previous piece's GEMM; plain SP waits for each whole collective.

``overlap_runs`` (one rank) times a few steps of each variant and returns, per variant, the
step seconds, the communication seconds (posted to closed), the exposed seconds (medians
over the steps) and the last step's timeline (``Span``: "COMM" in flight, "EXPOSED" held);
``parity_report`` checks in float64 that each overlapped version computes what the plain one
does (outputs, input and weight gradients; FSDP: weights after two steps) and returns the
async ring's ledger for ``nccl_rules.nccl_hazards``. ``overlap_report`` launches both on 2 CPU
ranks, where gloo runs asynchronous calls on its own threads, so they overlap with compute.

Laptop:  ``python -c "from lessonlib.tensor_parallel import async_tp_runs as r;
         print(r.overlap_report())"``
GPU box: the same functions under torchrun (NCCL; exposed time then read from CUDA events on
         the compute stream, see ``lessonlib.instruments.ledger``).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace

import torch
import torch.distributed as dist
from torch import nn

from lessonlib import comm, device, launcher
from lessonlib.data_parallel.fsdp import FullyShardedDataParallel
from lessonlib.instruments.nccl_rules import nccl_hazards
from lessonlib.instruments.spans import Span
from lessonlib.models import MLP, Block, GPTConfig, init_weights_
from lessonlib.tensor_parallel.async_tp import enable_async_tp
from lessonlib.tensor_parallel.layers import TensorParallelMLP
from lessonlib.tensor_parallel.ops import split_sequence
from lessonlib.tensor_parallel.parallelize import parallelize_block

# sizes where communication is a real part of a step on 2 CPU ranks, and the run stays short.
# The SP MLP, (b, s, h), inner 4h: each piece's GEMM must outlast the ranks' drift apart on a
# loaded machine (each ring step lines them up); at b*s = 2048 it did not (async TP exposed
# 0.4-2.9x plain SP's), at b*s = 8192 it does (0.35-0.6x in 7 runs at load 2.8 on 2 cores).
TP_SHAPE = {"b": 8, "s": 1024, "h": 64}
FSDP_SHAPE = {"units": 4, "h": 512, "tokens": 64}   # units of Linear(h, h) + GELU


@dataclass
class Variant:
    """One way of running a step: medians over the timed steps (slowest rank each step)."""
    name: str
    step_s: float
    comm_s: float          # posted to closed, summed over calls (overlapped or not)
    exposed_s: float       # what the rank stood still for
    spans: dict = field(default_factory=dict, repr=False)   # rank -> last step's [Span]


def timed_step(step, i: int = 0) -> dict:
    """One call of ``step()`` in a ledger: its seconds, the ledger's sums and its timeline."""
    comm.barrier()                                      # outside any ledger: not recorded
    start = device.mark()
    with comm.ledger() as book:
        step()
    end = device.mark()
    total = device.elapsed(start, end)
    return {"step_s": total, "comm_s": sum(e.seconds for e in book.events),
            "exposed_s": book.exposed_seconds(),
            "spans": book.timeline(start, i) + [Span("STEP", -1, 0, 0.0, total, i)]}


def _sp_mlp(shape: dict, overlap: bool, seed: int = 0):
    """The SP MLP (async TP when ``overlap``) and a step of it on this rank's rows."""
    b, s, h = shape["b"], shape["s"], shape["h"]
    dense = init_weights_(MLP(h), seed).to(device.current_device())
    layer = TensorParallelMLP.from_mlp(dense, sequence_parallel=True)
    layer = enable_async_tp(layer) if overlap else layer
    gen = torch.Generator().manual_seed(seed + 1)
    x, grad = (split_sequence(torch.randn(b, s, h, generator=gen), None).to(
        device.current_device()) for _ in "xg")                         # (b, s/t, h)
    x.requires_grad_()

    def step():
        layer.zero_grad(set_to_none=True)
        x.grad = None
        layer(x).backward(grad)
    return layer, x, step


def _fsdp(shape: dict, prefetch: bool, seed: int = 0):
    """A stack of ``units`` Linear(h, h) + GELU units under FSDP (ZeRO-3), and an SGD step on
    this rank's ``tokens`` rows."""
    h, dev = shape["h"], device.current_device()
    torch.manual_seed(seed)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(h, h), nn.GELU())
                            for _ in range(shape["units"])]).to(dev)
    fsdp = FullyShardedDataParallel(model, prefetch=prefetch)
    opt = torch.optim.SGD(fsdp.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(seed + 1 + dist.get_rank())
    x = torch.randn(shape["tokens"], h, generator=gen).to(dev)          # (tokens, h)

    def step():
        opt.zero_grad(set_to_none=True)
        fsdp(x).square().mean().backward()
        opt.step()
    return fsdp, step


VARIANTS = {"sp": lambda shape: _sp_mlp(shape, False)[-1],
            "async_tp": lambda shape: _sp_mlp(shape, True)[-1],
            "fsdp": lambda shape: _fsdp(shape, False)[-1],
            "fsdp_prefetch": lambda shape: _fsdp(shape, True)[-1]}


def overlap_runs(steps: int = 8, warmup: int = 2, tp_shape=None, fsdp_shape=None) -> dict:
    """On each rank: ``steps`` timed steps of every variant, taking turns step by step so
    that a burst of background load hits them alike: {variant: [step records]}."""
    shapes = {"sp": tp_shape or TP_SHAPE, "async_tp": tp_shape or TP_SHAPE,
              "fsdp": fsdp_shape or FSDP_SHAPE, "fsdp_prefetch": fsdp_shape or FSDP_SHAPE}
    steppers = {name: make(shapes[name]) for name, make in VARIANTS.items()}
    for step in steppers.values():
        for _ in range(warmup):
            step()
    out = {name: [] for name in VARIANTS}
    for i in range(steps):
        for name, step in steppers.items():
            out[name].append(timed_step(step, i))
    return {"rank": dist.get_rank(), "runs": out}


PAIRS = {"async_tp": "sp", "fsdp_prefetch": "fsdp"}   # overlapped -> its plain version


def exposed_ratios(ranks: list[dict]) -> dict[str, float]:
    """Per overlapped variant: the median over steps of its exposed seconds over its plain
    version's in the same step (the two ran back to back: robust to load that drifts)."""
    def exposed(name):
        return [max(rec["exposed_s"] for rec in step)
                for step in zip(*(r["runs"][name] for r in ranks))]
    return {name: statistics.median(a / max(b, 1e-9) for a, b in
                                    zip(exposed(name), exposed(plain)))
            for name, plain in PAIRS.items()}


def summarize(ranks: list[dict]) -> dict[str, Variant]:
    """Per variant: the medians over steps of the slowest rank's seconds."""
    out = {}
    for name in ranks[0]["runs"]:
        per_step = list(zip(*(r["runs"][name] for r in ranks)))
        med = {k: statistics.median(max(rec[k] for rec in step) for step in per_step)
               for k in ("step_s", "comm_s", "exposed_s")}
        out[name] = Variant(name, **med,
                            spans={r["rank"]: r["runs"][name][-1]["spans"] for r in ranks})
    return out


@dataclass
class OverlapParity:
    """Each overlap against its plain version (float64, largest absolute differences): the
    async SP MLP's output, input and weight gradients, a transformer layer's (``block``), and
    FSDP's weights after two steps with prefetch; the async MLP's calls by op and its ledger
    events (for ``nccl_hazards``)."""
    output: float
    input_grad: float
    grads: float
    block: float
    fsdp_weights: float
    ring_calls: dict
    events: list = field(repr=False)


@dataclass
class OverlapReport:
    """``overlap_report``'s answer: rank 0's ``OverlapParity``, every variant's ``Variant``,
    each overlap's exposed ratio, and NCCL's rules over the ranks' async rings."""
    parity: OverlapParity
    variants: dict
    exposed_ratio: dict
    nccl_hazards: list


def parity_report(b: int = 2, s: int = 8, h: int = 8, seed: int = 0) -> OverlapParity:
    """On each rank, float64: async TP against plain SP (the MLP and, through
    ``enable_async_tp``, nothing else changed), and FSDP with prefetch against without:
    the largest absolute differences, and the async MLP's ledger events."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        results = {}
        for overlap in (False, True):
            layer, x, step = _sp_mlp({"b": b, "s": s, "h": h}, overlap, seed)
            with comm.ledger() as book:
                y = layer(x)
                y.backward(torch.ones_like(y))
            results[overlap] = (y.detach(), x.grad, {n: p.grad for n, p in
                                                     layer.named_parameters()}, book)
        (y0, gx0, g0, _), (y1, gx1, g1, book) = results[False], results[True]
        block = _block_parity(b, s, h, seed)
        weights = {}
        for prefetch in (False, True):
            fsdp, step = _fsdp({"units": 3, "h": h, "tokens": 4}, prefetch, seed)
            step(), step()
            weights[prefetch] = fsdp.full_state_dict()
        return OverlapParity(
            output=(y1 - y0).abs().max().item(), input_grad=(gx1 - gx0).abs().max().item(),
            grads=max((g1[n] - g0[n]).abs().max().item() for n in g0),
            block=block,
            fsdp_weights=max((weights[True][k] - weights[False][k]).abs().max().item()
                             for k in weights[False]),
            ring_calls={op: book.count(op) for op in ("send", "recv", "all_gather",
                                                      "reduce_scatter")},
            events=[replace(e, marks=None, span=None, stalls=[]) for e in book.events])
    finally:
        torch.set_default_dtype(before)


def _block_parity(b: int, s: int, h: int, seed: int) -> float:
    """A transformer layer (fused Q, K, V column layer, output projection row layer) with
    async TP against plain SP: the largest difference of output, input and weight grads."""
    dense = init_weights_(Block(GPTConfig(seq=s, hidden=h, heads=2)), seed, std=0.02)
    gen = torch.Generator().manual_seed(seed + 1)
    x = split_sequence(torch.randn(b, s, h, generator=gen), None)       # (b, s/t, h)
    got = []
    for overlap in (False, True):
        layer = parallelize_block(dense.to(device.current_device()), sequence_parallel=True)
        layer = enable_async_tp(layer) if overlap else layer
        rows = x.to(device.current_device()).requires_grad_()
        y = layer(rows)
        y.backward(torch.ones_like(y))
        got.append([y.detach(), rows.grad, *(p.grad for p in layer.parameters())])
    return max((a - b).abs().max().item() for a, b in zip(*got))


def compare_overlap(plain, overlapped, x, grad, steps: int, warmup: int) -> dict:
    """On one rank: two layers that must compute the same (``overlapped`` hides its
    communication), on this rank's ``x`` with output gradient ``grad``: their largest
    output and input-gradient differences, then ``steps`` timed steps each, taking turns
    (``timed_step``): the medians of this rank's seconds."""
    results, steppers = [], []
    for layer in (plain, overlapped):
        rows = x.detach().clone().requires_grad_()
        y = layer(rows)
        y.backward(grad)
        results.append((y.detach(), rows.grad))

        def step(layer=layer, rows=rows):
            layer.zero_grad(set_to_none=True)
            rows.grad = None
            layer(rows).backward(grad)
        steppers.append(step)
    for _ in range(warmup):
        for step in steppers:
            step()
    runs = [[], []]
    for i in range(steps):
        for k, step in enumerate(steppers):
            runs[k].append(timed_step(step, i))
    med = [{key: statistics.median(r[key] for r in run) for key in ("step_s", "comm_s",
                                                                      "exposed_s")}
           for run in runs]
    (y0, g0), (y1, g1) = results
    return {"plain": med[0], "overlapped": med[1],
            "output_max_abs_diff": (y1 - y0).abs().max().item(),
            "input_grad_max_abs_diff": (g1 - g0).abs().max().item()}


def across_ranks(per_rank: list[dict]) -> dict:
    """``compare_overlap``'s results of every rank as one: the largest difference, and
    each median of the slowest rank ("plain" and "overlapped")."""
    return {key: (max(r[key] for r in per_rank) if key.endswith("diff") else
                  {k: max(r[key][k] for r in per_rank) for k in per_rank[0][key]})
            for key in per_rank[0]}


def _both(steps, warmup, tp_shape, fsdp_shape) -> dict:
    return {"parity": parity_report(), **overlap_runs(steps, warmup, tp_shape, fsdp_shape)}


def overlap_report(world_size: int = 2, steps: int = 8, warmup: int = 2, tp_shape=None,
                   fsdp_shape=None, timeout: float = 120) -> OverlapReport:
    """What the notebook calls: on ``world_size`` CPU ranks (GPUs when visible), the float64
    parity of both overlaps (rank 0's) and every variant's ``Variant`` (medians)."""
    ranks = launcher.launch(_both, world_size, steps, warmup, tp_shape, fsdp_shape,
                            timeout=timeout)
    hazards = nccl_hazards([r["parity"].events for r in ranks])
    return OverlapReport(replace(ranks[0]["parity"], events=[]), summarize(ranks),
                         exposed_ratios(ranks), hazards)

