"""Sharded data parallelism, timed: ZeRO stages 0-3 against FSDP2's ``fully_shard``.

What it teaches: what each ZeRO stage saves and what it costs. Every rank trains the same
tiny GPT on its shard of each batch with stage 0 (lessonlib's ``DataParallel``, everything
replicated), stage 1 (``ShardedOptimizer``), stage 2 and stage 3
(``FullyShardedDataParallel`` without and with resharding after forward) and PyTorch's
``fully_shard`` (FSDP2, stage 3), and reports for each: the median step time (slowest
rank), the bytes each rank holds for weights, gradients and optimizer state against ZeRO's
per-stage formula, ``torch.cuda.max_memory_allocated`` on a GPU, and the bytes one step
sends per rank (from the ledger) against 2(n-1)/n x S (stages 0-2) and 3(n-1)/n x S
(stage 3). ``lessonlib_vs_torch_step_time`` is lessonlib's stage 3 over ``fully_shard``'s,
measured in the same run. Each stage is also checked against one process: 2 steps of the
lab's optimizer on the tiny GPT (``SHARDING_CONFIG``: the check is about the shards, not the
size) from different random weights on every rank, in float32
(``max_weight_diff_vs_one_process``). ``--dtype bf16`` gathers and computes in bf16 (shards and
optimizer state stay fp32). ``--overlap`` adds the record's ``overlap``: for stage 3 with and
without prefetching the next unit's all-gather, the median seconds per step that
communication held a rank (``Ledger.exposed_seconds``: blocking calls whole, asynchronous
ones inside ``wait()``; slowest rank each step), and their ratio.

Laptop:  ``python labs/zero.py --world-size 2 --json results/zero.json``
GPU box: ``torchrun --nproc-per-node 8 labs/zero.py --json results/zero.json``
         (NCCL, one GPU per rank; SLURM: ``sbatch labs/slurm/torchrun.sbatch zero ...``)
"""
from __future__ import annotations

import sys
from dataclasses import asdict

import torch.distributed as dist

import lessonlib
from lessonlib.data_parallel.bench import slowest_rank_median
from lessonlib.data_parallel.sharded import ring_bytes_per_rank
from lessonlib.data_parallel.zero_bench import zero_bench
from lessonlib.data_parallel.zero_runs import (OPTIMIZERS, ZERO_STAGE, predicted, train_single,
                                               train_stage)
from lessonlib.lab import labargs, labkit
from lessonlib.models import GPTConfig, corpus_config

STAGES = {"0": "lessonlib_stage0", "1": "lessonlib_stage1", "2": "lessonlib_stage2",
          "3": "lessonlib", "3-noprefetch": "lessonlib_no_prefetch", "torch-fsdp2": "torch",
          "torch-fsdp2-2": "torch_stage2"}
PARITY_STEPS = 2             # the one-process check: its sharded global batch is 2n
# float32, sums in another order (and, on a GPU, other kernels than the CPU reference's);
# a stage that loses or double-counts a shard's gradient is off by ~lr (1e-2 or 5e-2)
PARITY_TOLERANCE = 1e-4
# Step-time ratios measured in the same run: stage 3 against fully_shard, and prefetching's effect.
RATIOS = {"lessonlib_vs_torch_step_time": ("lessonlib", "torch"),
          "prefetch_vs_none_step_time": ("lessonlib", "lessonlib_no_prefetch")}


def worker(stages, cfg: GPTConfig, optimizer: str, **timing) -> dict:
    """One rank: the stages timed, then each trained as in the one-process check (float32,
    the tiny GPT)."""
    out = zero_bench(stages, cfg, optimizer, **timing)
    out["parity_weights"] = {
        stage: train_stage(stage, optimizer, steps=PARITY_STEPS,
                           global_batch=2 * dist.get_world_size(), dtype="float32").weights
        for stage in stages}
    return out


def compare_parity(ranks: list[dict], optimizer: str) -> dict[str, float]:
    """Each stage's largest weight difference from one process on the whole batch, over the
    ranks and the weights; raises, naming the stage, rank and weight, beyond float32's
    rounding."""
    want, _ = train_single(optimizer, steps=PARITY_STEPS, global_batch=2 * len(ranks),
                           dtype="float32")
    diffs = {}
    for stage in ranks[0]["parity_weights"]:
        worst = (0.0, 0, "")
        for rank, r in enumerate(ranks):
            got = r["parity_weights"][stage]
            if set(got) != set(want):
                raise AssertionError(f"stage {stage}, rank {rank}: weights {sorted(got)}, "
                                     f"expected {sorted(want)}")
            for name in want:
                worst = max(worst, ((got[name] - want[name].double()).abs().max().item(),
                                    rank, name))
        if not worst[0] <= PARITY_TOLERANCE:
            raise AssertionError(f"stage {stage}, rank {worst[1]}: {worst[2]} differs from one "
                                 f"process by {worst[0]:.3g} after {PARITY_STEPS} steps "
                                 f"(float32 allows {PARITY_TOLERANCE:g})")
        diffs[stage] = worst[0]
    return diffs


def summarize(ranks: list[dict], settings: dict, cfg: GPTConfig) -> dict:
    n, out = len(ranks), {}
    diffs = compare_parity(ranks, settings["optimizer"])
    for stage in settings["stages"]:
        runs = [r["runs"][stage] for r in ranks]
        t = slowest_rank_median([run["times"] for run in runs])
        entry = {"what": stage, "step_time_s": t,
                 "samples_per_s": n * settings["batch_per_rank"] / t,
                 "bytes_held_per_rank": [run["held"] for run in runs],
                 "peak_allocated_bytes_per_rank": [run["peak_bytes"] for run in runs],
                 "predicted": predicted(stage, cfg, n, settings["optimizer"],
                                        settings["dtype"] == "bf16"),
                 "max_weight_diff_vs_one_process": diffs[stage]}
        if not stage.startswith("torch"):       # FSDP2 calls torch.distributed itself: no ledger
            entry["bytes_sent_per_rank"] = [ring_bytes_per_rank(run["ledger"], n)
                                            for run in runs]
            entry["collectives_per_step"] = {op: e["calls"] for op, e in runs[0]["ledger"].items()}
        out[STAGES[stage]] = entry
    return out


def check(p, args) -> dict:
    labargs.check_positive(p, args, "world-size", "steps", "batch", "rounds", "layers",
                          "hidden", "heads", "seq")
    if args.warmup < 0:
        p.error(f"--warmup must be 0 or more; got {args.warmup}")
    if args.hidden % args.heads:
        p.error(f"--hidden {args.hidden} must be divisible by --heads {args.heads}")
    labargs.check_gpt_fits(p, args, batch="batch")
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    if not stages or any(s not in STAGES for s in stages):
        p.error(f"--stages {args.stages}: choose from {','.join(STAGES)}")
    if args.overlap and not {"3", "3-noprefetch"} <= set(stages):
        p.error("--overlap compares stage 3 with and without prefetch: --stages must hold "
                "3 and 3-noprefetch")
    cfg = corpus_config(seq=args.seq, hidden=args.hidden, heads=args.heads, layers=args.layers)
    return ({"overlap": True} if args.overlap else {}) | {"config": asdict(cfg), "stages": stages, "optimizer": args.optimizer,
            "batch_per_rank": args.batch, "steps": args.steps, "warmup": args.warmup,
            "rounds": args.rounds,
            "command": "python labs/zero.py " + " ".join(sys.argv[1:])}


def measure(args, settings: dict) -> list[dict]:
    """``--dtype bf16`` is the sharded runs' compute dtype (gathered weights and math in bf16,
    shards and optimizer fp32), not autocast: so the lab launches its ranks itself."""
    return lessonlib.run(worker, args.world_size, settings["stages"],
                         GPTConfig(**settings["config"]), settings["optimizer"],
                         batch=settings["batch_per_rank"], steps=settings["steps"],
                         warmup=settings["warmup"], rounds=settings["rounds"],
                         compute_dtype="bfloat16" if args.dtype == "bf16" else None,
                         backend=args.backend, timeout=args.timeout)


def _row(name: str, r: dict, world_size: int) -> dict:
    """One stage as a row with the same columns as every other (None where not measured:
    FSDP2 sends outside the ledger)."""
    sent = r.get("bytes_sent_per_rank")
    return {"implementation": name, "zero_stage": ZERO_STAGE[r["what"]],
            "world_size": world_size, "step_time_s": r["step_time_s"],
            "samples_per_s": r["samples_per_s"],
            "bytes_held_per_rank": max(h["total"] for h in r["bytes_held_per_rank"]),
            "bytes_held_predicted": sum(r["predicted"]["bytes_held"].values()),
            "bytes_sent_per_rank": max(sent) if sent else None,
            "bytes_sent_predicted": r["predicted"]["bytes_sent_per_rank"],
            "max_weight_diff_vs_one_process": r["max_weight_diff_vs_one_process"]}


def exposed(ranks: list[dict]) -> dict:
    """Stage 3 with and without prefetch: median exposed seconds per step (slowest rank)."""
    out = {name: slowest_rank_median([r["runs"][stage]["exposed"] for r in ranks])
           for name, stage in (("prefetch", "3"), ("no_prefetch", "3-noprefetch"))}
    return {**out, "prefetch_over_none": out["prefetch"] / max(out["no_prefetch"], 1e-9)}


def build_record(ranks: list[dict], settings: dict, world_size: int) -> dict:
    results = summarize(ranks, settings, GPTConfig(**settings["config"]))
    shown = {**settings, "parameters": ranks[0]["parameters"]}
    record = labkit.result("zero", world_size, shown, results, ranks[0]["info"])
    for key, (a, b) in RATIOS.items():
        if a in results and b in results:
            record[key] = results[a]["step_time_s"] / results[b]["step_time_s"]
    record["rows"] = [_row(name, r, world_size) for name, r in results.items()]
    if settings.get("overlap"):
        record["overlap"] = exposed(ranks)
    record["headline"] = labkit.headline("bytes_held_per_rank", x="world_size",
                                         series=["implementation"],
                                         predicted="bytes_held_predicted")
    return record


def main(argv=None):
    p = labargs.parser("zero", "Time ZeRO stages 0-3 against FSDP2's fully_shard.")
    p.add_argument("--stages", default="0,1,2,3,3-noprefetch,torch-fsdp2",
                   help=f"comma-separated, from {','.join(STAGES)}")
    p.add_argument("--overlap", action="store_true",
                   help="report stage 3's exposed communication with and without prefetch")
    p.add_argument("--optimizer", default="adamw", choices=list(OPTIMIZERS))
    p.add_argument("--batch", type=int, default=4, help="sequences per rank per step")
    p.add_argument("--rounds", type=int, default=3, help="turns the stages take")
    p.add_argument("--layers", type=int, default=4, help="L")
    p.add_argument("--hidden", type=int, default=64, help="h")
    p.add_argument("--heads", type=int, default=4, help="a")
    p.add_argument("--seq", type=int, default=32, help="s")
    args = labkit.parse(p, argv)
    settings = check(p, args) | {"dtype": args.dtype}
    record = build_record(measure(args, settings), settings, args.world_size)
    return labkit.emit(record, args.json)


if __name__ == "__main__":
    main()
