"""However labs/sweep.py ends, no process of its running point outlives it: SIGINT (Ctrl-C),
SIGTERM (``kill``, ``timeout``, a batch job's end), SIGHUP (a closed terminal) and the death
of the process that started it each end the point's whole process group. Checked with the OS (psutil):
every process below the sweep while the point ran is gone afterwards.

The point runs a stand-in interpreter (``--python``): a small script that reads as a lab to
the sweep and starts a child and a grandchild in its process group, so each run takes about a
second (a real lab's point takes 10-20 s to start its fork server and ranks on 2 cores; the
launcher's own tests show its ranks end with the lab that started them)."""
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
STAND_IN = """#!{python}
import subprocess, sys, time
if "--help" in sys.argv:
    print("usage: lab [--steps STEPS] [--json JSON]")
    sys.exit(0)
sleeper = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', " \\
          "'import time; time.sleep(600)']); time.sleep(600)"
subprocess.Popen([sys.executable, "-c", sleeper])       # a child, which starts a grandchild
time.sleep(600)
"""


def _stand_in(tmp_path) -> str:
    path = tmp_path / "python"
    path.write_text(STAND_IN.format(python=sys.executable))
    path.chmod(0o755)
    return str(path)


def _below(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _alive(processes) -> list[psutil.Process]:
    alive = []
    for p in processes:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.NoSuchProcess:
            pass
    return alive


def _run_and_stop(argv, how: str, until_processes: int) -> tuple[int, str, list]:
    """Start the sweep (below a shell when ``how`` is "parent"), wait until
    ``until_processes`` processes run below it, stop it, and return its exit status, its
    stderr and every process seen below it."""
    command = argv if how != "parent" else ["sh", "-c", " ".join(argv) + "; true"]
    # Ctrl-C reaches the sweep as a terminal would deliver it, however the suite was started
    # (a shell without job control starts its background jobs with SIGINT ignored, and every
    # process inherits that)
    top = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    seen, now, deadline = {}, [], time.monotonic() + 60
    try:
        while len(now) < until_processes + (how == "parent") and time.monotonic() < deadline:
            now = _below(top.pid)
            seen |= {p.pid: p for p in now}
            time.sleep(0.05)
        assert len(now) >= until_processes, f"only {len(now)} processes started"
        if how == "parent":
            top.kill()                                      # the shell dies; the sweep hears it
        else:
            top.send_signal(getattr(signal, how))
        top.wait(timeout=30)
        end = time.monotonic() + 10
        while _alive(seen.values()) and time.monotonic() < end:
            time.sleep(0.05)
        return top.returncode, top.stderr.read(), list(seen.values())
    finally:
        for p in _alive(seen.values()):
            p.kill()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM", "SIGHUP", "parent"])
def test_however_the_sweep_ends_no_process_of_its_point_is_left(tmp_path, how):
    argv = [sys.executable, "labs/sweep.py", "--lab", "ddp", "--set", "steps=1",
            "--python", _stand_in(tmp_path), "--out", str(tmp_path / "sweep")]
    code, err, seen = _run_and_stop(argv, how, until_processes=3)
    assert _alive(seen) == [], f"left running: {[p.pid for p in _alive(seen)]}"
    if how != "parent":
        assert code == 128 + getattr(signal, how), err
        assert f"labs/sweep.py: stopped by {how}; the running point and every process" in err
