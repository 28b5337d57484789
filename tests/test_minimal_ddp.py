"""labs/minimal_ddp.py, the script students copy, runs under torchrun on CPU ranks and
keeps its replicas identical."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(240)
def test_minimal_ddp_runs_under_torchrun_on_cpu_ranks():
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2", str(ROOT / "labs" / "minimal_ddp.py")],
                          capture_output=True, text=True, timeout=220, cwd=ROOT)
    # a failure shows what the ranks printed too (torchrun's summary alone fills 2000 chars)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-6000:]
    assert "2 ranks on cpu; replicas identical: True" in done.stdout
    assert done.stdout.count("epoch ") == 3
