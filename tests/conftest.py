import sys
from pathlib import Path

import psutil
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture
def no_children_left():
    """Fails the test if any child process of this test outlives it."""
    yield
    left = [p for p in psutil.Process().children(recursive=True) if is_rank_process(p)]
    assert not left, f"child processes left behind: {[p.pid for p in left]}"


def is_rank_process(proc: psutil.Process) -> bool:
    """A live child that is not multiprocessing's resource tracker (one per caller, by design)."""
    try:
        alive = proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
        return alive and "resource_tracker" not in " ".join(proc.cmdline())
    except psutil.NoSuchProcess:
        return False
