"""What it costs to start a distributed run: launch 4 CPU ranks that do one all-reduce, cold and warm.

Every lesson pays this before any training happens, so the course reports it and what it
is made of: starting the processes, joining the process group (the rendezvous), the work
itself, and shutting down. A *cold* launch spawns fresh interpreters that each import torch;
a *warm* one (lessonlib's default) forks them from a server that imported torch once. The
yardstick beside them: the same number of fresh interpreters that only import torch.

Laptop:  python labs/launch_overhead.py --world-size 4 --repeats 5 [--json results/launch.json]
         From a notebook cell (the kernel is the caller):
         import sys; sys.path.insert(0, "../labs"); import launch_overhead; launch_overhead.compare(4, 5)
GPU box: the same command; with 4 GPUs visible the ranks use NCCL.
"""
import statistics
import subprocess
import sys
import time

import torch

import lessonlib
from lessonlib import comm, device, launcher
from lessonlib.lab import labargs, labkit


def one_all_reduce() -> dict:
    start = time.time()
    x = torch.ones(1, device=device.current_device())
    comm.all_reduce(x)
    device.synchronize()
    return {"fn_start": start, "fn_end": time.time(),
            **launcher.phase_times, "sum": x.item(), **labkit.rank_info()}


def measure(world_size: int, backend: str, warm: bool = True) -> dict:
    t0 = time.time()
    ranks = lessonlib.launch(one_all_reduce, world_size, backend=backend, warm=warm)
    t1 = time.time()
    assert all(r["sum"] == world_size for r in ranks)
    last = lambda key: max(r[key] for r in ranks)  # noqa: E731  (the slowest rank sets the pace)
    return {"total_s": t1 - t0,
            "start_processes_s": last("entered") - t0,
            "join_process_group_s": last("group_ready") - last("entered"),
            "work_s": last("fn_end") - last("group_ready"),
            "shutdown_and_collect_s": t1 - last("fn_end"),
            "info": {k: ranks[0][k] for k in ("backend", "device")}}


def fresh_imports(n: int) -> float:
    """Seconds for n fresh interpreters, started together, to import torch and exit."""
    t0 = time.time()
    procs = [subprocess.Popen([sys.executable, "-c", "import torch"]) for _ in range(n)]
    if any(p.wait() for p in procs):
        raise RuntimeError("a fresh interpreter could not import torch")
    return time.time() - t0


def medians(runs: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0] if k.endswith("_s")}


def compare(world_size: int = 4, repeats: int = 5, backend: str = "auto") -> dict:
    """Median cold launch, warm launch (after one warm-up) and fresh torch imports."""
    cold = [measure(world_size, backend, warm=False) for _ in range(repeats)]
    measure(world_size, backend)  # the warm-up: starts the fork server, imports torch once
    warm = [measure(world_size, backend) for _ in range(repeats)]
    imports = statistics.median(fresh_imports(world_size) for _ in range(repeats))
    out = {"lessonlib": medians(warm), "lessonlib_cold": medians(cold),
           "fresh_interpreters_importing_torch": {"total_s": imports}, "info": warm[0]["info"]}
    out["warm_over_fresh_imports"] = out["lessonlib"]["total_s"] / imports
    return out


def main():
    p = labargs.parser("launch_overhead", __doc__.splitlines()[0])
    p.set_defaults(world_size=4)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    labargs.check_positive(p, args, "world-size", "repeats")
    results = compare(args.world_size, args.repeats, args.backend)
    info = results.pop("info")
    record = labkit.result("launch_overhead", args.world_size, {"repeats": args.repeats},
                           results, info)
    labkit.emit(record, args.json)


if __name__ == "__main__":
    main()
