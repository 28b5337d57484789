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
measured in the same run.

Laptop:  ``python labs/zero.py --world-size 2 --json results/zero.json``
GPU box: ``torchrun --nproc-per-node 8 labs/zero.py --json results/zero.json``
         (NCCL, one GPU per rank; SLURM: ``sbatch labs/slurm/torchrun.sbatch zero ...``)
"""
from __future__ import annotations

import sys
from dataclasses import asdict

import lessonlib
from lessonlib import labkit
from lessonlib.data_parallel.bench import slowest_rank_median
from lessonlib.data_parallel.sharded import padded_numel, ring_bytes_per_rank, zero_stage_bytes
from lessonlib.data_parallel.zero_bench import zero_bench
from lessonlib.data_parallel.zero_runs import OPTIMIZERS, build_model
from lessonlib.models import GPTConfig

STAGES = {"0": "lessonlib_stage0", "1": "lessonlib_stage1", "2": "lessonlib_stage2",
          "3": "lessonlib", "3-noprefetch": "lessonlib_no_prefetch", "torch-fsdp2": "torch",
          "torch-fsdp2-2": "torch_stage2"}
ZERO_STAGE = {"0": 0, "1": 1, "2": 2, "3": 3, "3-noprefetch": 3, "torch-fsdp2": 3,
              "torch-fsdp2-2": 2}
# Step-time ratios measured in the same run: stage 3 against fully_shard, and prefetching's effect.
RATIOS = {"lessonlib_vs_torch_step_time": ("lessonlib", "torch"),
          "prefetch_vs_none_step_time": ("lessonlib", "lessonlib_no_prefetch")}
STATE_BYTES = {"sgd": 4, "adamw": 8}              # fp32 momentum; AdamW's two moments


def predicted(stage: str, cfg: GPTConfig, n: int, optimizer: str, bf16: bool) -> dict:
    """ZeRO's per-stage bytes for this model (padding as each stage pads), and the bytes a
    step sends per rank on a ring."""
    params = list(build_model(cfg, 0).parameters())
    p = sum(t.numel() for t in params)
    padded = (sum(padded_numel(t.shape, n) for t in params) if stage != "1"
              else n * -(-p // n))
    # Gathered weights are in the compute dtype; shards, gradients and state stay fp32.
    width = 2 if bf16 and ZERO_STAGE[stage] >= 2 else 4
    held = zero_stage_bytes(ZERO_STAGE[stage], p, n, padded, width, 4, STATE_BYTES[optimizer])
    size = 4 * (padded if ZERO_STAGE[stage] else p)
    factor = 3 if ZERO_STAGE[stage] == 3 else 2
    return {"bytes_held": held, "bytes_sent_per_rank": factor * (n - 1) / n * size}


def summarize(ranks: list[dict], args, cfg: GPTConfig) -> dict:
    n, out = len(ranks), {}
    for stage in args.stages:
        runs = [r["runs"][stage] for r in ranks]
        t = slowest_rank_median([run["times"] for run in runs])
        entry = {"what": stage, "step_time_s": t, "samples_per_s": n * args.batch / t,
                 "bytes_held_per_rank": [run["held"] for run in runs],
                 "peak_allocated_bytes_per_rank": [run["peak_bytes"] for run in runs],
                 "predicted": predicted(stage, cfg, n, args.optimizer, args.bf16)}
        if not stage.startswith("torch"):       # FSDP2 calls torch.distributed itself: no ledger
            entry["bytes_sent_per_rank"] = [ring_bytes_per_rank(run["ledger"], n)
                                            for run in runs]
            entry["collectives_per_step"] = {op: e["calls"] for op, e in runs[0]["ledger"].items()}
        out[STAGES[stage]] = entry
    return out


def main(argv=None):
    p = labkit.parser("zero", "Time ZeRO stages 0-3 against FSDP2's fully_shard.")
    p.add_argument("--stages", default="0,1,2,3,3-noprefetch,torch-fsdp2",
                   help=f"comma-separated, from {','.join(STAGES)}")
    p.add_argument("--optimizer", default="adamw", choices=list(OPTIMIZERS))
    p.add_argument("--batch", type=int, default=4, help="sequences per rank per step")
    p.add_argument("--rounds", type=int, default=3, help="turns the stages take")
    p.add_argument("--bf16", action="store_true",
                   help="gather and compute in bfloat16 (shards and optimizer stay fp32)")
    p.add_argument("--layers", type=int, default=4, help="L")
    p.add_argument("--hidden", type=int, default=64, help="h")
    p.add_argument("--heads", type=int, default=4, help="a")
    p.add_argument("--seq", type=int, default=32, help="s")
    args = p.parse_args(argv)
    labkit.check_positive(p, args, "world-size", "steps", "batch", "rounds", "layers",
                          "hidden", "heads", "seq")
    if args.warmup < 0:
        p.error(f"--warmup must be 0 or more; got {args.warmup}")
    if args.hidden % args.heads:
        p.error(f"--hidden {args.hidden} must be divisible by --heads {args.heads}")
    args.stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    if not args.stages or any(s not in STAGES for s in args.stages):
        p.error(f"--stages {','.join(args.stages)}: choose from {','.join(STAGES)}")
    cfg = GPTConfig(vocab=27, seq=args.seq, hidden=args.hidden, heads=args.heads,
                    layers=args.layers)
    command = "python labs/zero.py " + " ".join(sys.argv[1:] if argv is None else argv)
    ranks = lessonlib.run(zero_bench, args.world_size, args.stages, cfg, args.optimizer,
                          batch=args.batch, steps=args.steps, warmup=args.warmup,
                          rounds=args.rounds, compute_dtype="bfloat16" if args.bf16 else None,
                          timeout=args.timeout)
    settings = {"config": asdict(cfg), "parameters": ranks[0]["parameters"],
                "optimizer": args.optimizer, "batch_per_rank": args.batch,
                "steps": args.steps, "rounds": args.rounds, "bf16": args.bf16,
                "command": command}
    results = summarize(ranks, args, cfg)
    record = labkit.result("zero", len(ranks), settings, results, ranks[0]["info"])
    for key, (a, b) in RATIOS.items():
        if a in results and b in results:
            record[key] = results[a]["step_time_s"] / results[b]["step_time_s"]
    labkit.emit(record, args.json)
    return record


if __name__ == "__main__":
    main()
