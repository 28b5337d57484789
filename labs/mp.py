"""Naive model parallelism measured at every p: memory divides by p, time does not.

The tiny GPT (or an ``mlp_stack``) is cut into p stages balanced by parameter count and
trained as an assembly line (``lessonlib.model_parallel``): stage s on rank s, one batch in
flight, so only one rank works at a time. One launch runs the line for every p in ``--p``
(default 1, 2, ..., the world size, as far as the model has layers to cut between), one
line at a time: ranks p and up sit each run out, so no idle line competes for the cores.
It goes round every p ``--rounds`` times, so a change in the machine's load falls on every
p alike. Each run is checked against the same training in one process (losses, weights).

Per p it reports the idle share of every rank (1 - time in forward, backward and optimizer
/ wall time) and its mean, next to the prediction (p-1)/p (GPipe §2.3's bubble at m = 1,
``costmodel.bubble_fraction(p, 1)``); the median step time and its ratio to p = 1 (the
layers still run one after another, so the prediction is 1, not 1/p); and the parameter
bytes and the activation bytes kept for backward per rank, next to the balanced split's
parameter bytes and the whole model's / p. Compute threads per rank default to 1, so p = 1
and p = 4 compute with the same core count per stage. The record's ``rows``: one per p,
with p a column (``idle_measured`` over ``idle_predicted`` is the headline a sweep plots).

Laptop:  python labs/mp.py --world-size 4 --json data/mp_cpu_results.json
GPU box: torchrun --nproc-per-node 8 labs/mp.py --hidden 1024 --layers 16 --batch 32 \\
             --json results/mp.json
"""
import dataclasses
import sys
from argparse import Namespace

import torch

from lessonlib import model_parallel as mp
from lessonlib.costmodel import bubble_fraction
from lessonlib.lab import labargs, labkit
from lessonlib.layer_split import layers_of, split_summary

P_THEORY = 8                      # the notebook's plots run p = 1..8
MODEL_KEYS = ("model", "layers", "hidden", "width", "batch", "steps", "warmup", "lr", "seed")


def worker(settings: dict) -> dict:
    """One rank: its part of the line at every p, and where it ran."""
    torch.set_num_threads(settings["threads"])
    model = {k: settings[k] for k in MODEL_KEYS}
    # round after round of every p, so a change in the machine's load hits every p alike
    runs = [[mp.assembly_line(p=p, lines=1, **model) for p in settings["p"]]
            for _ in range(settings["rounds"])]
    return {"runs": runs, **labkit.rank_info()}


def line_over_rounds(rounds: list[list[dict]], reference: dict) -> dict:
    """One p's runs (one list of rank results per round) as one row: each rank's idle share
    averaged over the rounds, the median of every step's time, the worst parity."""
    rows = [mp.line_record(run) for run in rounds]
    row = dataclasses.asdict(rows[0])                  # the JSON row the lab stores
    row["idle_per_rank"] = [sum(r.idle_per_rank[s] for r in rows) / len(rows)
                            for s in range(row["p"])]
    row["idle_mean"] = sum(row["idle_per_rank"]) / row["p"]
    row["busy_s_per_rank"] = [sum(r.busy_s_per_rank[s] for r in rows) for s in range(row["p"])]
    row["step_times_s"] = [t for r in rows for t in r.step_times_s]
    row["step_time_s"] = labkit.median(row["step_times_s"])
    row["stash_bytes_per_rank"] = [max(b) for b in zip(*(r.stash_bytes_per_rank for r in rows))]
    diffs = [mp.compare_parity(run, reference) for run in rounds]
    row["parity"] = {k: max(getattr(d, k) for d in diffs)
                     for k in ("loss_max_abs_diff", "weights_max_abs_diff")}
    return row


def build_record(ranks: list[dict], settings: dict, world_size: int) -> dict:
    model = {k: settings[k] for k in MODEL_KEYS}
    reference = mp.single_process(**model)
    full = mp.make_model(settings["model"], settings["seed"], settings["layers"],
                         settings["hidden"], settings["width"])
    n_params = sum(q.numel() for q in full.parameters())
    per_param = reference.param_bytes // n_params          # 4 bytes: fp32
    by_p = {}
    for i, p in enumerate(settings["p"]):
        row = line_over_rounds([[r["runs"][k][i] for r in ranks]
                                for k in range(settings["rounds"])], reference)
        row["param_bytes_split"] = [per_param * s.params for s in split_summary(full, p)]
        row["param_bytes_even"] = reference.param_bytes / p
        by_p[str(p)] = row
    largest = max(settings["p"])
    results = {"lessonlib": {"step_time_s": by_p[str(largest)]["step_time_s"], "by_p": by_p}}
    record = labkit.result("mp", world_size, settings, results, ranks[0])
    record["command"] = settings["command"]
    n_layers = len(layers_of(full))
    record["theory"] = {
        "conventions": {"idle_share": "(p-1)/p of wall time: the bubble (p-1)/(m+p-1) at m = 1, "
                                      "GPipe §2.3",
                        "param_bytes_split": "the balanced split's stages (layer_split)",
                        "step_time": "the same as p = 1: the stages run one after another"},
        "idle_share": {str(p): bubble_fraction(p, 1) for p in range(1, P_THEORY + 1)},
        "param_bytes_split": {str(p): [per_param * s.params for s in split_summary(full, p)]
                              for p in range(1, min(P_THEORY, n_layers) + 1)},
        "param_bytes_model": reference.param_bytes}
    if "1" in by_p:
        one = by_p["1"]["step_time_s"]
        record["step_time_over_p1"] = {k: row["step_time_s"] / one for k, row in by_p.items()}
    record["idle_minus_theory"] = {k: row["idle_mean"] - row["idle_predicted"]
                                   for k, row in by_p.items()}
    record["rows"], record["headline"] = table(record), HEADLINE
    return record


HEADLINE = labkit.headline("idle_measured", x="p", series=["implementation"],
                           predicted="idle_predicted")


def table(record: dict) -> list[dict]:
    """The record as rows with stable columns: one per p."""
    over_p1 = record.get("step_time_over_p1", {})
    return [{"implementation": "lessonlib", "p": int(key), "step_time_s": row["step_time_s"],
             "step_time_over_p1": over_p1.get(key), "step_time_over_p1_predicted": 1.0,
             "idle_measured": row["idle_mean"], "idle_predicted": row["idle_predicted"],
             "idle_per_rank": row["idle_per_rank"],
             "param_bytes_per_rank": row["param_bytes_per_rank"],
             "param_bytes_split_predicted": row["param_bytes_split"],
             "param_bytes_even": row["param_bytes_even"],
             "stash_bytes_per_rank": row["stash_bytes_per_rank"],
             "max_parity_error": max(row["parity"].values())}
            for key, row in record["results"]["lessonlib"]["by_p"].items()]


def check_settings(parser, args, argv=None) -> dict:
    labargs.check_positive(parser, args, "world-size", "steps", "rounds", "layers", "hidden",
                          "width", "batch")
    labargs.check_threads(parser, args)
    if args.model == "gpt":                     # its 4 heads and 32 tokens are fixed
        labargs.check_gpt_fits(parser, Namespace(**vars(args) | {"heads": 4, "seq": 32}),
                              batch="batch")
    else:
        labargs.check_fits(parser, args, "the mlp's weights (width^2 layers floats)",
                          [("--width", args.width), ("--width", args.width),
                           ("--layers", args.layers)])
        labargs.check_fits(parser, args, "the mlp's activations (b width layers floats)",
                          [("--batch", args.batch), ("--width", args.width),
                           ("--layers", args.layers)])
    if args.warmup < 0:
        parser.error(f"--warmup must be 0 or more; got {args.warmup}")
    if args.model == "gpt" and args.hidden % 4:
        parser.error(f"--hidden {args.hidden} must be a multiple of the GPT's 4 heads")
    n_layers = args.layers + 2 if args.model == "gpt" else args.layers
    top = min(args.world_size, n_layers)
    ps = args.p or list(range(1, top + 1))
    bad = [p for p in ps if not 1 <= p <= top]
    if bad:
        parser.error(f"--p {bad}: every p must be in 1..{top} (at most the world size "
                     f"{args.world_size} and the {n_layers} layers the {args.model} has)")
    settings = {"model": args.model, "layers": args.layers, "hidden": args.hidden,
                "width": args.width, "batch": args.batch, "steps": args.steps,
                "warmup": args.warmup, "lr": args.lr, "seed": args.seed,
                "threads": args.threads, "rounds": args.rounds, "p": sorted(set(ps)),
                "command": "python labs/mp.py " + " ".join(sys.argv[1:] if argv is None
                                                            else argv)}
    for p in settings["p"]:
        try:
            mp.check_line(args.world_size, p, lines=1,
                              **{k: settings[k] for k in MODEL_KEYS if k not in ("lr", "seed")})
        except ValueError as exc:
            parser.error(str(exc))
    return settings


def main(argv=None):
    parser = labargs.parser("mp", __doc__.splitlines()[0])
    parser.set_defaults(steps=10, warmup=2)
    parser.add_argument("--p", type=int, nargs="+", default=None,
                        help="stages in the line to run (default: 1 up to the world size)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="times to run every p in turn (each: --warmup, then --steps)")
    parser.add_argument("--model", default="gpt", choices=list(mp.MODEL_KINDS))
    parser.add_argument("--layers", type=int, default=8,
                        help="transformer blocks (gpt, plus embedding and head) or Linear layers")
    parser.add_argument("--hidden", type=int, default=64, help="h of the GPT (seq s = 32)")
    parser.add_argument("--width", type=int, default=128, help="width of the mlp's layers")
    parser.add_argument("--batch", type=int, default=8, help="b, sequences or rows per step")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1,
                        help="compute threads per rank (1: the same cores per stage at every p)")
    args = labkit.parse(parser, argv, fp32_only="its stages receive activations in fp32 buffers")
    settings = check_settings(parser, args, argv) | {"dtype": args.dtype}
    record = build_record(labkit.on_ranks(worker, args, settings), settings, args.world_size)
    return labkit.emit(record, args.json)


if __name__ == "__main__":
    main()
