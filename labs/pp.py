"""Pipeline parallelism, lessonlib against PyTorch: GPipe and 1F1B on the same stages.

The model is an ``mlp_stack`` of p x ``--layers-per-stage`` equal Linear+GeLU layers, cut
into p balanced stages (stage s = rank s), so each micro-batch costs every stage the same
matmul work. lessonlib's executor (``lessonlib.pipeline``) and PyTorch's
``torch.distributed.pipelining`` (``PipelineStage`` + ``ScheduleGPipe`` / ``Schedule1F1B``)
run it in turns, step by step, for each m in ``--microbatches``; the zero-bubble schedules
(``--schedules zb-h1 zbv``, the backward split into B and W) race PyTorch's
``ScheduleInterleavedZeroBubble`` (one stage per rank; m a multiple of p) and
``ScheduleZBVZeroBubble`` (two stages per rank in a V). Per schedule, m and
implementation it reports the median step time (the slowest rank's), the measured bubble
per stage (1 - time in forward and backward / step time: the share of *wall* time, GPipe
§2.3's convention), and the peak number and bytes of activations each stage held for its
backward (counted from what autograd saved), next to the theory: bubble (p-1)/(m+p-1) of
wall time (and Megatron-LM 2021's (p-1)/m of ideal time), stash min(p - stage, m) for
1F1B and m for GPipe. Compute threads per rank default to 1 so ranks do not share cores,
and stage 0 computes its input's gradient like every other stage, so the stages are equal.
Each run also checks parity with one process (the tiny GPT under 1F1B with m = p, weights
and gradients after 2 SGD steps: ``max_weight_diff_vs_one_process``). The record's
``rows`` hold one row per implementation, schedule and m, with m a column and the same
metric names in every row (``bubble_measured`` over ``bubble_predicted`` is the headline a
sweep plots).

Laptop:  python labs/pp.py --world-size 2 [--json results/pp.json]
GPU box: torchrun --nproc-per-node 4 labs/pp.py --microbatches 4 8 16 --json results/pp.json
"""
import sys

import torch.distributed as dist

from lessonlib.lab import labargs, labkit
from lessonlib.pipeline import schedule_runs

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1", "zbv")


def worker(settings: dict) -> dict:
    """One rank: the measurements (StepResults per case) and where it ran."""
    keys = ("width", "layers_per_stage", "micro", "v", "steps", "warmup", "threads", "pin",
            "input_grad")
    results = schedule_runs.measure(ms=settings["microbatches"], schedules=settings["schedules"],
                           **{k: settings[k] for k in keys})
    # parity with one process: the tiny GPT, 2 SGD steps of 1F1B with m = p, in float32
    checked = schedule_runs.rank_parity([parity_case(dist.get_world_size())])
    return {"cases": results, "parity": checked, **labkit.rank_info()}


def parity_case(p: int) -> tuple:
    """What the lab checks against one process: 1F1B with m = p on the tiny GPT."""
    return ("lessonlib", "1f1b", p, 1)


def build_record(ranks: list[dict], settings: dict, world_size: int) -> dict:
    rows = schedule_runs.summarize([r["cases"] for r in ranks])
    (parity,) = schedule_runs.compare_parity([r["parity"] for r in ranks])   # raises if it differs
    results = {"lessonlib": {"schedules": {}}, "torch": {"schedules": {}}}
    for row in rows:
        case = {k: getattr(row, k) for k in ("step_time_s", "bubble_per_stage", "bubble_mean",
                                             "peak_stash_per_stage", "peak_stash_bytes_per_stage")}
        results[row.engine]["schedules"].setdefault(row.schedule, {})[f"m={row.m}"] = case
    for engine in results:
        # headline: 1F1B at the largest m run (the shared shape's step_time_s)
        one = [r for r in rows if (r.engine, r.schedule) == (engine, "1f1b")]
        results[engine]["step_time_s"] = (max(one, key=lambda r: r.m).step_time_s
                                          if one else None)
    results["lessonlib"]["max_weight_diff_vs_one_process"] = parity.max_weights_diff
    results["lessonlib"]["max_grad_diff_vs_one_process"] = parity.max_grads_diff
    record = labkit.result("pp", world_size, settings, results, ranks[0])
    record["command"] = "python labs/pp.py " + " ".join(sys.argv[1:])
    theory = {"conventions": {"bubble_wall": "(p-1)/(v m+p-1) of wall time, GPipe §2.3; "
                                             "zero-bubble schedules at T_F = T_B = T_W",
                              "bubble_ideal": "(p-1)/(v m) of ideal time, Megatron-LM 2021 §2.2; "
                                              "ZB-H1 a third of it (Qi et al. 2024, Table 2)",
                              "peak_stash": "1F1B min(p - stage, m) (PipeDream-Flush §3.2), "
                                            "GPipe m; interleaved and zero-bubble from the "
                                            "simulated schedule, in (micro-batch, chunk) units"},
              "bubble_wall": {}, "bubble_ideal": {}, "peak_stash": {}}
    for r in rows:
        if r.engine == "lessonlib":
            key = f"m={r.m}"
            theory["bubble_wall"][f"{r.schedule} {key}"] = r.bubble_theory_wall
            theory["bubble_ideal"][f"{r.schedule} {key}"] = r.bubble_theory_ideal
            theory["peak_stash"].setdefault(r.schedule, {})[key] = r.peak_stash_theory
    record["theory"] = theory
    torch_time = {(r.schedule, r.m): r.step_time_s for r in rows if r.engine == "torch"}
    ours = {(r.schedule, r.m): r.step_time_s for r in rows if r.engine == "lessonlib"}
    record["ratio_lessonlib_over_torch"] = {}
    for (schedule, m), t in torch_time.items():
        record["ratio_lessonlib_over_torch"].setdefault(schedule, {})[f"m={m}"] = \
            ours[schedule, m] / t
    record["ratio_zb_h1_over_1f1b"] = {f"m={m}": t / ours["1f1b", m]
                                       for (s, m), t in ours.items()
                                       if s == "zb-h1" and ("1f1b", m) in ours}
    record["bubble_minus_theory"] = {
        f"{r.engine} {r.schedule} m={r.m}": r.bubble_mean - r.bubble_theory_wall
        for r in rows}
    record["rows"], record["headline"] = table(rows, record), HEADLINE
    for m, ratio in record["ratio_zb_h1_over_1f1b"].items():
        print(f"p={world_size} {m}: lessonlib ZB-H1 step / lessonlib 1F1B step = {ratio:.3f}")
    for schedule, torch_name in (("zb-h1", "ScheduleInterleavedZeroBubble"),
                                 ("zbv", "ScheduleZBVZeroBubble")):
        for m in sorted({r.m for r in rows if r.schedule == schedule}):
            ratio = record["ratio_lessonlib_over_torch"].get(schedule, {}).get(f"m={m}")
            print(f"p={world_size} m={m}: lessonlib {schedule} step / PyTorch's {torch_name} "
                  f"step = " + (f"{ratio:.3f}" if ratio else "(PyTorch's cannot run this m)"))
    return record


HEADLINE = labkit.headline("bubble_measured", x="m", series=["implementation", "schedule"],
                           predicted="bubble_predicted")


def table(rows: list[dict], record: dict) -> list[dict]:
    """The measured rows with stable columns: one per implementation, schedule and m."""
    ratios = record["ratio_lessonlib_over_torch"]
    return [{"implementation": r.engine, "schedule": r.schedule, "p": r.p, "m": r.m,
             "step_time_s": r.step_time_s,
             "step_time_over_torch": (ratios.get(r.schedule, {}).get(f"m={r.m}")
                                      if r.engine == "lessonlib" else None),
             "bubble_measured": r.bubble_mean,
             "bubble_predicted": r.bubble_theory_wall,
             "bubble_predicted_ideal": r.bubble_theory_ideal,
             "bubble_per_stage": r.bubble_per_stage,
             "peak_stash_per_stage": r.peak_stash_per_stage,
             "peak_stash_predicted": r.peak_stash_theory,
             "peak_stash_bytes_per_stage": r.peak_stash_bytes_per_stage} for r in rows]


def check_settings(p, args) -> dict:
    labargs.check_positive(p, args, "world-size", "steps", "width", "layers-per-stage",
                          "microbatch-size", "v")
    if args.warmup < 0:
        p.error(f"--warmup must be 0 or more; got {args.warmup}")
    if args.threads is not None:
        labargs.check_threads(p, args)
    if not args.microbatches or any(m < 1 for m in args.microbatches):
        p.error(f"--microbatches must be positive integers, e.g. 2 4 8; got {args.microbatches}")
    labargs.check_fits(p, args, "the activations a GPipe stage keeps (m b width layers "
                               "floats)",
                      [("--microbatches", max(args.microbatches)),
                       ("--microbatch-size", args.microbatch_size), ("--width", args.width),
                       ("--layers-per-stage", args.layers_per_stage)])
    labargs.check_fits(p, args, "a stage's weights (width^2 layers floats)",
                      [("--width", args.width), ("--width", args.width),
                       ("--layers-per-stage", args.layers_per_stage)])
    if "zbv" in args.schedules and args.layers_per_stage % 2:
        p.error(f"--schedules zbv runs two chunks per stage: --layers-per-stage must be even; "
                f"got {args.layers_per_stage}")
    if "interleaved" in args.schedules:
        bad = [m for m in args.microbatches if m % args.world_size]
        if bad or args.layers_per_stage % args.v:
            p.error(f"--schedules interleaved needs every m a multiple of p={args.world_size} "
                    f"(got {bad}) and --layers-per-stage divisible by --v {args.v}")
    return {"microbatches": args.microbatches, "schedules": args.schedules, "width": args.width,
            "layers_per_stage": args.layers_per_stage, "micro": args.microbatch_size,
            "v": args.v, "steps": args.steps, "warmup": args.warmup, "threads": args.threads,
            "pin": args.pin, "input_grad": not args.no_input_grad,
            "model": "mlp_stack (Linear+GeLU), balanced stages", "loss": "mse"}


def main(argv=None):
    p = labargs.parser("pp", __doc__.splitlines()[0])
    p.set_defaults(steps=10, warmup=2)
    p.add_argument("--microbatches", type=int, nargs="+", default=[2, 4, 8], help="values of m")
    p.add_argument("--schedules", nargs="+", default=["gpipe", "1f1b"], choices=SCHEDULES)
    p.add_argument("--width", type=int, default=1024, help="hidden width of every layer")
    p.add_argument("--layers-per-stage", type=int, default=8)
    p.add_argument("--microbatch-size", type=int, default=128, help="b, rows per micro-batch")
    p.add_argument("--v", type=int, default=2, help="chunks per device for 'interleaved'")
    p.add_argument("--threads", type=int, default=1,
                   help="compute threads per rank (1: ranks do not share cores)")
    p.add_argument("--pin", action="store_true", help="bind rank r to CPU core r")
    p.add_argument("--no-input-grad", action="store_true",
                   help="stage 0 skips its input's gradient (its backward gets shorter than "
                        "the other stages', which adds to the measured bubble)")
    args = labkit.parse(p, argv, fp32_only="its stages receive activations in fp32 buffers")
    settings = check_settings(p, args) | {"dtype": args.dtype}
    record = build_record(labkit.on_ranks(worker, args, settings), settings, args.world_size)
    return labkit.emit(record, args.json)


if __name__ == "__main__":
    main()
