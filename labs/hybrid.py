"""Hybrid 3-D parallelism: the tiny GPT trained on a grid of (t, p, d) layouts of the same ranks.

Every layout runs in the same launch (one process group, new TP/PP/DP groups per layout) and
is also checked against one process (weights after the steps). Per layout it reports the
median step time (the slowest rank sets the pace) and tokens per second, the parameter bytes
each rank holds next to the count the TP/PP split predicts, the messages one step sends on
each axis next to the count ``hybrid.expected_traffic`` predicts, and the pipeline's idle
share (time outside F and B over the step's wall time, median over ranks) next to the
bubble the cost model predicts, (p-1)/(m+p-1). The record's ``rows``: one per layout, with
t, p, d, b and m as columns (tokens per second is the headline a sweep plots).

Beyond three axes: ``--cp C`` (context parallelism), ``--ep E`` (expert parallelism inside
d, on the MoE tiny GPT), ``--sp`` (sequence parallelism with TP) and ``--shard zero1|fsdp``
(ZeRO-1 or FSDP on the dp axis) apply to every layout and run it through the same
``lessonlib.hybrid`` run in float64; the rows keep their columns, with c, e, shard and sp
added, and the columns that run does not measure (idle share, predicted bytes) left empty.

Laptop:  python labs/hybrid.py --world-size 8 [--json results/hybrid.json]
GPU box: torchrun --nproc-per-node 8 labs/hybrid.py --json results/hybrid.json
         (across servers: torchrun --nnodes N --nproc-per-node 8 ... ; TP stays innermost)
"""
import os
import statistics
import sys
from dataclasses import asdict

import torch

import lessonlib
from lessonlib.context_parallel.layout import check_split_divides
from lessonlib.costmodel import bubble_fraction
from lessonlib.data_parallel.parallelize import SHARDS
from lessonlib.grid_layout import layout_name, parse_layout
from lessonlib.hybrid.checks import LAYOUT, N_EXPERTS, check_layout
from lessonlib.hybrid.layout_runs import train_layout
from lessonlib.hybrid.traffic import expected_param_count, expected_traffic, measured_traffic
from lessonlib.lab import labargs, labkit
from lessonlib.models import GPTConfig


def name(t: int, p: int, d: int) -> str:
    """A (t, p, d) layout's name, ``t2p2d2``."""
    return layout_name(dp=d, pp=p, tp=t)


def all_layouts(world: int, cfg: GPTConfig, global_batch: int, m: int, cp: int = 1,
                ep: int = 1, shard: str = "none", sp: bool = False) -> list[tuple]:
    """Every (t, p, d) with t*c*p*d = world that the model and batch allow."""
    out, world = [], world // cp
    for t in (k for k in range(1, world + 1) if world % k == 0):
        for p in (k for k in range(1, world // t + 1) if (world // t) % k == 0):
            try:
                check_layout(cfg, dp=world // (t * p), pp=p, cp=cp, tp=t, ep=ep,
                             global_batch=global_batch, m=m, shard_on=shard, sp=sp, moe=ep > 1)
                out.append((t, p, world // (t * p)))
            except ValueError:
                continue
    return out


def new_axes(settings: dict) -> dict:
    """The settings beyond (t, p, d): {} for lesson 05's run."""
    axes = {"cp": settings.get("cp", 1), "ep": settings.get("ep", 1),
            "shard_on": settings.get("shard", "none"), "sp": settings.get("sp", False)}
    return {} if axes == {"cp": 1, "ep": 1, "shard_on": "none", "sp": False} else axes


def worker(settings: dict) -> dict:
    layouts = [parse_layout(text) for text in settings["layouts"]]
    cfg, axes = GPTConfig(**settings["model"]), new_axes(settings)
    out = {"info": labkit.rank_info()}
    for t, p, d in layouts:
        lessonlib.progress(f"layout {name(t, p, d)}")
        steps = settings["warmup"] + settings["steps"]
        common = dict(dp=d, pp=p, tp=t, cfg=cfg, m=settings["m"],
                      global_batch=settings["global_batch"], steps=steps, lr=settings["lr"],
                      warmup=settings["warmup"])
        out[name(t, p, d)] = (
            train_layout(**common, cp=axes["cp"], ep=axes["ep"], shard_on=axes["shard_on"],
                         moe=axes["ep"] > 1, sp=axes["sp"], dtype="float64")
            if axes else train_layout(**common, timeline=True))
    return out


def build_record(ranks: list[dict], settings: dict, world_size: int) -> dict:
    layouts = [parse_layout(text) for text in settings["layouts"]]
    cfg, m, batch = GPTConfig(**settings["model"]), settings["m"], settings["global_batch"]
    results, axes = {}, new_axes(settings)
    for t, p, d in layouts:
        per_rank = [r[name(t, p, d)] for r in ranks]
        step = max(r.step_time_s for r in per_rank)
        if axes:
            results[name(t, p, d)] = axes_row(per_rank, t, p, d, axes, batch, m, cfg, step)
            continue
        results[name(t, p, d)] = {
            "t": t, "p": p, "d": d, "b": batch // (d * m), "m": m,
            "step_time_s": step, "tokens_per_s": batch * cfg.seq / step,
            "param_bytes_per_rank": [r.param_bytes for r in per_rank],
            "expected_param_bytes_per_rank": [
                4 * expected_param_count(cfg, p, t, r.coords[1]) for r in per_rank],
            "traffic_per_step_rank0": asdict(measured_traffic(per_rank[0].traffic[-1])),
            "expected_traffic_rank0": asdict(expected_traffic(cfg, d, p, t, batch, m, 0,
                                                              per_rank[0].param_count)),
            "idle_share_median": statistics.median(r.idle_share for r in per_rank),
            "predicted_bubble": bubble_fraction(p, m),
            "max_weight_diff_vs_one_process": max(r.max_weight_diff for r in per_rank),
        }
    record = labkit.result("hybrid", world_size, settings, results, ranks[0]["info"])
    starter = (f"torchrun --nproc-per-node {world_size}" if lessonlib.launcher.under_torchrun()
               else "python")
    record["command"] = " ".join([starter, "labs/hybrid.py", *sys.argv[1:]])
    record["host"] = {"cpu_count": os.cpu_count(), "torch": torch.__version__}
    record["rows"], record["headline"] = table(record), HEADLINE
    return record


def axes_row(per_rank, t, p, d, axes, batch, m, cfg, step) -> dict:
    """A layout on the new axes: the same keys, the unmeasured ones None."""
    return {"t": t, "p": p, "d": d, "c": axes["cp"], "e": axes["ep"], "shard": axes["shard_on"],
            "sp": axes["sp"],
            "b": batch // (d * m), "m": m, "step_time_s": step,
            "tokens_per_s": batch * cfg.seq / step,
            "param_bytes_per_rank": [8 * r.param_count for r in per_rank],
            "expected_param_bytes_per_rank": None, "traffic_per_step_rank0": None,
            "expected_traffic_rank0": None, "idle_share_median": None,
            "predicted_bubble": bubble_fraction(p, m),
            "max_weight_diff_vs_one_process": max(r.max_weight_diff for r in per_rank)}


HEADLINE = labkit.headline("tokens_per_s", x="layout", series=["implementation"])


def table(record: dict) -> list[dict]:
    """The record as rows with stable columns: one per layout."""
    return [{"implementation": "lessonlib", "layout": key,
             **{k: row[k] for k in ("t", "p", "d", "b", "m", "step_time_s", "tokens_per_s")},
             "c": row.get("c", 1), "e": row.get("e", 1), "shard": row.get("shard", "none"),
             "sp": row.get("sp", False),
             "idle_measured": row["idle_share_median"], "bubble_predicted": row["predicted_bubble"],
             "param_bytes_per_rank": row["param_bytes_per_rank"],
             "param_bytes_per_rank_predicted": row["expected_param_bytes_per_rank"],
             "max_weight_diff_vs_one_process": row["max_weight_diff_vs_one_process"]}
            for key, row in record["results"].items()]


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def check_new_axes(ap, args) -> None:
    """``--cp``, ``--ep`` and ``--shard`` on their own, before any layout is tried, so that
    a refusal names the flag at fault, its value and what would work."""
    labargs.check_positive(ap, args, "cp", "ep")
    world = args.world_size
    if world % args.cp:
        ap.error(f"--cp {args.cp} must divide --world-size {world} (c ranks share each "
                 f"sequence); use one of {_divisors(world)}")
    try:
        check_split_divides(args.seq, args.cp, LAYOUT)
    except ValueError as exc:
        ap.error(f"--cp {args.cp} with --seq {args.seq}: {exc}")
    fits = [e for e in _divisors(world // args.cp) if N_EXPERTS % e == 0]
    if args.ep not in fits:
        ap.error(f"--ep {args.ep} must divide both the MoE's {N_EXPERTS} experts and the "
                 f"{world // args.cp} ranks of --world-size {world} / --cp {args.cp}; use one "
                 f"of {fits}")
    if args.ep > 1 and args.cp > 1:
        ap.error(f"--ep {args.ep} with --cp {args.cp}: expert parallelism is combined here "
                 f"with tp, pp and plain dp only; use --cp 1 (or --ep 1)")
    if args.ep > 1 and args.shard != "none":
        ap.error(f"--shard {args.shard} with --ep {args.ep}: expert parallelism is combined "
                 f"here with plain dp only; use --shard none (or --ep 1)")
    if args.sp and args.ep > 1:
        ap.error(f"--sp with --ep {args.ep}: sequence parallelism is not combined with the "
                 f"MoE blocks here; drop --sp")


def check_settings(ap, args) -> dict:
    labargs.check_positive(ap, args, "world-size", "steps")
    labargs.check_number(ap, args, "lr", example="0.1")
    if args.warmup < 0:
        ap.error(f"--warmup must be 0 or more; got {args.warmup}")
    model = labargs.gpt_model(ap, args)
    cfg = GPTConfig(**model)
    check_new_axes(ap, args)
    axes = dict(cp=args.cp, ep=args.ep, shard=args.shard, sp=args.sp)
    if args.layouts:
        layouts = []
        for text in args.layouts.split(","):
            try:
                t, p, d = parse_layout(text)
                check_layout(cfg, dp=d, pp=p, cp=args.cp, tp=t, ep=args.ep,
                             global_batch=args.global_batch, m=args.microbatches,
                             shard_on=args.shard, sp=args.sp, moe=args.ep > 1,
                             world_size=args.world_size)
            except ValueError as exc:
                ap.error(f"--layouts {text}: {exc}")
            layouts.append((t, p, d))
    else:
        layouts = all_layouts(args.world_size, cfg, args.global_batch, args.microbatches,
                              args.cp, args.ep, args.shard, args.sp)
        if not layouts:
            beyond = "".join(f" with --{k} {v}" for k, v in axes.items()
                             if v not in (1, "none", False))
            ap.error(f"no (t, p, d) layout of --world-size {args.world_size}{beyond} fits "
                     f"--layers {args.layers}, --heads {args.heads} and --global-batch "
                     f"{args.global_batch} with --microbatches {args.microbatches}")
    return {"model": model, "global_batch": args.global_batch, "m": args.microbatches,
                     "steps": args.steps, "warmup": args.warmup, "lr": args.lr,
                     "layouts": [name(*lay) for lay in layouts], **axes}


def main(argv=None):
    ap = labargs.parser("hybrid", __doc__.splitlines()[0])
    ap.set_defaults(world_size=8, steps=5, warmup=2)
    ap.add_argument("--layouts", default=None,
                    help="comma-separated t<t>p<p>d<d>, e.g. t2p2d2,t4p2d1 (default: all)")
    labargs.add_gpt_flags(ap)
    ap.add_argument("--lr", type=float, default=0.1, help="SGD learning rate")
    ap.add_argument("--cp", type=int, default=1, help="context-parallel ranks (default 1)")
    ap.add_argument("--ep", type=int, default=1,
                    help="expert-parallel ranks inside d, on the MoE tiny GPT (default 1)")
    ap.add_argument("--shard", choices=SHARDS, default="none",
                    help="sharded data parallelism on the dp axis (default none)")
    ap.add_argument("--sp", action="store_true",
                    help="sequence parallelism with TP (LayerNorms on s/(c t) rows)")
    args = labkit.parse(ap, argv,
                        fp32_only="its pipeline stages receive activations in fp32 buffers")
    settings = check_settings(ap, args) | {"dtype": args.dtype}
    record = build_record(labkit.on_ranks(worker, args, settings), settings, args.world_size)
    return labkit.emit(record, args.json)


if __name__ == "__main__":
    main()
