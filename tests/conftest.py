import os
import sys
from pathlib import Path

# One compute thread per process (before torch is imported): the test workers, their
# notebook kernels and their ranks share the cores, and torch's threads spinning against
# each other slow a step down 10x. `make test` sets the same; an explicit value wins.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import psutil  # noqa: E402
import pytest  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture
def no_children_left():
    """Fails the test if any child process of this test outlives it."""
    yield
    left = [p for p in psutil.Process().children(recursive=True) if is_rank_process(p)]
    assert not left, f"child processes left behind: {[p.pid for p in left]}"


def is_rank_process(proc: psutil.Process) -> bool:
    """A live child that is neither multiprocessing's resource tracker nor the launcher's fork
    server (one each per caller, by design; both end with their caller). The server is told
    apart from the ranks it forks (same command line): its parent is not a fork server."""
    try:
        alive = proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
        cmdline = " ".join(proc.cmdline())
        server = ("multiprocessing.forkserver" in cmdline
                  and "multiprocessing.forkserver" not in " ".join(proc.parent().cmdline()))
        return alive and "resource_tracker" not in cmdline and not server
    except psutil.NoSuchProcess:
        return False
