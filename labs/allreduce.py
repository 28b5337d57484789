"""The course's own nccl-tests: hand-written all-reduces against dist.all_reduce.

What it teaches: why the ring replaced the parameter server. For each world size and
message size it times the bandwidth-optimal ring, the naive ring, the parameter server and
``dist.all_reduce`` (gloo's or NCCL's ring in C++), reports bus bandwidth as nccl-tests
defines it (busbw = S/t x 2(n-1)/n, doc/PERFORMANCE.md), checks the bytes each rank sent
(from the ledger) against the theory (ring: 2(n-1)/n x S; the server's link: 2(n-1) x S),
and, with ``--sweep``, fits the alpha-beta model to all the measurements twice: with a link
per rank (``fit``, a cluster's case) and with one medium all ranks share (``fit_shared``,
CPU ranks on one machine).

On CPU ranks the hand-written ring reaches about gloo's own bus bandwidth. On a GPU server
(an estimate, not a measurement: no multi-GPU machine was at hand) expect it at roughly
0.3-0.6x NCCL's for 256 MiB on 8 GPUs and below 0.1x under 1 MiB: NCCL fuses the sends, the
additions and the pipelining in one kernel, while each of the ring's 2(n-1) steps here is a
send/receive group, an addition kernel and tens of microseconds of Python.

Laptop:  ``python labs/allreduce.py --world-size 4 --size-mb 16 --json results/allreduce.json``
         ``python labs/allreduce.py --sweep --world-sizes 2,4,8 --json results/sweep.json``
GPU box: ``torchrun --nproc-per-node 8 labs/allreduce.py --size-mb 256`` (NCCL; under
         torchrun a sweep covers message sizes at the launched world size)
"""
from __future__ import annotations

import sys
from dataclasses import asdict

import lessonlib
from lessonlib import launcher
from lessonlib.costmodel.alpha_beta import LINKS, fit_alpha_beta, predict_from_fit
from lessonlib.costmodel.comm import (bus_bandwidth, parameter_server_bytes,
                                      ring_allreduce_bytes_per_rank)
from lessonlib.data_parallel.bench import (ALL_ALGORITHMS, BenchRun, allreduce_bench,
                                           slowest_rank_median)
from lessonlib.lab import labargs, labkit

GB = 1e9


def summarize(ranks: list[BenchRun], size: int, n: int) -> dict:
    """One size's per-algorithm record from every rank's ``allreduce_bench`` output."""
    out = {}
    for name in ranks[0].sizes[size]:
        rows = [r.sizes[size][name] for r in ranks]
        t = slowest_rank_median([row.times for row in rows])
        entry = {"time_s": t, "algbw_GBps": size / t / GB,
                 "busbw_GBps": bus_bandwidth("all_reduce", n, size, t) / GB,
                 "max_error": max(row.max_error for row in rows),
                 "timed_calls": len(rows[0].times)}
        if name != "torch":            # the ledger sees lessonlib's messages, not gloo's own
            sent = [row.bytes_sent for row in rows]
            entry["bytes_sent_per_rank"] = sent
            if name == "ring":
                entry["bytes_theory_per_rank"] = ring_allreduce_bytes_per_rank(n, size)
            if name == "naive_ring":
                entry["bytes_theory_per_rank"] = (n - 1) * size
            if name == "parameter_server":
                entry["server_link_bytes"] = rows[0].bytes_sent + rows[0].bytes_received
                entry["server_link_bytes_theory"] = parameter_server_bytes(n, size)
        out[name] = entry
    return out


def measure(n: int, sizes: list[int], args) -> list[BenchRun]:
    return lessonlib.run(allreduce_bench, n, sizes, args.algorithms, budget_s=args.budget_s,
                         min_iters=min(3, args.steps), max_iters=args.steps, timeout=args.timeout)


def check_settings(p, args) -> dict:
    labargs.check_positive(p, args, "world-size", "steps")
    args.algorithms = [a.strip() for a in args.algorithms.split(",") if a.strip()]
    bad = [a for a in args.algorithms if a not in ALL_ALGORITHMS]
    if bad or not args.algorithms:
        p.error(f"--algorithms: unknown {bad}; choose from {','.join(ALL_ALGORITHMS)}")
    if not args.size_mb > 0 or not args.budget_s > 0:
        p.error(f"--size-mb ({args.size_mb}) and --budget-s ({args.budget_s}) must be positive")
    try:
        args.world_sizes = [int(w) for w in args.world_sizes.split(",")]
        args.sizes = [int(float(kb) * 1024) for kb in args.sizes_kb.split(",")]
    except (ValueError, OverflowError):    # not a number, NaN, or inf
        p.error(f"--world-sizes ({args.world_sizes}) and --sizes-kb ({args.sizes_kb}) must be "
                f"comma-separated numbers, e.g. 2,4,8 and 1,1024")
    if min(args.world_sizes) < 1 or min(args.sizes) < 4:
        p.error("--world-sizes must be >= 1 and --sizes-kb at least 0.004 (one float)")
    if args.sweep:
        labargs.check_world_sizes(p, "--world-sizes", args.world_sizes, args.backend)
        labargs.check_fits(p, args, "the largest message and its receive buffer",
                          [("--sizes-kb", max(args.sizes) / 1024)], itemsize=2 * 1024)
    else:
        labargs.check_fits(p, args, "the message and its receive buffer",
                          [("--size-mb", args.size_mb)], itemsize=2 * 2 ** 20)
    if not args.sweep:
        return {"size_bytes": int(args.size_mb * 2 ** 20) // 4 * 4,
                "algorithms": args.algorithms, "command": args.command}
    return {"sizes_bytes": args.sizes, "algorithms": args.algorithms,
            "budget_s": args.budget_s, "command": args.command}


def measure_all(args, settings: dict) -> dict:
    """One launch at one message size, or (``--sweep``) every world size x size."""
    if not args.sweep:
        ranks = measure(args.world_size, [settings["size_bytes"]], args)
        return {"info": ranks[0].info,
                "results": summarize(ranks, settings["size_bytes"], len(ranks))}
    # under torchrun the world size is fixed: a sweep covers the message sizes only
    world_sizes = [None] if launcher.under_torchrun() else args.world_sizes
    points = {name: [] for name in args.algorithms}
    for w in world_sizes:
        ranks = measure(w or 1, args.sizes, args)
        n, info = len(ranks), ranks[0].info
        for size in args.sizes:
            for name, entry in summarize(ranks, size, n).items():
                points[name].append({"world_size": n, "size_bytes": size, **entry})
    return {"info": info, "points": points}


def build_record(measured: dict, settings: dict, world_size: int) -> dict:
    if "points" not in measured:
        results = measured["results"]
        record = labkit.result("allreduce", world_size, settings, results, measured["info"])
        if "ring" in results and "torch" in results and world_size > 1:
            record["ring_vs_torch_busbw"] = (results["ring"]["busbw_GBps"]
                                             / results["torch"]["busbw_GBps"])
    else:
        results = {}
        for name, pts in measured["points"].items():
            usable = [(q["world_size"], q["size_bytes"], q["time_s"])
                      for q in pts if q["world_size"] > 1]
            fits = {links: asdict(fit_alpha_beta(usable, name, links)) if len(usable) >= 2 else None
                    for links in LINKS}
            results[name] = {"points": pts, "fit": fits["dedicated"],
                             "fit_shared": fits["shared"]}
        first = measured["points"][settings["algorithms"][0]]
        settings = {"world_sizes": sorted({q["world_size"] for q in first}), **settings}
        record = labkit.result("allreduce", max(settings["world_sizes"]), settings, results,
                               measured["info"])
    record["rows"], record["headline"] = table(record), HEADLINE
    return record


HEADLINE = labkit.headline("time_s", x="size_bytes", series=["implementation", "world_size"],
                           predicted="time_s_fit")
METRICS = ("time_s", "algbw_GBps", "busbw_GBps", "max_error", "bytes_sent_per_rank",
           "bytes_theory_per_rank", "server_link_bytes", "server_link_bytes_theory")


def table(record: dict) -> list[dict]:
    """The record as rows with stable columns: one per algorithm, world size and message
    size, with the alpha-beta fit's time where a ``--sweep`` made one (the fit for one
    shared medium on CPU ranks, for a link per rank on GPUs)."""
    rows = []
    for name, result in record["results"].items():
        points = result.get("points") or [{"world_size": record["world_size"],
                                           "size_bytes": record["settings"]["size_bytes"],
                                           **result}]
        fit = result.get("fit_shared" if record["device"] == "cpu" else "fit")
        for q in points:
            fitted = (predict_from_fit(name, q["world_size"], q["size_bytes"], fit)
                      if fit and q["world_size"] > 1 else None)
            rows.append({"implementation": name, "world_size": q["world_size"],
                         "size_bytes": q["size_bytes"], **{k: q.get(k) for k in METRICS},
                         "time_s_fit": fitted})
    return rows


def main(argv=None):
    p = labargs.parser("allreduce", "Time hand-written all-reduces against dist.all_reduce.")
    p.add_argument("--size-mb", type=float, default=16.0, help="message size in MiB")
    p.add_argument("--algorithms", default=",".join(ALL_ALGORITHMS),
                   help=f"comma-separated, from {','.join(ALL_ALGORITHMS)}")
    p.add_argument("--budget-s", type=float, default=3.0,
                   help="about how long to time each message size (at least 3 calls each)")
    p.add_argument("--sweep", action="store_true",
                   help="all --world-sizes x --sizes-kb, with an alpha-beta fit")
    p.add_argument("--world-sizes", default="2,3,4,6,8")
    p.add_argument("--sizes-kb", default="1,4,16,64,256,1024,4096,16384,65536")
    p.set_defaults(command="python labs/allreduce.py " + " ".join(sys.argv[1:] if argv is None
                                                                    else argv))
    args = labkit.parse(p, argv, fp32_only="it times fp32 messages, as gradients are all-reduced")
    settings = check_settings(p, args) | {"dtype": args.dtype}
    record = build_record(measure_all(args, settings), settings, args.world_size)
    return labkit.emit(record, args.json)


if __name__ == "__main__":
    main()
