"""The three context-parallel attentions checked for real, side by side: what the tests,
notebook 12 and ``labs/cp.py --method`` launch.

What it teaches: ring, all-gather and Ulysses are the same attention. ``method_report``
(a ``MethodReport``) runs one method on this rank's shards of q, k, v built from one seed (float64; k and v with
fewer heads under GQA; an optional document mask of uneven documents) and compares its
output and its gradients of q, k and v with one-process attention on the whole tensors
(``masks.attention``: PyTorch's ``scaled_dot_product_attention`` under the same mask). It
also returns the bytes the rank sent to the others, forward and backward, by its ledger
(``methods.sent_bytes``) next to ``costmodel.context``'s formula, and the events for
``nccl_rules.nccl_hazards``. ``method_reports`` runs every case in one launch; ``time_report``
times each method's forward and backward on one shape, ``run_times`` gathers the ranks'
times into one ``MethodTime`` per method (CPU ranks: the time is mostly Python
and the machine's other load; read the bytes and the work, not the seconds, as the lesson).

Laptop:  ``python -c "from lessonlib.context_parallel import method_runs as m; \\
          print(m.run_parity(2)[0])"``
GPU box: the same call uses NCCL when the GPUs are visible.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from lessonlib import comm, launcher
from lessonlib.argcheck import positive_int
from lessonlib.context_parallel.layout import LAYOUTS, check_split_divides
from lessonlib.context_parallel.layout import shard_sequence, unshard_sequence
from lessonlib.context_parallel.masks import attention
from lessonlib.context_parallel.methods import METHODS, check_method, context_attention, sent_bytes
from lessonlib.context_parallel.ring_runs import _max_err, _refusal, qkv, ring_groups
from lessonlib.context_parallel.ulysses import check_divides_heads
from lessonlib.costmodel.context import cp_bytes_sent_per_rank

DOCS = (5, 11, 8)    # uneven documents packed in one sequence of 24 tokens


def heads_for(c: int) -> int:
    """Query heads every method can split at c (Ulysses: c | heads and c | heads/2)."""
    return 2 * max(2, c)


def doc_ids_of(lengths, b: int, s: int, device=None):
    """(b, s) document numbers: ``lengths`` packed from the start, the rest one more doc."""
    ids = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])
    ids = torch.cat([ids, torch.full((s - len(ids),), len(lengths))])[:s]
    return ids.expand(b, s).contiguous().to(device)


@dataclass(frozen=True)
class ForwardBackward:
    """One quantity of the forward pass and of the backward pass."""
    forward: object
    backward: object


@dataclass(frozen=True)
class MethodReport:
    """One method on one rank against one-process attention: the case (c, method, layout,
    mask, heads, K/V heads, documents); the largest errors of this rank's output shard, of
    the gathered output and of the gradients of q, k and v; the bytes it sent against the
    formula's, the ledgers' summaries and every event, forward then backward."""
    rank: int
    c: int
    method: str
    layout: str
    causal: bool
    heads: int
    kv_heads: int
    docs: tuple | None
    output: float
    gathered_output: float
    dq: float
    dk: float
    dv: float
    sent: ForwardBackward
    predicted_sent: ForwardBackward
    calls: ForwardBackward
    events: list


def method_report(group, c: int, method: str, layout: str = "zigzag", causal: bool = True,
                  gqa: bool = False, docs=None, b=2, s=24, head_dim=4, heads=None,
                  seed=0) -> MethodReport:
    """One method on this rank's shards against one process on the whole tensors."""
    heads = heads or heads_for(c)
    kv_heads = heads // 2 if gqa else heads
    q, k, v, grad = qkv(b, heads, s, head_dim, seed)
    k, v = k[:, :kv_heads], v[:, :kv_heads]
    doc_ids = doc_ids_of(docs, b, s, q.device) if docs else None
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    reference = attention(*full, causal=causal, doc_ids=doc_ids)
    reference.backward(grad)
    shards = [shard_sequence(t, group, layout, dim=2).requires_grad_() for t in (q, k, v)]
    with comm.ledger() as forward:
        out = context_attention(method, *shards, group=group, causal=causal, layout=layout,
                                doc_ids=doc_ids)
    with comm.ledger() as backward:
        out.backward(shard_sequence(grad, group, layout, dim=2))
    rank = dist.get_rank()
    dq, dk, dv = (_max_err(shard.grad, shard_sequence(whole.grad, group, layout, 2))
                  for shard, whole in zip(shards, full))
    predicted = cp_bytes_sent_per_rank(method, c, b, s, heads,
                                       heads if method == "ring" else kv_heads, head_dim,
                                       bytes_per_value=8)  # the ring's blocks carry every head
    return MethodReport(
        rank=rank, c=c, method=method, layout=layout, causal=causal, heads=heads,
        kv_heads=kv_heads, docs=docs,
        output=_max_err(out.detach(), shard_sequence(reference.detach(), group, layout, 2)),
        gathered_output=_max_err(unshard_sequence(out.detach(), group, layout, 2),
                                 reference.detach()),
        dq=dq, dk=dk, dv=dv,
        sent=ForwardBackward(forward=sent_bytes(forward.events, rank),
                             backward=sent_bytes(backward.events, rank)),
        predicted_sent=ForwardBackward(*predicted),
        calls=ForwardBackward(forward=forward.summary(), backward=backward.summary()),
        events=forward.events + backward.events)


def cases(methods=METHODS, layouts=LAYOUTS, causals=(True, False)):
    """(method, layout, causal, gqa, docs) for every layout and mask, each plain and with
    the document mask, GQA with it."""
    return [(method, layout, causal, *kind)
            for method, layout, causal in itertools.product(methods, layouts, causals)
            for kind in [(False, None), (True, DOCS)]]


def method_reports(cs=(1, 2, 3, 4), methods=METHODS, **shape) -> dict:
    """``method_report`` for every c and case in one launch: {(c, *case): MethodReport}; ranks
    in no group of c report nothing for it."""
    out = {}
    for c in cs:
        mine, _ = ring_groups(c)
        for case in cases(methods):
            if mine is not None:
                out[(c, *case)] = method_report(mine, c, *case, **shape)
    return out


@dataclass(frozen=True)
class RankTime:
    """One method's forward+backward on one rank: the least seconds of the repeats (each the
    slowest rank's), the bytes this rank sent, the K/V heads its messages carry."""
    rank: int
    method: str
    c: int
    seconds: float
    sent: int
    kv_heads_moved: int


@dataclass(frozen=True)
class MethodTime:
    """One method's forward+backward over the world: ``seconds`` the slowest rank's (the
    ranks agree), ``sent`` the bytes each rank sent, in rank order."""
    method: str
    c: int
    seconds: float
    sent: list
    kv_heads_moved: int


def time_report(method: str, b: int = 1, heads: int = 8, kv_heads: int = 2, s: int = 512,
                head_dim: int = 32, causal: bool = True, docs=None, repeats: int = 5) -> RankTime:
    """One method's forward+backward over the world (float32): the least seconds of
    ``repeats`` (the slowest rank's), and the bytes this rank sent. Under GQA the ring
    repeats K and V to all heads first, and its blocks carry them all (``kv_heads_moved``)."""
    c, rank = dist.get_world_size(), dist.get_rank()
    q, k, v, grad = qkv(b, heads, s, head_dim, dtype=torch.float32)
    k, v = k[:, :kv_heads], v[:, :kv_heads]
    kv_heads = heads if method == "ring" else kv_heads      # the ring repeats them to all
    doc_ids = doc_ids_of(docs, b, s, q.device) if docs else None
    shards = [shard_sequence(t, None, "zigzag", dim=2).requires_grad_() for t in (q, k, v)]
    mine = shard_sequence(grad, None, "zigzag", dim=2)
    seconds, sent = [], 0
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        with comm.ledger() as book:
            context_attention(method, *shards, causal=causal, doc_ids=doc_ids).backward(mine)
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        comm.all_reduce(elapsed, op=dist.ReduceOp.MAX)   # outside the ledger: not counted
        seconds.append(elapsed.item())
        sent = sent_bytes(book.events, rank)
    return RankTime(rank=rank, method=method, c=c, seconds=min(seconds), sent=sent,
                    kv_heads_moved=kv_heads)


def time_reports(methods=METHODS, **shape) -> dict:
    """``time_report`` for each method, the methods taking turns: {method: RankTime}."""
    return {method: time_report(method, **shape) for method in methods}


def bad_input_report() -> dict:
    """Bad settings over the world's group raise one ValueError each before anything is
    sent: {"messages": {case: message}, "messages_sent": 0}."""
    c = dist.get_world_size()
    x = torch.zeros(1, 2 * c, 4, 2, dtype=torch.float64)              # (b, heads, s/c, d)
    odd = torch.zeros(1, 2 * c + 1, 4, 2, dtype=torch.float64)
    docs = torch.zeros(1, 4 * c, dtype=torch.long)
    cases = {
        "heads not divisible by c": lambda: context_attention("ulysses", odd, odd, odd),
        "kv heads not divisible by c (c > 2)": lambda: context_attention("ulysses", x, x[:, :2],
                                                                         x[:, :2]),
        "kv heads not dividing heads": lambda: context_attention("allgather", x, x[:, :3],
                                                                 x[:, :3]),
        "doc_ids of the wrong shape": lambda: context_attention("allgather", x, x, x,
                                                                doc_ids=docs[:, 1:]),
        "doc_ids of the wrong dtype": lambda: context_attention("ring", x, x, x,
                                                                doc_ids=docs.float()),
        "doc_ids not a tensor": lambda: context_attention("ulysses", x, x, x,
                                                          doc_ids=[[0] * 4 * c]),
        "unknown method": lambda: context_attention("tree", x, x, x),
    }
    with comm.ledger() as book:
        messages = {name: _refusal(call) for name, call in cases.items()}
    return {"c": c, "messages": messages, "messages_sent": book.count()}


def check_method_runs(world_size: int, cs=(), methods=METHODS, s: int = 24, heads=None,
                   kv_heads=None) -> None:
    """Raise ValueError naming the setting before any process starts."""
    positive_int("world_size", world_size, what="ranks")
    for method in methods:
        check_method(method)
    for c in cs:
        positive_int("c", c, most=world_size, what="ranks of a context-parallel group")
        check_split_divides(s, c, "zigzag")
        if "ulysses" in methods and heads is not None:
            check_divides_heads(heads, kv_heads or heads, c)


def run_times(world_size: int, methods=METHODS, timeout: float = 300, **shape) -> dict:
    """Check here, then launch ``time_reports`` with c = world_size: {method: MethodTime}."""
    heads, kv_heads = shape.get("heads", 8), shape.get("kv_heads", 2)
    check_method_runs(world_size, (world_size,), methods, shape.get("s", 512), heads, kv_heads)
    ranks = launcher.launch(time_reports, world_size, methods, timeout=timeout, **shape)
    return {m: MethodTime(method=m, c=world_size, seconds=max(r[m].seconds for r in ranks),
                          sent=[r[m].sent for r in ranks],
                          kv_heads_moved=ranks[0][m].kv_heads_moved)
            for m in methods}


def run_parity(world_size: int, cs=None, methods=METHODS, timeout: float = 120,
               **shape) -> list:
    """Check here, then launch ``method_reports`` for c = 1..world_size."""
    cs = tuple(range(1, world_size + 1)) if cs is None else tuple(cs)
    check_method_runs(world_size, cs, methods, shape.get("s", 24))
    return launcher.launch(method_reports, world_size, cs, methods, timeout=timeout, **shape)
