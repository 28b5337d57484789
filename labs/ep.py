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

The routing is GShard's by default (softmax, capacity, the auxiliary loss); DeepSeek-V3's
(§2.1.2) is ``--gate sigmoid --balance bias --dropless --max-nodes M``, with
``--experts-per-node`` grouping the ranks into pretend nodes (default: one rank a node). The
record then also holds the load's busiest / mean over the steps (the bias moves after each)
and the share of the all-to-alls' bytes that crossed a node boundary.

Laptop:  python labs/ep.py --world-size 4 [--json results/ep.json]
         python labs/ep.py --world-size 4 --gate sigmoid --balance bias --dropless --max-nodes 2
GPU box: torchrun --nproc-per-node 8 labs/ep.py --json results/ep.json
"""
import dataclasses
import sys

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn

import lessonlib
from lessonlib import device
from lessonlib.expert_parallel.dispatch import all_to_all_rows
from lessonlib.expert_parallel.measure import imbalance, time_layer
from lessonlib.lab import labargs, labkit
from lessonlib.models.moe_routing import BALANCES, BIAS_STEP, GATES


def _time_dispatch(settings: dict, send: list[int], recv: list[int]) -> dict:
    """lessonlib's and torch's differentiable all-to-all on the same rows and splits,
    alternately (lessonlib first on even steps): forward + backward times, and whether
    both deliver the same rows."""
    h, dev = settings["hidden"], device.current_device()
    x = torch.randn(sum(send), h, generator=torch.Generator().manual_seed(dist.get_rank()))
    x = x.to(dev).requires_grad_()
    impls = {"lessonlib": lambda: all_to_all_rows(x, recv, send),
             "torch": lambda: dist_fn.all_to_all_single(x.new_empty(sum(recv), h), x, recv, send)}
    outs = {name: run().detach() for name, run in impls.items()}
    times = {name: [] for name in impls}
    for i in range(settings["warmup"] + settings["steps"]):
        for name in (list(impls) if i % 2 == 0 else list(impls)[::-1]):
            t = labkit.time_steps(lambda run=impls[name]: run().sum().backward(), 1, 0)[0]
            if i >= settings["warmup"]:
                times[name].append(t)
    return {"times": times, "same_rows": bool(torch.equal(outs["lessonlib"], outs["torch"]))}


def _off_node(events, rank: int, ranks_per_node: int) -> int:
    """Bytes this rank's all-to-alls sent to ranks of other (pretend) nodes."""
    return sum(ev.bytes for ev in events
               if ev.op == "send" and ev.peer // ranks_per_node != rank // ranks_per_node)


def worker(settings: dict) -> dict:
    timed = time_layer(settings["experts"], settings["top_k"], settings["capacity_factor"],
                       settings["batch"], settings["seq"], settings["hidden"],
                       settings["steps"], settings["warmup"], **settings["routing"])
    ranks_per_node = settings["ranks_per_node"]
    # the record as the lab's JSON has always held it: every field but the events
    layer = {k: v for k, v in dataclasses.asdict(dataclasses.replace(timed, events=[])).items()
             if k != "events"}
    layer["bytes"]["sent_off_node"] = _off_node(timed.events, timed.rank, ranks_per_node)
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
           "output_max_abs_error": max(x["output_max_abs_error"] for x in layers),
           "busiest_over_mean": imbalance([[sum(col) for col in zip(*step)]
                                           for step in zip(*(x["load"] for x in layers))]),
           "off_node_share": (sum(x["bytes"]["sent_off_node"] for x in layers)
                              / sum(x["bytes"]["sent"] for x in layers))}
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
    labargs.check_positive(p, args, "world-size", "steps", "batch", "seq", "hidden", "experts",
                          "top-k")
    if args.warmup < 0:
        p.error(f"--warmup must be 0 or more; got {args.warmup}")
    if args.experts % args.world_size:
        p.error(f"--experts {args.experts} must be divisible by e = --world-size "
                f"{args.world_size} (each rank holds E/e experts)")
    if args.top_k > args.experts:
        p.error(f"--top-k {args.top_k} must be at most --experts {args.experts}")
    labargs.check_fits(p, args, "the experts' weights (E h 4h floats)",
                      [("--experts", args.experts), ("--hidden", args.hidden),
                       ("--hidden", args.hidden)], itemsize=4 * 4)
    labargs.check_fits(p, args, "the experts' inner activations (k b s 4h floats)",
                      [("--top-k", args.top_k), ("--batch", args.batch), ("--seq", args.seq),
                       ("--hidden", args.hidden)], itemsize=4 * 4)
    if not args.capacity_factor > 0:
        p.error(f"--capacity-factor must be a positive number, e.g. 1.25; got "
                f"{args.capacity_factor}")
    return {"experts": args.experts, "top_k": args.top_k,
            "capacity_factor": None if args.dropless else args.capacity_factor,
            "batch": args.batch, "seq": args.seq, "hidden": args.hidden, "steps": args.steps,
            "warmup": args.warmup, **check_routing_flags(p, args)}


def check_routing_flags(p, args) -> dict:
    """The routing flags, one line each: a bias step of 0 or more, pretend nodes of whole
    ranks dividing the experts, a node limit of at most the nodes that hold k experts."""
    if not 0 <= args.bias_step < float("inf"):
        p.error(f"--bias-step must be a finite number >= 0 (each step's move of the bias), "
                f"e.g. {BIAS_STEP}; got {args.bias_step}")
    local = args.experts // args.world_size
    per_node = local if args.experts_per_node is None else args.experts_per_node
    if per_node < 1 or args.experts % per_node or per_node % local:
        p.error(f"--experts-per-node {per_node} must divide --experts {args.experts} and be a "
                f"multiple of the E/e = {local} experts of one rank (a node holds whole "
                f"ranks), e.g. {local}")
    nodes = args.experts // per_node
    if args.max_nodes is not None and not 1 <= args.max_nodes <= nodes:
        p.error(f"--max-nodes {args.max_nodes} must be between 1 and the {nodes} nodes "
                f"(--experts {args.experts} / --experts-per-node {per_node})")
    if args.max_nodes is not None and args.max_nodes * per_node < args.top_k:
        p.error(f"--max-nodes {args.max_nodes} nodes of {per_node} experts hold fewer than "
                f"--top-k {args.top_k}; raise --max-nodes")
    limit = {"max_nodes": args.max_nodes, "experts_per_node": per_node} \
        if args.max_nodes is not None else {}
    return {"routing": {"balance": args.balance, "gate": args.gate, "bias_step": args.bias_step,
                        **limit}, "ranks_per_node": per_node // local}


def main(argv=None):
    p = labargs.parser("ep", __doc__.splitlines()[0])
    p.set_defaults(steps=10, warmup=2)
    p.add_argument("--experts", type=int, default=8, help="E, experts in the layer")
    p.add_argument("--top-k", type=int, default=2, help="k, experts per token")
    p.add_argument("--capacity-factor", type=float, default=1.25, help="C")
    p.add_argument("--batch", type=int, default=4, help="b, sequences per rank")
    p.add_argument("--seq", type=int, default=64, help="s, tokens per sequence")
    p.add_argument("--hidden", type=int, default=128, help="h; each expert's inner size is 4h")
    p.add_argument("--balance", default="aux", choices=BALANCES,
                   help="aux: Switch's auxiliary loss; bias: DeepSeek-V3's bias, no loss")
    p.add_argument("--gate", default="softmax", choices=GATES,
                   help="sigmoid: DeepSeek-V3's affinities, the chosen k normalised")
    p.add_argument("--bias-step", type=float, default=BIAS_STEP,
                   help="the bias's move per step with --balance bias (DeepSeek-V3: 0.001)")
    p.add_argument("--dropless", action="store_true",
                   help="no capacity: every expert takes every token (ignores --capacity-factor)")
    p.add_argument("--max-nodes", type=int, default=None,
                   help="M: each token's experts from its M best (pretend) nodes")
    p.add_argument("--experts-per-node", type=int, default=None,
                   help="experts on one pretend node, whole ranks' worth (default: E/e)")
    args = labkit.parse(p, argv)
    settings = check_settings(p, args) | {"dtype": args.dtype}
    record = build_record(labkit.on_ranks(worker, args, settings), settings, args.world_size)
    return labkit.emit(record, args.json)


if __name__ == "__main__":
    main()
