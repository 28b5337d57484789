"""FP8 training, per recipe: the GEMM error and the tiny GPT's step time, and the FP8 GEMM rate.

For each recipe (tensorwise, rowwise, blockwise) it reports the relative error of the tiny
GPT's first ``fc1`` GEMM against float64 on its real activations, as they are and with 3
channels times ``--outlier-factor`` (``lessonlib.precision.fp8_runs.gemm_errors``), and the
median training-step time of the tiny GPT with its linear layers in FP8 against the same
model without them (``none``). Then the FP8 GEMM rate: ``torch._scaled_mm`` in e4m3 against
a bf16 ``n x n @ n x n`` product, ``--gemm-size`` n. On a GPU (H100 or newer) this is the
number that matters (the dense FP8 peak is twice BF16's); on the CPU the rates are printed
too but say nothing about a GPU: the CPU's FP8 path is an emulation, not a faster unit.
Every rank measures the same; the record keeps rank 0's errors and, per step, the slowest
rank's time. Its ``rows``: one per recipe.

Laptop:  python labs/fp8.py --world-size 1 [--json results/fp8.json]
GPU box: python labs/fp8.py --world-size 1 --backend nccl --gemm-size 4096
"""
import copy

import torch
import torch.distributed as dist

from lessonlib import device
from lessonlib.lab import labargs, labkit
from lessonlib.models import TINY, TinyGPT
from lessonlib.precision import RECIPES, E4M3, convert_to_float8, gemm_errors, quantize
from lessonlib.precision.gemm import scaled_mm
from lessonlib.precision.fp8_runs import TINY_BLOCK, train


def _gemm_rate(n: int, fp8: bool, calls: int = 3) -> float:
    """TFLOP/s of one n x n x n product, FP8 (e4m3, tensorwise scales) or bf16."""
    dev = device.current_device()
    a, b = torch.randn(n, n, device=dev), torch.randn(n, n, device=dev)
    if fp8:
        a8, b8 = quantize(a, E4M3), quantize(b, E4M3)
        step = lambda: scaled_mm(a8, b8, torch.bfloat16)                        # noqa: E731
    else:
        a16, b16 = a.bfloat16(), b.bfloat16()
        step = lambda: a16 @ b16                                                 # noqa: E731
    seconds = labkit.median(labkit.time_steps(step, calls, 1))
    return 2 * n ** 3 / seconds / 1e12


def worker(settings: dict) -> dict:
    dev = device.current_device()
    errors = gemm_errors((1, settings["outlier_factor"]), TINY_BLOCK, dev=dev)
    start = TinyGPT(TINY, 0).to(dev)
    times = {}
    for name in ("none", *RECIPES):
        model = copy.deepcopy(start)
        if name != "none":
            convert_to_float8(model, name, TINY_BLOCK)
        times[name] = labkit.time_steps(lambda m=model: train(m, 1), settings["steps"],
                                        settings["warmup"])
    rates = {kind: _gemm_rate(settings["gemm_size"], kind == "fp8") for kind in ("fp8", "bf16")}
    return {"rank": dist.get_rank(), **labkit.rank_info(), "times": times, "rates": rates,
            "errors": [(e.recipe, e.factor, e.relative_error) for e in errors]}


def build_record(ranks: list[dict], settings: dict, world_size: int) -> dict:
    first, factor = ranks[0], settings["outlier_factor"]
    errors = {(r, f): e for r, f, e in first["errors"]}
    results = {}
    for name in ("none", *RECIPES):
        slowest = [max(step) for step in zip(*(r["times"][name] for r in ranks))]
        results[name] = {"step_time_s": labkit.median(slowest),
                         "gemm_relative_error": errors.get((name, 1)),
                         "gemm_relative_error_outliers": errors.get((name, factor))}
    rates = first["rates"]
    record = labkit.result("fp8", world_size, settings, results, first)
    record["gemm_tflops"] = {**rates, "fp8_over_bf16": rates["fp8"] / rates["bf16"],
                             "n": settings["gemm_size"],
                             "note": "a GPU's FP8 units" if first["device"] != "cpu" else
                             "CPU rates: the FP8 path is emulated; they say nothing about a GPU"}
    record["rows"] = [{"recipe": name, "world_size": world_size, **row}
                      for name, row in results.items()]
    record["headline"] = labkit.headline("step_time_s", x="world_size", series=["recipe"])
    return record


def check_settings(p, args) -> dict:
    labargs.check_positive(p, args, "world-size", "steps", "gemm-size")
    if args.warmup < 0:
        p.error(f"--warmup must be 0 or more; got {args.warmup}")
    if args.gemm_size % 16:
        p.error(f"--gemm-size {args.gemm_size} must be a multiple of 16 (FP8 GEMMs on a GPU "
                f"need it), e.g. 512")
    if not args.outlier_factor >= 1:
        p.error(f"--outlier-factor must be 1 or more, e.g. 100000; got {args.outlier_factor}")
    labargs.check_fits(p, args, "the GEMM's three matrices",
                      [("--gemm-size", args.gemm_size), ("--gemm-size", args.gemm_size)],
                      itemsize=3 * 4)
    return {"steps": args.steps, "warmup": args.warmup, "gemm_size": args.gemm_size,
            "outlier_factor": args.outlier_factor}


def main(argv=None):
    p = labargs.parser("fp8", __doc__.splitlines()[0])
    p.set_defaults(steps=5, warmup=1)
    p.add_argument("--gemm-size", type=int, default=512, help="n of the rate's n^3 GEMM")
    p.add_argument("--outlier-factor", type=float, default=1e5,
                   help="the outlier channels' magnitude against the rest")
    args = labkit.parse(p, argv, fp32_only="the tiny GPT trains in fp32; FP8 is the point")
    settings = check_settings(p, args) | {"dtype": args.dtype}
    record = build_record(labkit.on_ranks(worker, args, settings), settings, args.world_size)
    return labkit.emit(record, args.json)


if __name__ == "__main__":
    main()
