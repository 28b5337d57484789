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


def start_escapees(pid_file: str, then: str = "return") -> list[int]:
    """Start processes that leave the rank's process group: one in a new session, one in a
    group of its own, and a daemon's grandchild (orphaned at once, in a new session); write
    their pids; then return, leave with ``os._exit(3)`` as a crash would, or hang."""
    own_group = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}
    session = subprocess.Popen(["sleep", "78"], start_new_session=True)
    group = subprocess.Popen(["sleep", "78"], **own_group)
    daemon = subprocess.run(["sh", "-c", "sleep 78 >/dev/null 2>&1 & echo $!"],
                            capture_output=True, text=True, start_new_session=True)
    pids = [session.pid, group.pid, int(daemon.stdout)]
    Path(f"{pid_file}.{dist.get_rank()}").write_text(" ".join(map(str, pids)))
    dist.barrier()          # every rank has written its pids before one of them leaves
    if then == "exit":
        os._exit(3)
    while then == "hang":
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
