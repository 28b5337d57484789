"""Data-parallel training, timed: lessonlib's DDP ladder against PyTorch's DDP.

What it teaches: what buckets and overlap buy. Every rank trains the same GPT (10.7 M
parameters by default) on its shard of each batch, with lessonlib's bucketed
``DataParallel`` (rung d), the naive rung (a: one blocking all-reduce per gradient after
backward) and ``torch.nn.parallel.DistributedDataParallel``, taking turns, and reports each
one's median step time (slowest rank), throughput and bytes all-reduced per step. Each
rung is also checked against one process: the tiny GPT, 2 AdamW steps from different
random weights on every rank, in float32 (``max_weight_diff_vs_one_process``). With
``--sweep`` it repeats over world sizes and reports weak-scaling efficiency:
throughput(n) / (n x throughput(1)), the per-rank batch staying fixed.

Laptop:  ``python labs/ddp.py --world-size 2 --json results/ddp.json``
         ``python labs/ddp.py --sweep --world-sizes 1,2,4 --json results/ddp_sweep.json``
GPU box: ``torchrun --nproc-per-node 8 labs/ddp.py --batch 16 --json results/ddp.json``
         (NCCL, one GPU per rank; several nodes: add ``--nnodes`` and a rendezvous endpoint)
"""
from __future__ import annotations

import sys
from dataclasses import asdict

import torch.distributed as dist

import lessonlib
from lessonlib import launcher
from lessonlib.costmodel.comm import ring_allreduce_bytes_per_rank
from lessonlib.data_parallel.bench import ddp_bench, slowest_rank_median
from lessonlib.data_parallel.ladder_runs import RUNGS, train_replicas, train_single
from lessonlib.lab import labargs, labkit
from lessonlib.models import TEN_M, TINY

MODELS = {"10M": TEN_M, "tiny": TINY}
PARITY = {"steps": 2, "cfg": TINY}     # the one-process check: its sharded global batch is 2n
# float32, the all-reduce summing in another order and, on a GPU, other kernels than the CPU
# reference's: 3e-6 measured on CPU ranks; a missed or unaveraged sync is off by ~lr = 3e-3
PARITY_TOLERANCE = 1e-4
NAMES = {"bucketed": "lessonlib", "naive": "lessonlib_naive", "flat": "lessonlib_flat",
         "async": "lessonlib_async", "torch": "torch"}


def worker(rungs, cfg, dtype: str, **timing) -> dict:
    """One rank: the rungs timed (in ``dtype``), then each trained as in the one-process
    check (float32, the tiny GPT: the check is about the sums, not the size)."""
    out = labkit.in_dtype(ddp_bench, dtype)(rungs, cfg, **timing)
    n = dist.get_world_size()
    out["parity_weights"] = {rung: train_replicas(rung, global_batch=2 * n, **PARITY)
                             .weights.cpu() for rung in rungs}
    return out


def compare_parity(ranks: list[dict]) -> dict[str, float]:
    """Each rung's largest weight difference from one process on the whole batch, over the
    ranks; raises, naming the rung and the rank, beyond float32's rounding."""
    want = train_single(global_batch=2 * len(ranks), **PARITY).weights
    diffs = {}
    for rung in ranks[0]["parity_weights"]:
        per_rank = [(r["parity_weights"][rung] - want).abs().max().item() for r in ranks]
        bad = [i for i, d in enumerate(per_rank) if not d <= PARITY_TOLERANCE]
        if bad:
            raise AssertionError(f"rung {rung}, rank {bad[0]}: weights differ from one process "
                                 f"by {per_rank[bad[0]]:.3g} after {PARITY['steps']} steps "
                                 f"(float32 allows {PARITY_TOLERANCE:g})")
        diffs[rung] = max(per_rank)
    return diffs


def summarize(ranks: list[dict], batch: int, seq: int) -> dict:
    n = len(ranks)
    out, diffs = {}, compare_parity(ranks)
    for rung in ranks[0]["runs"]:
        t = slowest_rank_median([r["runs"][rung]["times"] for r in ranks])
        ledger = ranks[0]["runs"][rung]["ledger"].get("all_reduce", {})
        grad_bytes = ranks[0]["gradient_bytes"]
        entry = {"rung": RUNGS[rung], "step_time_s": t, "samples_per_s": n * batch / t,
                 "tokens_per_s": n * batch * seq / t,
                 "gradient_bytes_per_step": grad_bytes,
                 "wire_bytes_per_rank_theory": ring_allreduce_bytes_per_rank(n, grad_bytes),
                 "max_weight_diff_vs_one_process": diffs[rung]}
        if rung != "torch":            # PyTorch's DDP sends from C++, out of the ledger's sight
            entry["all_reduces_per_step"] = ledger.get("calls", 0)
            entry["bytes_all_reduced_per_step"] = ledger.get("bytes", 0)
        out[NAMES[rung]] = entry
    return out


def measure(n, args) -> list[dict]:
    return lessonlib.run(worker, n, args.rungs, MODELS[args.model], args.dtype,
                         batch=args.batch, steps=args.steps,
                         warmup=args.warmup, rounds=args.rounds,
                         bucket_cap_mb=args.bucket_cap_mb, timeout=args.timeout)


def check_settings(p, args) -> dict:
    labargs.check_positive(p, args, "world-size", "steps", "batch", "rounds")
    if args.warmup < 0:
        p.error(f"--warmup must be 0 or more; got {args.warmup}")
    if not args.bucket_cap_mb > 0:
        p.error(f"--bucket-cap-mb must be a positive number of MiB (PyTorch uses 25); "
                f"got {args.bucket_cap_mb}")
    cfg = MODELS[args.model]
    labargs.check_fits(p, args, f"the activations of a step of the {args.model} model (b s h "
                               f"L floats)", [("--batch", args.batch)],
                      itemsize=4 * cfg.seq * cfg.hidden * cfg.layers)
    args.rungs = [r.strip() for r in args.rungs.split(",") if r.strip()]
    if not args.rungs or any(r not in RUNGS for r in args.rungs):
        p.error(f"--rungs {args.rungs}: choose from {','.join(RUNGS)}")
    try:
        args.world_sizes = sorted({int(w) for w in args.world_sizes.split(",")})
    except ValueError:
        p.error(f"--world-sizes must be comma-separated integers, e.g. 1,2,4; "
                f"got {args.world_sizes}")
    if args.world_sizes[0] < 1:
        p.error(f"--world-sizes must all be >= 1; got {args.world_sizes}")
    args.sweep = args.sweep and not launcher.under_torchrun()
    if args.sweep:
        labargs.check_world_sizes(p, "--world-sizes", args.world_sizes, args.backend)
    return {"model": args.model, "config": asdict(MODELS[args.model]),
            "batch_per_rank": args.batch, "bucket_cap_mb": args.bucket_cap_mb,
            "steps": args.steps, "rounds": args.rounds, "command": args.command}


def measure_all(args, settings: dict) -> dict:
    """One launch at the world size, or (``--sweep``) one per ``--world-sizes``."""
    cfg = MODELS[args.model]
    if not args.sweep:
        ranks = measure(args.world_size, args)
        return {"ranks": ranks, "results": summarize(ranks, args.batch, cfg.seq)}
    by_n = {}
    for w in args.world_sizes:
        ranks = measure(w, args)
        by_n[w] = summarize(ranks, args.batch, cfg.seq)
    settings["world_sizes"] = args.world_sizes
    return {"ranks": ranks, "by_n": by_n}


def build_record(measured: dict, settings: dict, world_size: int) -> dict:
    ranks = measured["ranks"]
    settings["parameters"] = ranks[0]["parameters"]
    if "by_n" not in measured:
        results = measured["results"]
        record = labkit.result("ddp", len(ranks), settings, results, ranks[0]["info"])
        if "lessonlib" in results and "torch" in results:
            record["lessonlib_vs_torch_step_time"] = (results["lessonlib"]["step_time_s"]
                                                      / results["torch"]["step_time_s"])
        if "lessonlib" in results and "lessonlib_naive" in results:
            record["naive_vs_lessonlib_step_time"] = (results["lessonlib_naive"]["step_time_s"]
                                                      / results["lessonlib"]["step_time_s"])
    else:
        by_n, world_sizes = measured["by_n"], settings["world_sizes"]
        results = {}
        for name in by_n[world_sizes[0]]:
            base = by_n[world_sizes[0]][name]["samples_per_s"] / world_sizes[0]
            results[name] = {"by_world_size": {str(w): by_n[w][name] for w in world_sizes},
                             "scaling_efficiency": {str(w): by_n[w][name]["samples_per_s"]
                                                    / (w * base) for w in world_sizes}}
        record = labkit.result("ddp", world_sizes[-1], settings, results, ranks[0]["info"])
    record["rows"], record["headline"] = table(record), HEADLINE
    return record


HEADLINE = labkit.headline("samples_per_s", x="world_size", series=["implementation"])
METRICS = ("rung", "step_time_s", "samples_per_s", "tokens_per_s", "gradient_bytes_per_step",
           "wire_bytes_per_rank_theory", "all_reduces_per_step", "bytes_all_reduced_per_step",
           "max_weight_diff_vs_one_process")


def table(record: dict) -> list[dict]:
    """The record as rows with stable columns: one per implementation (and world size, for a
    ``--sweep``), the world size a column."""
    rows = []
    for name, result in record["results"].items():
        runs = result.get("by_world_size") or {str(record["world_size"]): result}
        for w, entry in runs.items():
            torch_time = (record["results"].get("torch", {}).get("by_world_size", {})
                          .get(w, record["results"].get("torch", {})).get("step_time_s"))
            rows.append({"implementation": name, "world_size": int(w),
                         **{k: entry.get(k) for k in METRICS},
                         "step_time_over_torch": entry["step_time_s"] / torch_time
                         if torch_time and name != "torch" else None,
                         "scaling_efficiency": result.get("scaling_efficiency", {}).get(w)})
    return rows


def main(argv=None):
    p = labargs.parser("ddp", "Time lessonlib's data parallelism against PyTorch's DDP.")
    p.add_argument("--rungs", default="bucketed,naive,torch",
                   help=f"comma-separated, from {','.join(RUNGS)}")
    p.add_argument("--model", default="10M", choices=list(MODELS))
    p.add_argument("--batch", type=int, default=4, help="sequences per rank per step")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0)
    p.add_argument("--rounds", type=int, default=2, help="turns the rungs take")
    p.add_argument("--sweep", action="store_true", help="all --world-sizes: scaling efficiency")
    p.add_argument("--world-sizes", default="1,2,4")
    p.set_defaults(command="python labs/ddp.py " + " ".join(sys.argv[1:] if argv is None
                                                              else argv))
    args = labkit.parse(p, argv)
    settings = check_settings(p, args) | {"dtype": args.dtype}
    record = build_record(measure_all(args, settings), settings, args.world_size)
    return labkit.emit(record, args.json)


if __name__ == "__main__":
    main()
