"""Each lab's default run, timed: wall seconds and the CPU seconds of every process it started.

    python tools/lab_times.py [LAB ...]        # default: every lab of labs/README.md's table
    python tools/lab_times.py --predict        # the cost model's GPU time for the same runs

Each lab runs once with its defaults (its record written to a temporary folder, its output
kept out of sight), one after another. CPU time is user + system time of the lab and of all
its descendants: this process makes itself their subreaper (Linux), so the fork server and
the ranks it started are waited for here and their time is counted even after the lab has
exited. Prints one Markdown table row per lab, as labs/README.md shows them.

``--predict`` prices the same default runs with the cost model (``lessonlib.costmodel``) on
H100s (8 per server), at one GPU and at eight (the lab's own axis eight ways): one step of the
lab's model, times the steps the run takes. It prices the GPU's work only, nothing of
starting the ranks or of Python's time per operation.
"""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LABS = ["launch_overhead", "allreduce", "ddp", "zero", "mp", "tp", "pp", "cp", "hybrid",
        "train", "ep", "fp8"]
PR_SET_CHILD_SUBREAPER = 36
VOCAB = 27               # the castle corpus's characters
# Each transformer lab's default run as the cost model sees it: its model (L, h, a, s), the
# sequences of one step per GPU, the steps the run takes in all (warm-up and timed steps,
# times the implementations and rounds it compares) and the axis its eight GPUs split.
RUNS = {
    "ddp": ((6, 384, 6, 64), 4, 72, "d"),        # TEN_M; 3 rungs x 2 rounds x 12 steps
    "zero": ((4, 64, 4, 32), 4, 180, "d"),       # 5 stages x 3 rounds x 12 steps
    "mp": ((8, 64, 4, 32), 8, 36, "p"),          # 3 rounds x 12 steps of the p-stage line
    "tp": ((1, 256, 8, 128), 8, 92, "t"),        # one layer; 2 kinds x 2 implementations x 23
    "hybrid": ((4, 64, 4, 32), 8, 7, "tpd"),     # each layout 7 steps; priced: t = p = d = 2
    "train": ((2, 128, 4, 64), 32, 600, "d"),
    "fp8": ((2, 32, 2, 16), 4, 24, "d"),         # 4 recipes x 6 steps
}


def become_subreaper() -> None:
    """Orphaned descendants (a fork server outliving its lab) become this process's children."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def reap_all() -> float:
    """Wait for every child left; return their user + system seconds."""
    cpu = 0.0
    while True:
        try:
            _, _, usage = os.wait4(-1, 0)
        except ChildProcessError:
            return cpu
        cpu += usage.ru_utime + usage.ru_stime


def time_lab(lab: str, folder: Path) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds, exit code) of ``labs/<lab>.py`` with its defaults."""
    argv = [sys.executable, str(ROOT / "labs" / f"{lab}.py"), "--json", str(folder / f"{lab}.json")]
    if lab == "train":
        argv += ["--checkpoint-dir", str(folder / "train-checkpoints")]
    start = time.perf_counter()
    child = subprocess.Popen(argv, cwd=folder, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)   # reaped here, not by Popen
    cpu = usage.ru_utime + usage.ru_stime + reap_all()
    return time.perf_counter() - start, cpu, child.returncode


def predicted_s(lab: str, gpus: int) -> tuple[float, float]:
    """(one step, the whole run) in seconds on ``gpus`` H100s, by the cost model."""
    from lessonlib.costmodel import GPT, GPUS, Layout, estimate, make_cluster

    (L, h, a, s), b, steps, axis = RUNS[lab]
    split = {"t": 1, "p": 1, "d": 1}
    if gpus > 1:
        split = ({"t": 2, "p": 2, "d": 2} if axis == "tpd" else {**split, axis: gpus})
    layout = Layout(**split, b=b, m=1, recompute="none")
    step = estimate(GPT(L=L, h=h, a=a, s=s, V=VOCAB), layout,
                    make_cluster(GPUS["H100-SXM5"], gpus_per_node=8)).step_time_s
    return step, step * steps


def predict() -> None:
    print("| lab | steps | 1 GPU: step, run | 8 GPUs: step, run |\n|---|---|---|---|")
    for lab, (_, _, steps, _) in RUNS.items():
        (one, run1), (eight, run8) = predicted_s(lab, 1), predicted_s(lab, 8)
        print(f"| `{lab}.py` | {steps} | {one * 1e6:.3g} us, {run1 * 1e3:.2g} ms | "
              f"{eight * 1e6:.3g} us, {run8 * 1e3:.2g} ms |")


def main(labs: list[str]) -> None:
    become_subreaper()
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start", flush=True)
    print("| lab | wall | CPU time (all processes) | exit |\n|---|---|---|---|", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for lab in labs:
            wall, cpu, code = time_lab(lab, Path(tmp))
            print(f"| `{lab}.py` | {wall:.0f} s | {cpu:.0f} s | {code} |", flush=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["--predict"]:
        predict()
    else:
        main(sys.argv[1:] or LABS)
