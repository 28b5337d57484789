"""Context parallelism checked for real: the rank functions the tests, notebook 12 and
``labs/cp.py`` launch.

What it teaches: ring attention is right when it is attention. ``attention_report`` runs
``ring_attention`` on this rank's shards of q, k, v built from one seed and compares its
output and its gradients of q, k and v with one-process ``scaled_dot_product_attention`` on
the whole tensors (each rank computes that reference itself: the shapes are tiny); it also
returns what the ring did at each step (``RingRecorder``), the ledger of every message (bytes
received, against ``costmodel.context``'s formula, and the events for ``nccl_rules.nccl_hazards``)
and the bytes autograd saved, as one ``RingParity`` record. ``gpt_report`` trains the c-rank
GPT (with data parallelism on a (d, c) grid) and one process side by side for a few steps,
as one ``GPTReport`` record.

One job: the rank side of the context-parallel checks; its length is their records.

One 4-rank launch checks c = 1, 2, 3 and 4: ranks form groups of c consecutive ranks; at
c = 3 the fourth rank is in no group, and checks that it is refused.

Laptop:  ``python -c "from lessonlib.context_parallel import ring_runs;
         print(ring_runs.run_parity(2))"``
GPU box: the same call uses NCCL when the GPUs are visible.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from lessonlib import comm, device, launcher
from lessonlib.argcheck import positive_int
from lessonlib.context_parallel.gpt import ContextParallelGPT, ContextParallelGrid, forward_backward
from lessonlib.context_parallel.layout import (LAYOUTS, check_split_divides, check_split_name,
                                               chunks_per_rank, shard_sequence, unshard_sequence)
from lessonlib.context_parallel.methods import METHODS, context_attention
from lessonlib.context_parallel.recorder import RingRecorder
from lessonlib.context_parallel.ring import ring_attention
from lessonlib.costmodel.context import ring_bytes_received_per_rank
from lessonlib.grid import ParallelContext, new_groups
from lessonlib.instruments.activations import saved_bytes
from lessonlib.models import GPTConfig, TinyGPT, lm_loss


def ring_groups(c: int):
    """Groups of c consecutive ranks: the grid's cp axis (``ParallelContext``, its cp groups
    alone) when c divides the world; otherwise over the first ranks, the last world mod c
    in none (to check that those are refused). Returns (this rank's group or None, the first
    group: None where c divides the world, as every rank has its own). Every rank must call
    it."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if world % c == 0:
        ctx = ParallelContext.build(dp=world // c, pp=1, tp=1, cp=c, only=("cp",))
        return ctx.axis("cp").group, None
    lines = [list(range(start, start + c)) for start in range(0, world - c + 1, c)]
    groups = new_groups(lines)
    mine = next((group for line, group in zip(lines, groups) if rank in line), None)
    return mine, groups[0] if groups else None


def qkv(b: int, heads: int, s: int, head_dim: int, seed: int = 0, dtype=torch.float64):
    """Full q, k, v and an upstream gradient, the same on every rank."""
    gen = torch.Generator().manual_seed(seed)
    dev = device.current_device()
    return [torch.randn(b, heads, s, head_dim, generator=gen, dtype=dtype).to(dev)
            for _ in range(4)]                                          # (b, a, s, h/a)


def _max_err(a, b) -> float:
    return (a - b).abs().max().item()


@dataclass(frozen=True)
class RingParity:
    """One rank's ring attention at one c, layout and mask against one-process SDPA: the
    largest errors of its output shard, of the gathered output and of its dq, dk, dv; the
    ring's ``steps`` (``RingRecorder`` rows); the bytes autograd saved; the K/V bytes received,
    forward and backward, against the formula; the point-to-point batches; the ledger's
    events, forward then backward (for ``nccl_rules.nccl_hazards``)."""
    rank: int
    c: int
    layout: str
    causal: bool
    output: float
    gathered_output: float
    dq: float
    dk: float
    dv: float
    steps: list
    saved_bytes: int
    received: dict
    predicted_received: dict
    batches: dict
    events: list


@dataclass(frozen=True)
class Refused:
    """A rank in no group of c: the ValueError's message ``ring_attention`` gave it."""
    refused: str | None


def attention_report(group, c: int, layout: str, causal: bool, b=2, heads=2, s=24,
                     head_dim=4, seed=0) -> RingParity:
    """Ring attention on this rank's shards against SDPA on the whole tensors."""
    q, k, v, grad = qkv(b, heads, s, head_dim, seed)
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    reference = F.scaled_dot_product_attention(*full, is_causal=causal)
    reference.backward(grad)
    shards = [shard_sequence(t, group, layout, dim=2).requires_grad_() for t in (q, k, v)]
    log = RingRecorder(s // (c * chunks_per_rank(layout)))
    with comm.ledger() as forward, saved_bytes() as saved:
        out = ring_attention(*shards, group=group, causal=causal, layout=layout, record=log)
    with comm.ledger() as backward:
        out.backward(shard_sequence(grad, group, layout, dim=2))
    block = shards[1].numel() * shards[1].element_size() * 2          # K and V
    dq, dk, dv = (_max_err(shard.grad, shard_sequence(whole.grad, group, layout, 2))
                  for shard, whole in zip(shards, full))
    return RingParity(
        rank=dist.get_rank(), c=c, layout=layout, causal=causal,
        output=_max_err(out.detach(), shard_sequence(reference.detach(), group, layout, 2)),
        gathered_output=_max_err(unshard_sequence(out.detach(), group, layout, 2),
                                 reference.detach()),
        dq=dq, dk=dk, dv=dv, steps=log.rows, saved_bytes=saved.bytes,
        received={"forward": forward.total_bytes("recv"),
                  "backward": backward.total_bytes("recv")},
        predicted_received=dict(zip(("forward", "backward"),
                                    ring_bytes_received_per_rank(c, block))),
        # the ring's point-to-point batches (the agreement check's all-gather, one per
        # call, is not recorded: ``check_same_layout``)
        batches={"forward": len({e.batch for e in forward.events if e.batch is not None}),
                 "backward": len({e.batch for e in backward.events if e.batch is not None})},
        events=forward.events + backward.events)


def attention_reports(cs=(1, 2, 3, 4), layouts=LAYOUTS, causals=(True, False), **shape) -> dict:
    """``attention_report`` for every c, layout and mask in one launch:
    {(c, layout, causal): RingParity}; a rank in no group of c reports ``Refused`` instead."""
    out = {}
    for c in cs:
        mine, first = ring_groups(c)
        for layout in layouts:
            for causal in causals:
                if mine is None:
                    q = torch.zeros(1, 1, 2 * chunks_per_rank(layout), 1)
                    out[c, layout, causal] = Refused(_refusal(
                        lambda: ring_attention(q, q, q, group=first, layout=layout)))
                else:
                    out[c, layout, causal] = attention_report(mine, c, layout, causal, **shape)
    return out


def _refusal(call) -> str | None:
    """The ValueError's message ``call()`` raises, or None if it runs."""
    try:
        call()
    except ValueError as exc:
        return str(exc)
    return None


def balance_report(s: int = 256, b: int = 1, heads: int = 2, head_dim: int = 16,
                   repeats: int = 3) -> dict:
    """Per-rank causal attention work and forward compute time, for both layouts, c = world
    (float32, the shapes a timing can see): {layout: {"work", "computed", "seconds": each the
    least of ``repeats`` rings; "cpu_s": each step's least CPU time over the repeats, summed;
    "steps": the last ring's steps on the machine's monotonic clock}}."""
    out, c = {}, dist.get_world_size()
    q, k, v, _ = qkv(b, heads, s, head_dim, dtype=torch.float32)
    for layout in LAYOUTS:
        shards = [shard_sequence(t, None, layout, dim=2) for t in (q, k, v)]
        logs = []
        for _ in range(repeats):
            dist.barrier()                        # the ranks start each ring together
            log = RingRecorder(s // (c * chunks_per_rank(layout)), origin=0.0)   # one clock
            with torch.no_grad():
                ring_attention(*shards, causal=True, layout=layout, record=log)
            logs.append(log)
        out[layout] = {what: min(log.total(what) for log in logs)
                       for what in ("work", "computed", "seconds")}
        # a step's least CPU time over the repeats, summed: one descheduling or cache flush
        # on 2 shared cores no longer inflates a whole ring's total
        per_step = [[r["cpu_s"] for r in log.rows if r["phase"] == "forward"] for log in logs]
        out[layout]["cpu_s"] = sum(map(min, zip(*per_step)))
        out[layout]["steps"] = logs[-1].rows      # the same ring on every rank: a Gantt chart
    return out


@dataclass
class GPTReport:
    """One rank's ``gpt_report``: each step's loss beside one process's, the worst first-step
    gradient and final weight errors (relative, with the parameter's name), and the bytes
    one forward saved for the backward here and in one process on this rank's b."""
    rank: int
    c: int
    d: int
    method: str
    losses: list
    reference_losses: list
    grads: tuple
    weights: tuple
    activation_bytes: int
    one_process_activation_bytes: int


def gpt_report(c: int, cfg: GPTConfig, b: int = 2, steps: int = 3, layout: str = "zigzag",
               seed: int = 0, lr: float = 0.1, method: str = "ring") -> GPTReport:
    """The c-rank GPT (d = world / c; attention by ``method``) against one process on the
    whole batch of d*b sequences, float64, SGD with momentum: losses, first-step gradients,
    final weights; and the activation bytes of one forward on this rank against one process
    on its b."""
    grid, dev = ContextParallelGrid.build(c), device.current_device()
    reference = TinyGPT(cfg, seed).double().to(dev)
    model = ContextParallelGPT(reference, grid.cp.group, layout, method)
    opts = [torch.optim.SGD(m.parameters(), lr=lr, momentum=0.9) for m in (reference, model)]
    gen = torch.Generator().manual_seed(seed + 1)
    losses, reference_losses, grads = [], [], None
    rows = grid.dp.size * b
    for step in range(steps):
        idx, targets = (torch.randint(0, cfg.vocab, (rows, cfg.seq), generator=gen).to(dev)
                        for _ in "xy")                                 # (d b, s)
        mine = [shard_sequence(t[grid.dp.rank * b:(grid.dp.rank + 1) * b], grid.cp.group, layout)
                for t in (idx, targets)]                               # (b, s/c)
        loss = lm_loss(reference(idx), targets)
        loss.backward()
        reference_losses.append(loss.item())
        losses.append(forward_backward(model, *mine))
        if step == 0:
            ref = dict(reference.named_parameters())
            grads = _worst({n: p.grad for n, p in model.gpt.named_parameters()},
                           {n: p.grad for n, p in ref.items()})
        for opt in opts:
            opt.step()
            opt.zero_grad(set_to_none=True)
    weights = _worst(dict(model.gpt.named_parameters()), dict(reference.named_parameters()))
    with saved_bytes(exclude=model.parameters()) as ours:
        model(mine[0])
    whole = idx[grid.dp.rank * b:(grid.dp.rank + 1) * b]
    with saved_bytes(exclude=reference.parameters()) as theirs:
        reference(whole)
    grid.destroy()
    return GPTReport(dist.get_rank(), c, grid.dp.size, method, losses, reference_losses, grads,
                     weights, ours.bytes, theirs.bytes)


def _worst(tensors: dict, reference: dict) -> tuple[float, str]:
    """Largest error relative to the largest reference value of all tensors, and where."""
    scale = max(r.detach().abs().max().item() for r in reference.values())
    err, name = max(((t.detach() - reference[n].detach()).abs().max().item(), n)
                    for n, t in tensors.items())
    return err / scale, name


def bad_input_report() -> dict:
    """Every bad setting raises ValueError before anything is sent: the messages, and the
    number of messages sent meanwhile (0)."""
    x = torch.zeros(1, 1, 6, 2)
    cases = {
        "s not divisible by 2c (zigzag)": lambda: shard_sequence(torch.zeros(1, 12), None,
                                                                 "zigzag", dim=1),
        "s not divisible by c (contiguous)": lambda: shard_sequence(torch.zeros(1, 6), None,
                                                                    "contiguous", dim=1),
        "odd shard in zigzag": lambda: ring_attention(x[:, :, :5], x[:, :, :5], x[:, :, :5]),
        "shards of unequal length": lambda: ring_attention(x, x[:, :, :4], x[:, :, :4]),
        "unknown layout": lambda: ring_attention(x, x, x, layout="striped"),
        "k, v of another dtype": lambda: ring_attention(x.float(), x.double(), x.double()),
        "integer tensors": lambda: ring_attention(*(x.long() for _ in "qkv")),
    }
    with comm.ledger() as book:
        messages = {name: _refusal(call) for name, call in cases.items()}
    return {"messages": messages, "messages_sent": book.count()}


def disagreement_report(s: int = 8) -> dict:
    """Ranks of the world that agree on a first call of each method, then disagree on a
    later one: the odd ranks pass the contiguous layout, or no causal mask, or other
    documents. {(method, what): the refusal this rank sees (None: it ran)}."""
    c, odd = dist.get_world_size(), dist.get_rank() % 2
    x = torch.zeros(1, c, s // c, 2, dtype=torch.float64)       # (b, heads, s/c, d)
    docs = torch.zeros(1, s, dtype=torch.long)
    docs[0, s // 2 + odd:] = 1                                  # the odd ranks: one token later
    later = {"layout": dict(layout=LAYOUTS[1 - odd]), "causal": dict(causal=not odd),
             "doc_ids": dict(doc_ids=docs)}
    refused = {}
    for method in METHODS:
        context_attention(method, x, x, x)                      # agreed: zig-zag, causal
        for what, settings in later.items():
            refused[method, what] = _refusal(lambda: context_attention(method, x, x, x,
                                                                       **settings))
    return refused


def check_ring_runs(world_size: int, cs=(), s: int = 24, layouts=LAYOUTS) -> None:
    """Raise ValueError naming the setting before any process starts."""
    positive_int("world_size", world_size, what="ranks")
    for layout in layouts:
        check_split_name(layout)
    for c in cs:
        positive_int("c", c, most=world_size, what="ranks of a context-parallel group")
        for layout in layouts:
            check_split_divides(s, c, layout)


def run_parity(world_size: int, cs=None, timeout: float = 120, **shape) -> list:
    """Check here, then launch ``attention_reports`` for c = 1..world_size."""
    cs = tuple(range(1, world_size + 1)) if cs is None else tuple(cs)
    check_ring_runs(world_size, cs, shape.get("s", 24))
    return launcher.launch(attention_reports, world_size, cs, timeout=timeout, **shape)


def run_gpt_parity(world_size: int, c: int, cfg: GPTConfig | None = None, timeout: float = 120,
                   **kwargs) -> list:
    cfg = cfg or GPTConfig(vocab=32, seq=16, hidden=16, heads=2, layers=2)
    check_ring_runs(world_size, (c,), cfg.seq, (kwargs.get("layout", "zigzag"),))
    if world_size % c:
        raise ValueError(f"c={c} must divide world_size={world_size} (d = world / c)")
    return launcher.launch(gpt_report, world_size, c, cfg, timeout=timeout, **kwargs)
