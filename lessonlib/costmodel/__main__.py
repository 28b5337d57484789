"""Command line for the cost model: one layout's estimate, a plan, or the Table 1 check.

    python -m lessonlib.costmodel --layers 96 --hidden 12288 --heads 96 --seq 2048 \\
        --vocab 51200 --t 8 --p 12 --d 4 --microbatch 1 --global-batch 1536 \\
        --gpu A100-80GB --gpus-per-node 8 --json
    python -m lessonlib.costmodel --model megatron-1T --plan --gpus 1024 --global-batch 2048
    python -m lessonlib.costmodel --table1
    python -m lessonlib.costmodel --published    # every published run, predicted vs measured,
                                                 # the error's median and worst
    python -m lessonlib.costmodel --measured data/measured_runs_example.csv  # your own runs:
                                                 # the error, and each job's layouts ranked
    python -m lessonlib.costmodel --model llama3-405B --seq 131072 --t 8 --c 16 --p 16 \
        --gpus 16384 --global-batch 128 --cluster dgx-h100 --zero 1 --recompute full
    python -m lessonlib.costmodel --model deepseek-v3 --p 16 --e 64 --gpus 2048 \
        --global-batch 15360 --cluster hgx-h800 --zero 1 --overlap-comm
    python -m lessonlib.costmodel --plan5 --model llama3-405B --seq 131072 --gpus 16384 \
        --global-batch 128 --cluster dgx-h100        # all five axes, explained axis by axis
    python -m lessonlib.costmodel --model gpt-161B --t 16 --p 4 --global-batch 128 \\
        --network-ports 1 --collectives flat-ring     # one port per server: the steep cliff

Bad settings print one line naming the setting, its value and what would work, and exit
with status 2, before anything is estimated; so do flags argparse cannot read.
"""
import argparse
import json
import sys
from dataclasses import asdict, replace

from lessonlib.argcheck import positive_int

from .bubble import SCHEDULES
from .gemm import FP8_SCALINGS, PRECISIONS
from .hardware import (COLLECTIVE_ALGORITHMS, CLUSTERS, GPUS, check_network_gbit, get_cluster,
                       get_gpu, make_cluster)
from .kernels import KERNELS
from .layout import (ATTENTION_KERNELS, CP_COMM, DEGREE_FREE, FSDP_IMPLS, GRAD_DTYPES, LOSSES,
                     TP_PLANS, ZERO_REDUCES)
from .megatron2021 import table1_report
from .measured import judge, measured_report, read_runs
from .memory import RECOMPUTE_MODES
from .model import GPT, MODELS, get_model
from .planner import PLAN_SCHEDULES, plan
from .published import memory_report, published_report
from .search import explain_axes, plan_job
from .throughput import Layout, estimate


class _Parser(argparse.ArgumentParser):
    """argparse that reports a flag it cannot read in one line (not usage + error)."""

    def error(self, message):
        self.exit(2, f"error: {message} (see --help)\n")


def build_parser():
    ap = _Parser(
        prog="python -m lessonlib.costmodel",
        description="Predict memory, step time and TFLOP/s per GPU of a GPT training layout "
                    "(Megatron-LM 2021 notation), or plan the best layout.")
    shape = ap.add_argument_group("model (a preset, or its shape; flags override a preset)")
    shape.add_argument("--model", help=f"preset: {', '.join(MODELS)}")
    shape.add_argument("--layers", type=int, help="L")
    shape.add_argument("--hidden", type=int, help="h")
    shape.add_argument("--heads", type=int, help="a")
    shape.add_argument("--seq", type=int, help="s (default 2048)")
    shape.add_argument("--vocab", type=int, help="V (default 51200)")
    lay = ap.add_argument_group("layout")
    lay.add_argument("--t", type=int, default=1, help="tensor-parallel size")
    lay.add_argument("--c", type=int, default=1, help="context-parallel size")
    lay.add_argument("--p", type=int, default=1, help="pipeline-parallel size")
    lay.add_argument("--e", type=int, default=1,
                     help="expert-parallel size, carved from d (MoE models)")
    lay.add_argument("--d", type=int, help="data-parallel size (default: gpus/(t*c*p))")
    lay.add_argument("--microbatch", "--b", dest="b", type=int, default=1, help="b")
    lay.add_argument("--global-batch", type=int, help="B, sequences per step")
    lay.add_argument("--m", type=int, help="micro-batches per step (instead of B)")
    lay.add_argument("--v", type=int, default=1, help="interleaved chunks per stage")
    lay.add_argument("--recompute", choices=RECOMPUTE_MODES,
                     help="default: full; --plan: SP + selective where t > 1")
    lay.add_argument("--sequence-parallel", action="store_true")
    lay.add_argument("--no-scatter-gather", action="store_true")
    lay.add_argument("--schedule", choices=SCHEDULES,
                     help="default: 1f1b; --plan: the best of 1f1b, zb-h1 and zbv")
    lay.add_argument("--zero", type=int, default=0, help="ZeRO stage 0-3 over d")
    lay.add_argument("--shard-group", type=int,
                     help="ZeRO/FSDP shard group inside d (fewer than d: HSDP)")
    lay.add_argument("--overlap-comm", action="store_true",
                     help="FSDP gathers and MoE all-to-alls hidden behind compute")
    how = ap.add_argument_group("how the layout runs (an estimate's; Layout's settings)")
    for flag, choices, text in (
            ("--precision", PRECISIONS, "the linear GEMMs' (default bf16)"),
            ("--fp8-scaling", FP8_SCALINGS, "FP8's scaling recipe (default blockwise)"),
            ("--attention-kernel", ATTENTION_KERNELS, "fused attention (default fa2)"),
            ("--loss", LOSSES, "how the cross entropy runs (default eager)"),
            ("--grad-dtype", tuple(GRAD_DTYPES), "gradients accumulate in (default bf16)"),
            ("--reduce-dtype", tuple(GRAD_DTYPES), "the DP exchange reduces in (default bf16)"),
            ("--moment-dtype", tuple(GRAD_DTYPES), "Adam's moments (default fp32)"),
            ("--zero-reduce", ZERO_REDUCES, "ZeRO-1/2's gradient exchange"),
            ("--kernels", KERNELS, "elementwise kernels (default fused)"),
            ("--cp-comm", CP_COMM, "context parallelism's exchange (default ring)"),
            ("--tp-plan", TP_PLANS, "whose tensor-parallel plan (default megatron)"),
            ("--fsdp-impl", FSDP_IMPLS, "whose ZeRO-3 (default pytorch: FSDP2)")):
        how.add_argument(flag, choices=choices, help=text)
    for flag, text in (("--async-tp", "SP's transfers under their GEMMs (needs SP)"),
                       ("--overlap-p2p", "the interleaved pipeline's sends overlapped"),
                       ("--uneven-stages", "first and last stage one layer lighter")):
        how.add_argument(flag, action="store_true", help=text)
    how.add_argument("--comm-sm-share", type=float,
                     help="share of SMs given to communication kernels, 0 to below 1")
    how.add_argument("--max-nodes", type=int, help="node-limited routing (MoE)")
    hw = ap.add_argument_group("hardware")
    hw.add_argument("--cluster", help=f"preset: {', '.join(CLUSTERS)}")
    hw.add_argument("--gpu", default="A100-80GB", help=f"one of {', '.join(GPUS)}")
    hw.add_argument("--gpus-per-node", type=int, default=8)
    hw.add_argument("--network-gbit", type=float, help="InfiniBand Gb/s per port")
    hw.add_argument("--network-ports", type=int,
                    help="InfiniBand ports per server (default: one per GPU, as DGX servers)")
    hw.add_argument("--collectives", default="multi-ring", choices=COLLECTIVE_ALGORITHMS,
                    help="across servers: NCCL's channels over every port, or one flat ring")
    hw.add_argument("--gpus", type=int, help="total GPUs n (checked against t*p*d)")
    out = ap.add_argument_group("what to print")
    out.add_argument("--plan", action="store_true", help="rank every layout for --gpus")
    out.add_argument("--plan5", action="store_true",
                     help="plan over all five axes t, c, p, d, e (search.plan_job)")
    out.add_argument("--table1", action="store_true",
                     help="compare with Megatron-LM 2021 Table 1 and exit")
    out.add_argument("--published", action="store_true",
                     help="every published run the course quotes, predicted, and exit")
    out.add_argument("--measured", metavar="CSV",
                     help="your measured runs (a CSV, lessonlib/costmodel/measured.py): the "
                          "error per run and whether the model ranks each job's layouts in "
                          "the measured order")
    out.add_argument("--json", action="store_true", help="one JSON object on stdout")
    return ap


def _model(args):
    base = get_model(args.model) if args.model else None
    given = {"L": args.layers, "h": args.hidden, "a": args.heads, "s": args.seq,
             "V": args.vocab}
    if base is None:
        missing = [flag for flag, key in (("--layers", "L"), ("--hidden", "h"),
                                          ("--heads", "a")) if given[key] is None]
        if missing:
            raise ValueError(f"model is not set: give --model (one of {', '.join(MODELS)}) "
                             f"or {' '.join(missing)}")
        given["s"] = given["s"] or 2048
        given["V"] = given["V"] or 51200
        return GPT(**given)
    changes = {k: v for k, v in given.items() if v is not None}
    if not changes:
        return base
    if set(changes) == {"s"}:
        return replace(base, s=changes["s"])
    return replace(base, **changes, name=f"{base.name} (modified)")


# Flags that must be positive integers when given, by their attribute on ``args``.
POSITIVE = {"layers": "layers", "hidden": "hidden", "heads": "heads", "seq": "seq",
            "vocab": "vocab", "t": "t", "c": "c", "e": "e", "p": "p", "d": "d", "b": "microbatch",
            "global_batch": "global-batch", "m": "m", "v": "v", "gpus": "gpus",
            "gpus_per_node": "gpus-per-node", "network_ports": "network-ports",
            "shard_group": "shard-group", "max_nodes": "max-nodes"}
# Layout's settings the "how the layout runs" flags set, by their attribute on ``args``:
# those any layout can take (a plan gives them to every candidate), then those tied to a
# layout's shape (async TP needs SP, overlapped sends an interleaved pipeline).
ANY_LAYOUT = DEGREE_FREE + ("zero_reduce",)     # --plan fixes the ZeRO stage (--zero)
RUN_SETTINGS = ANY_LAYOUT + ("async_tp", "overlap_p2p", "uneven_stages", "comm_sm_share",
                             "max_nodes")


def check_args(args):
    """Raise ValueError naming the first flag whose value cannot describe a training run."""
    for attr, flag in POSITIVE.items():
        value = getattr(args, attr)
        if value is not None:
            positive_int(flag, value)
    if args.zero not in (0, 1, 2, 3):
        raise ValueError(f"zero={args.zero} must be a ZeRO stage: 0, 1, 2 or 3")
    if args.network_gbit is not None:
        check_network_gbit("network-gbit", args.network_gbit)


def _cluster(args):
    if args.cluster:
        return get_cluster(args.cluster)
    return make_cluster(get_gpu(args.gpu), args.gpus_per_node, args.network_gbit,
                        network_ports=args.network_ports, collectives=args.collectives)


def _layout(args):
    t, p, d = args.t * args.c, args.p, args.d  # t here: the t*c GPUs of one sequence
    if d is None:
        if args.gpus is None:
            d = 1
        elif args.gpus % (t * p):
            raise ValueError(f"gpus={args.gpus} is not divisible by t*c*p = {args.t}*{args.c}*"
                             f"{p} = {t * p}; use a multiple of {t * p}, or change t, c or p")
        else:
            d = args.gpus // (t * p)
    if args.gpus is not None and t * p * d != args.gpus:
        hint = (f"use d={args.gpus // (t * p)}" if args.gpus % (t * p) == 0
                else f"use gpus={t * p * d}")
        raise ValueError(f"t*c*p*d = {args.t}*{args.c}*{p}*{d} = {t * p * d} does not match "
                         f"gpus={args.gpus}; {hint}")
    if args.global_batch is None and args.m is None:
        raise ValueError("global-batch is not set: give --global-batch B (sequences per step) "
                         "or --m (micro-batches per step)")
    return Layout(t=args.t, c=args.c, p=p, d=d, e=args.e, b=args.b, m=args.m,
                  global_batch=args.global_batch, v=args.v,
                  recompute=args.recompute or "full", sequence_parallel=args.sequence_parallel,
                  scatter_gather=not args.no_scatter_gather,
                  schedule=args.schedule or "1f1b",
                  zero_stage=args.zero, shard_group=args.shard_group,
                  overlap_comm=args.overlap_comm,
                  **{k: getattr(args, k) for k in RUN_SETTINGS if getattr(args, k) not in (
                      None, False)})


def _run(args):
    check_args(args)
    if args.table1:
        return table1_report()
    if args.published:
        return published_report() + "\n\n" + memory_report()
    if args.measured:
        runs = read_runs(args.measured)
        if not args.json:
            return measured_report(runs)
        result = judge(runs)
        return _json({"runs": [{"name": r.run.source, "metric": r.run.metric,
                                "measured": r.run.published, "predicted": r.predicted,
                                "error": r.error, "predicted_gib": gib, "measured_gib": peak,
                                "fits": fits}
                               for r, (gib, peak, _, fits) in zip(result.rows, result.memory)],
                      "jobs": [asdict(job) for job in result.jobs]})
    model, cluster = _model(args), _cluster(args)
    if args.plan5:
        if args.gpus is None or args.global_batch is None:
            raise ValueError("plan5 needs --gpus N and --global-batch B")
        result = plan_job(model, cluster, args.gpus, args.global_batch,
                          overlap_comm=args.overlap_comm)
        return explain_axes(result)
    if args.plan:
        if args.gpus is None or args.global_batch is None:
            raise ValueError("plan needs --gpus N and --global-batch B")
        chosen = {"recompute": args.recompute} if args.recompute else {}
        chosen |= {"sequence_parallel": True} if args.sequence_parallel else {}
        chosen |= {"schedule": args.schedule} if args.schedule else {}
        chosen |= {k: getattr(args, k) for k in ANY_LAYOUT if getattr(args, k)}
        result = plan(model, cluster, args.gpus, args.global_batch, zero_stage=args.zero,
                      schedules=PLAN_SCHEDULES, **chosen)
        if not args.json:
            return result.explain()
        best = result.best
        return _json({"best": best.as_dict() if best else None,
                      "explanation": result.explain(),
                      "ranked": [e.as_dict() for e in result.ranked[:10]],
                      "fitting_layouts": len(result.ranked),
                      "rejected_layouts": len(result.rejected)})
    est = estimate(model, _layout(args), cluster)
    return _json(est.as_dict()) if args.json else est.summary()


def _json(result: dict) -> str:
    """One JSON object: a number that is not finite is refused, never printed as Infinity."""
    try:
        return json.dumps(result, indent=2, allow_nan=False)
    except ValueError:
        raise ValueError("a predicted number is not finite (inf or nan), which JSON cannot "
                         "hold: a setting is out of range (a time or bandwidth, e.g. "
                         "--network-gbit)") from None


def main(argv=None):
    """Entry point; returns the exit status (0 ok, 2 bad settings)."""
    args = build_parser().parse_args(argv)
    try:
        text = _run(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
