"""labs/minimal_ddp.py, the script students copy, runs under torchrun on CPU ranks and
keeps its replicas identical.

On a loaded machine a rank sometimes aborts *after* the script's last line, in the
interpreter's teardown ("terminate called without an active exception", SIGABRT: measured
3 of 10 runs beside two busy processes, 0 of 24 alone, with or without the barrier and the
destroy at its end). Its work is done and checked by then; such a run is tried again, at most
twice, and any other failure counts at once."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FINAL = "2 ranks on cpu; replicas identical: True"
TEARDOWN_ABORT = "terminate called without an active exception"


def run_once():
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2", str(ROOT / "labs" / "minimal_ddp.py")],
                          capture_output=True, text=True, timeout=100, cwd=ROOT)


@pytest.mark.timeout(330)
def test_minimal_ddp_runs_under_torchrun_on_cpu_ranks():
    for _ in range(3):
        done = run_once()
        aborted_after_its_work = (done.returncode != 0 and FINAL in done.stdout
                                  and TEARDOWN_ABORT in done.stdout + done.stderr)
        if not aborted_after_its_work:
            break
    # a failure shows what the ranks printed too (torchrun's summary alone fills 2000 chars)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-6000:]
    assert FINAL in done.stdout
    assert done.stdout.count("epoch ") == 3
