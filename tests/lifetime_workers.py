"""Rank functions for tests/test_launcher_lifetime.py (imported by the ranks by name)."""
import multiprocessing
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch.distributed as dist


def start_children(pid_file: str, then_hang: bool = False) -> list[int]:
    """Start a process with ``subprocess`` and a fork-started ``multiprocessing`` child, write
    their pids, and return them (or hang, for the timeout)."""
    sleeper = subprocess.Popen(["sleep", "77"])
    forked = multiprocessing.get_context("fork").Process(target=time.sleep, args=(77,))
    forked.start()
    pids = [sleeper.pid, forked.pid]
    Path(f"{pid_file}.{dist.get_rank()}").write_text(" ".join(map(str, pids)))
    while then_hang:
        time.sleep(1)
    return pids


def close_stdout_and_return(value):
    print("a line before the close")
    sys.stdout.close()
    return value


def return_a_lock():
    return threading.Lock()


def wait_for(path: str):
    """Wait until ``path`` exists (the test's signal), then join one collective."""
    while not os.path.exists(path):
        time.sleep(0.05)
    dist.barrier()
    return dist.get_rank()
