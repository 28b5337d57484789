"""Each lab's default run, timed: wall seconds and the CPU seconds of every process it started.

    python tools/lab_times.py [LAB ...]        # default: every lab of labs/README.md's table

Each lab runs once with its defaults (its record written to a temporary folder, its output
kept out of sight), one after another. CPU time is user + system time of the lab and of all
its descendants: this process makes itself their subreaper (Linux), so the fork server and
the ranks it started are waited for here and their time is counted even after the lab has
exited. Prints one Markdown table row per lab, as labs/README.md shows them.
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


def main(labs: list[str]) -> None:
    become_subreaper()
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start", flush=True)
    print("| lab | wall | CPU time (all processes) | exit |\n|---|---|---|---|", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for lab in labs:
            wall, cpu, code = time_lab(lab, Path(tmp))
            print(f"| `{lab}.py` | {wall:.0f} s | {cpu:.0f} s | {code} |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or LABS)
