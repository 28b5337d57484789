"""Context parallelism, lessonlib against one-process attention: ring, all-gather or Ulysses
attention (``--method``) over c ranks (c = the world size), zig-zag and contiguous layouts,
K and V of ``--kv-heads`` heads (grouped-query attention; not for the ring), against PyTorch's
``scaled_dot_product_attention`` on the whole sequence in one process, and against
PyTorch's own ``torch.distributed.tensor.experimental.context_parallel`` where it runs (on CPU
ranks it stops with NotImplementedError: the record keeps the error).

Per implementation and layout it reports the median forward+backward time (the slowest
rank's; the implementations alternate step by step so machine noise hits all of them),
its ratio to one-process SDPA, the per-rank causal attention work (the (query, key) scores
each rank computed) and forward compute seconds (``RingRecorder``, the ring's), the key/value bytes
each rank received (the ring's) and the bytes each rank sent to the others (every method's,
``methods.sent_bytes``) against the formulas (``costmodel.context``), and the output's and
gradients' largest error against SDPA. Every setting is checked before any rank starts
(Ulysses: c must divide --heads and --kv-heads). The one-process SDPA runs on rank 0 alone while the other ranks
wait, so on shared CPU cores it is not slowed by them. The record's ``rows``: one per
implementation and layout, with c a column and the same metric names in every row.

Laptop:  python labs/cp.py --world-size 4 [--method allgather --kv-heads 2] [--json results/cp.json]
GPU box: torchrun --nproc-per-node 8 labs/cp.py --seq 32768 --method ulysses --heads 8
"""
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

import lessonlib
from lessonlib import comm
from lessonlib.context_parallel import context_attention, ring_attention, shard_sequence
from lessonlib.context_parallel.masks import attention, repeat_kv
from lessonlib.context_parallel.methods import METHODS, sent_bytes
from lessonlib.context_parallel.recorder import RingRecorder
from lessonlib.context_parallel.ring_runs import qkv
from lessonlib.context_parallel.torch_ref import torch_ring_attention
from lessonlib.costmodel.context import (causal_pairs_per_rank, cp_bytes_sent_per_rank,
                                         ring_bytes_received_per_rank)
from lessonlib.lab import labargs, labkit

LAYOUTS = ("zigzag", "contiguous")


def _ring_step(shards, grad, layout, causal, log=None, method="ring"):
    for t in shards:
        t.grad = None
    out = ring_attention(*shards, causal=causal, layout=layout,
                         **({"record": log} if log else {})) if method == "ring" else \
        context_attention(method, *shards, causal=causal, layout=layout)
    out.backward(grad)
    out[0, 0, 0, 0].item()
    return out


def _sdpa_step(full, grad, causal):
    if dist.get_rank() != 0:          # one process: rank 0 alone, the others wait
        return None
    for t in full:
        t.grad = None
    out = F.scaled_dot_product_attention(*full, is_causal=causal,
                                         enable_gqa=full[1].shape[1] != full[0].shape[1])
    out.backward(grad)
    return out


def worker(settings: dict) -> dict:
    c, causal, method = dist.get_world_size(), settings["causal"], settings["method"]
    b, heads, s, d = (settings[k] for k in ("batch", "heads", "seq", "head_dim"))
    q, k, v, grad = qkv(b, heads, s, d, dtype=torch.float32)
    k, v = k[:, :settings["kv_heads"]], v[:, :settings["kv_heads"]]      # GQA: fewer K/V heads
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    reference = attention(*full, causal=causal)
    reference.backward(grad)
    ref_grads = [t.grad.clone() for t in full]
    steps, rows = {}, {}
    for layout in LAYOUTS:
        shards = [shard_sequence(t, None, layout, dim=2).requires_grad_() for t in (q, k, v)]
        mine = shard_sequence(grad, None, layout, dim=2)
        log = RingRecorder(s // (c * (2 if layout == "zigzag" else 1)))
        with comm.ledger() as book:
            out = _ring_step(shards, mine, layout, causal, log if method == "ring" else None,
                             method)
        errors = [(out.detach() - shard_sequence(reference.detach(), None, layout, 2))]
        errors += [sh.grad - shard_sequence(g, None, layout, 2) for sh, g in zip(shards, ref_grads)]
        ring = method == "ring"
        rows["lessonlib", layout] = {
            "work": log.total("work") if ring else None,
            "compute_s": log.total("seconds") if ring else None,
            "kv_bytes_received": book.total_bytes("recv") if ring else None,
            "bytes_sent": sent_bytes(book.events, dist.get_rank()),
            "max_abs_error": max(e.abs().max().item() for e in errors), "times": []}
        steps["lessonlib", layout] = lambda sh=shards, g=mine, lay=layout: _ring_step(
            sh, g, lay, causal, method=method)
    rows["torch", "one process"] = {"work": s * (s + 1) // 2 if causal else s * s,
                                    "max_abs_error": 0.0, "times": []}
    steps["torch", "one process"] = lambda: _sdpa_step(full, grad, causal)
    groups = heads // settings["kv_heads"]                  # PyTorch's CP: K/V repeated
    k, v = repeat_kv(k, groups), repeat_kv(v, groups)
    theirs = torch_ring_attention(q, k, v, causal)
    rows["torch_context_parallel", "torch's"] = {
        "error": theirs.error, "times": [],
        "max_abs_error": (theirs.output - reference).abs().max().item()
        if theirs.output is not None else None}
    if theirs.output is not None:
        steps["torch_context_parallel", "torch's"] = lambda: torch_ring_attention(q, k, v, causal)
    order = list(steps)
    for i in range(settings["warmup"] + settings["steps"]):
        for key in (order if i % 2 == 0 else order[::-1]):
            elapsed = labkit.time_steps(steps[key], 1, 0)[0]
            if i >= settings["warmup"]:
                rows[key]["times"].append(elapsed)
    return {"rank": dist.get_rank(), **labkit.rank_info(), "rows": rows}


def build_record(ranks: list[dict], settings: dict, world_size: int) -> dict:
    c, s, ring = world_size, settings["seq"], settings["method"] == "ring"
    block = 2 * settings["batch"] * settings["heads"] * (s // c) * settings["head_dim"] * 4
    forward, backward = ring_bytes_received_per_rank(c, block)
    sent = sum(cp_bytes_sent_per_rank(settings["method"], c, settings["batch"], s,
                                      settings["heads"], settings["kv_heads"],
                                      settings["head_dim"], bytes_per_value=4))
    results, rows = {}, []
    sdpa = None
    for (name, layout) in ranks[0]["rows"]:
        per_rank = [r["rows"][name, layout] for r in ranks]
        times = [max(step) for step in zip(*(r["times"] for r in per_rank))]
        ours = name == "lessonlib"
        row = {"implementation": name, "layout": layout, "c": c,
               "method": settings["method"] if ours else None,
               "step_time_s": labkit.median(times) if times else None,
               "max_abs_error": max((r["max_abs_error"] for r in per_rank
                                     if r["max_abs_error"] is not None), default=None),
               "work_per_rank": [r.get("work") for r in per_rank] if ours and ring else None,
               "work_predicted": causal_pairs_per_rank(s, c, layout, settings["causal"])
               if ours and ring else None,
               "compute_s_per_rank": [r.get("compute_s") for r in per_rank]
               if ours and ring else None,
               "kv_bytes_received_per_rank": [r.get("kv_bytes_received") for r in per_rank]
               if ours and ring else None,
               "kv_bytes_predicted": forward + backward if ours and ring else None,
               "bytes_sent_per_rank": [r.get("bytes_sent") for r in per_rank] if ours else None,
               "bytes_sent_predicted": sent if ours else None,
               "error": per_rank[0].get("error")}
        if ours and ring:
            work = row["work_per_rank"]
            row["work_max_over_min"] = max(work) / min(work)
        if name == "torch":
            sdpa = row["step_time_s"]
        rows.append(row)
        results.setdefault(name, {"step_time_s": row["step_time_s"], "layouts": {}})
        results[name]["layouts"][layout] = row
    for row in rows:
        row["step_time_over_one_process"] = (row["step_time_s"] / sdpa
                                             if row["step_time_s"] and sdpa else None)
    record = labkit.result("cp", world_size, settings, results, ranks[0],
                           labkit.stable_rows(rows), HEADLINE)
    starter = (f"torchrun --nproc-per-node {world_size}" if lessonlib.launcher.under_torchrun()
               else "python")
    record["command"] = " ".join([starter, "labs/cp.py", *sys.argv[1:]])
    return record


HEADLINE = labkit.headline("step_time_s", x="c", series=["implementation", "layout"])


def check_settings(p, args) -> dict:
    labargs.check_positive(p, args, "world-size", "steps", "batch", "seq", "heads", "head-dim")
    if args.warmup < 0:
        p.error(f"--warmup must be 0 or more; got {args.warmup}")
    labargs.check_fits(p, args, "each of q, k, v and the output (b a s h/a floats)",
                      [("--batch", args.batch), ("--heads", args.heads), ("--seq", args.seq),
                       ("--head-dim", args.head_dim)])
    labargs.check_fits(p, args, "the one-process reference's attention scores under its s x s "
                               "mask (b a s^2 floats)",
                      [("--batch", args.batch), ("--heads", args.heads), ("--seq", args.seq),
                       ("--seq", args.seq)])
    if args.seq % (2 * args.world_size):
        p.error(f"--seq {args.seq} must be a multiple of 2c = {2 * args.world_size} (the "
                f"zig-zag layout cuts it into 2c equal chunks, c = the world size)")
    kv_heads = args.heads if args.kv_heads is None else args.kv_heads
    if kv_heads < 1 or args.heads % kv_heads:
        p.error(f"--kv-heads {kv_heads} must divide --heads {args.heads} (each key head serves "
                f"heads/kv_heads query heads), e.g. --kv-heads {args.heads}")
    if args.method == "ring" and kv_heads != args.heads:
        p.error(f"--kv-heads {kv_heads}: --method ring takes K and V of all --heads "
                f"{args.heads}; use --method allgather or ulysses for grouped-query attention")
    for flag, count in (("--heads", args.heads), ("--kv-heads", kv_heads)):
        if args.method == "ulysses" and count % args.world_size:
            p.error(f"{flag} {count} must be a multiple of c = {args.world_size} under "
                    f"--method ulysses (it splits the heads over the c ranks)")
    return {"method": args.method, "batch": args.batch, "seq": args.seq, "heads": args.heads,
            "kv_heads": kv_heads, "head_dim": args.head_dim, "causal": not args.no_causal,
            "steps": args.steps, "warmup": args.warmup}


def main(argv=None):
    p = labargs.parser("cp", __doc__.splitlines()[0])
    p.set_defaults(steps=10, warmup=2)
    p.add_argument("--batch", type=int, default=1, help="b, sequences")
    p.add_argument("--seq", type=int, default=512, help="s, tokens per sequence")
    p.add_argument("--method", default="ring", choices=list(METHODS),
                   help="context-parallel attention: ring, all-gather (Llama 3) or Ulysses")
    p.add_argument("--heads", type=int, default=4, help="a, attention heads")
    p.add_argument("--kv-heads", type=int, default=None,
                   help="K and V heads (grouped-query attention; default: --heads)")
    p.add_argument("--head-dim", type=int, default=32, help="h/a, dims per head")
    p.add_argument("--no-causal", action="store_true", help="attend to every token")
    args = labkit.parse(p, argv, fp32_only="the errors are read against float32 SDPA")
    settings = check_settings(p, args) | {"dtype": args.dtype}
    record = build_record(labkit.on_ranks(worker, args, settings), settings, args.world_size)
    return labkit.emit(record, args.json)


if __name__ == "__main__":
    main()
