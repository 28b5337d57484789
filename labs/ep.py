"""Expert parallelism: the MoE layer's E experts split over e ranks, timed, with the share of
the step its all-to-alls take.

On every rank (e = world size) the expert-parallel layer runs forward and backward on its own
batch; the lab reports the median step time (the slowest rank's), the median time of the
step's all-to-alls (the counts' exchange, the dispatch and the return trip, forward and
backward, from lessonlib's ledger) and its share of the step, the bytes each rank sent and
received against the routing counts' formula, the dropped share, and the first step's output
against the one-process layer. PyTorch has no MoE layer or expert-parallel module (torch
2.13); its own differentiable ``torch.distributed.nn.functional.all_to_all_single`` is
timed on the same dispatch (same rows, same splits, forward and backward), next to
lessonlib's. The record's ``rows``: one per implementation and part, e a column.

Laptop:  python labs/ep.py --world-size 4 [--json results/ep.json]
GPU box: torchrun --nproc-per-node 8 labs/ep.py --json results/ep.json
"""
import sys

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn

import lessonlib
from lessonlib import device, labkit
from lessonlib.expert_parallel.dispatch import all_to_all
from lessonlib.expert_parallel.measure import time_layer


def _time_dispatch(settings: dict, send: list[int], recv: list[int]) -> dict:
    """lessonlib's and torch's differentiable all-to-all on the same rows and splits,
    alternately (lessonlib first on even steps): forward + backward times, and whether
    both deliver the same rows."""
    h, dev = settings["hidden"], device.current_device()
    x = torch.randn(sum(send), h, generator=torch.Generator().manual_seed(dist.get_rank()))
    x = x.to(dev).requires_grad_()
    impls = {"lessonlib": lambda: all_to_all(x, recv, send),
             "torch": lambda: dist_fn.all_to_all_single(x.new_empty(sum(recv), h), x, recv, send)}
    outs = {name: run().detach() for name, run in impls.items()}
    times = {name: [] for name in impls}
    for i in range(settings["warmup"] + settings["steps"]):
        for name in (list(impls) if i % 2 == 0 else list(impls)[::-1]):
            t = labkit.time_steps(lambda run=impls[name]: run().sum().backward(), 1, 0)[0]
            if i >= settings["warmup"]:
                times[name].append(t)
    return {"times": times, "same_rows": bool(torch.equal(outs["lessonlib"], outs["torch"]))}


def worker(settings: dict) -> dict:
    layer = time_layer(settings["experts"], settings["top_k"], settings["capacity_factor"],
                       settings["batch"], settings["seq"], settings["hidden"],
                       settings["steps"], settings["warmup"])
    layer.pop("events")
    dispatch = _time_dispatch(settings, layer["stats"]["sent_rows"],
                              layer["stats"]["received_rows"])
    return {**labkit.rank_info(), "layer": layer, "dispatch": dispatch}


def _slowest(per_rank: list[list[float]]) -> list[float]:
    """A synchronous step lasts as long as its slowest rank."""
    return [max(step) for step in zip(*per_rank)]


def build_record(ranks: list[dict], settings: dict, world_size: int) -> dict:
    layers = [r["layer"] for r in ranks]
    step, a2a = _slowest([x["step_s"] for x in layers]), _slowest([x["alltoall_s"] for x in layers])
    choices = settings["top_k"] * settings["batch"] * settings["seq"] * world_size
    moe = {"step_time_s": labkit.median(step), "alltoall_time_s": labkit.median(a2a),
           "alltoall_share": labkit.median([a / s for a, s in zip(a2a, step)]),
           "bytes_sent_per_rank": [x["bytes"]["sent"] for x in layers],
           "bytes_received_per_rank": [x["bytes"]["received"] for x in layers],
           "bytes_expected_per_rank": [x["expected_bytes"]["sent"] for x in layers],
           "bytes_match_routing": all(x["bytes"]["sent"] == x["expected_bytes"]["sent"] and
                                      x["bytes"]["received"] == x["expected_bytes"]["received"]
                                      for x in layers),
           "dropped_share": sum(x["stats"]["dropped"] for x in layers) / choices,
           "tokens_per_expert": [n for x in layers for n in x["stats"]["received_per_expert"]],
           "output_max_abs_error": max(x["output_max_abs_error"] for x in layers)}
    dispatch = {name: labkit.median(_slowest([r["dispatch"]["times"][name] for r in ranks]))
                for name in ("lessonlib", "torch")}
    results = {"lessonlib": {"step_time_s": moe["step_time_s"], "moe_layer": moe,
                             "all_to_all_step_time_s": dispatch["lessonlib"]},
               "torch": {"step_time_s": dispatch["torch"],
                         "same_rows_as_lessonlib": all(r["dispatch"]["same_rows"] for r in ranks)}}
    record = labkit.result("ep", world_size, settings, results, ranks[0])
    starter = (f"torchrun --nproc-per-node {world_size}" if lessonlib.launcher.under_torchrun()
               else "python")
    record["settings"]["command"] = " ".join([starter, "labs/ep.py", *sys.argv[1:]])
    record["rows"], record["headline"] = table(record), HEADLINE
    return record


HEADLINE = labkit.headline("step_time_s", x="e", series=["implementation", "part"])


def table(record: dict) -> list[dict]:
    """One row per implementation and part, with the same columns."""
    e, res = record["world_size"], record["results"]
    moe = res["lessonlib"]["moe_layer"]
    rows = [{"implementation": "lessonlib", "part": "moe_layer", "e": e,
             "step_time_s": moe["step_time_s"], "alltoall_time_s": moe["alltoall_time_s"],
             "alltoall_share": moe["alltoall_share"], "dropped_share": moe["dropped_share"],
             "bytes_match_routing": moe["bytes_match_routing"],
             "output_max_abs_error": moe["output_max_abs_error"]},
            {"implementation": "lessonlib", "part": "all_to_all", "e": e,
             "step_time_s": res["lessonlib"]["all_to_all_step_time_s"]},
            {"implementation": "torch", "part": "all_to_all", "e": e,
             "step_time_s": res["torch"]["step_time_s"]}]
    return labkit.stable_rows(rows)


def check_settings(p, args) -> dict:
    labkit.check_positive(p, args, "world-size", "steps", "batch", "seq", "hidden", "experts",
                          "top-k")
    if args.warmup < 0:
        p.error(f"--warmup must be 0 or more; got {args.warmup}")
    if args.experts % args.world_size:
        p.error(f"--experts {args.experts} must be divisible by e = --world-size "
                f"{args.world_size} (each rank holds E/e experts)")
    if args.top_k > args.experts:
        p.error(f"--top-k {args.top_k} must be at most --experts {args.experts}")
    labkit.check_fits(p, args, "the experts' weights (E h 4h floats)",
                      [("--experts", args.experts), ("--hidden", args.hidden),
                       ("--hidden", args.hidden)], itemsize=4 * 4)
    labkit.check_fits(p, args, "the experts' inner activations (k b s 4h floats)",
                      [("--top-k", args.top_k), ("--batch", args.batch), ("--seq", args.seq),
                       ("--hidden", args.hidden)], itemsize=4 * 4)
    if not args.capacity_factor > 0:
        p.error(f"--capacity-factor must be a positive number, e.g. 1.25; got "
                f"{args.capacity_factor}")
    return {"experts": args.experts, "top_k": args.top_k,
            "capacity_factor": args.capacity_factor, "batch": args.batch, "seq": args.seq,
            "hidden": args.hidden, "steps": args.steps, "warmup": args.warmup}


def main(argv=None):
    p = labkit.parser("ep", __doc__.splitlines()[0])
    p.set_defaults(steps=10, warmup=2)
    p.add_argument("--experts", type=int, default=8, help="E, experts in the layer")
    p.add_argument("--top-k", type=int, default=2, help="k, experts per token")
    p.add_argument("--capacity-factor", type=float, default=1.25, help="C")
    p.add_argument("--batch", type=int, default=4, help="b, sequences per rank")
    p.add_argument("--seq", type=int, default=64, help="s, tokens per sequence")
    p.add_argument("--hidden", type=int, default=128, help="h; each expert's inner size is 4h")
    args = labkit.parse(p, argv)
    settings = check_settings(p, args) | {"dtype": args.dtype}
    record = build_record(labkit.on_ranks(worker, args, settings), settings, args.world_size)
    return labkit.emit(record, args.json)


if __name__ == "__main__":
    main()
