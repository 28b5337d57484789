"""What it costs to start a distributed run: launch 4 CPU ranks that do one all-reduce.

Every lesson pays this before any training happens, so the course reports it and what it
is made of: starting the processes (a fresh interpreter importing torch, per rank), joining
the process group (the TCP rendezvous), the work itself, and shutting down.

Laptop:  python labs/launch_overhead.py --world-size 4 --repeats 5 [--json results/launch.json]
GPU box: the same command; with 4 GPUs visible the ranks use NCCL.
"""
import statistics
import time

import torch

import lessonlib
from lessonlib import comm, device, labkit, launcher


def one_all_reduce() -> dict:
    start = time.time()
    x = torch.ones(1, device=device.current_device())
    comm.all_reduce(x)
    device.synchronize()
    return {"fn_start": start, "fn_end": time.time(),
            **launcher.phase_times, "sum": x.item(), **labkit.rank_info()}


def measure(world_size: int, backend: str) -> dict:
    t0 = time.time()
    ranks = lessonlib.launch(one_all_reduce, world_size, backend=backend)
    t1 = time.time()
    assert all(r["sum"] == world_size for r in ranks)
    last = lambda key: max(r[key] for r in ranks)  # noqa: E731  (the slowest rank sets the pace)
    return {"total_s": t1 - t0,
            "spawn_interpreter_and_import_torch_s": last("entered") - t0,
            "join_process_group_s": last("group_ready") - last("entered"),
            "work_s": last("fn_end") - last("group_ready"),
            "shutdown_and_collect_s": t1 - last("fn_end"),
            "info": {k: ranks[0][k] for k in ("backend", "device")}}


def main():
    p = labkit.parser("launch_overhead", __doc__.splitlines()[0])
    p.set_defaults(world_size=4)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    labkit.check_positive(p, args, "world-size", "repeats")
    runs = [measure(args.world_size, args.backend) for _ in range(args.repeats)]
    phases = [k for k in runs[0] if k.endswith("_s")]
    medians = {k: statistics.median(r[k] for r in runs) for k in phases}
    record = labkit.result("launch_overhead", args.world_size, {"repeats": args.repeats},
                           {"lessonlib": medians}, runs[0]["info"])
    labkit.emit(record, args.json)


if __name__ == "__main__":
    main()
