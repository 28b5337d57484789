"""A sweep as a SLURM job array, end to end on stand-in SLURM: ``sbatch`` runs the array's
tasks here in the background (one after another, as a queue with one free node would) and
returns at once, ``squeue`` lists the tasks not yet done, ``srun`` and ``scontrol`` serve
the torchrun template as labs/slurm/dry_run.sh's do. Of the grid's two points, one fails."""
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lessonlib.lab import results

ROOT = Path(__file__).resolve().parent.parent

SBATCH = r"""#!/usr/bin/env bash
# --parsable --array=0-N --job-name=.. --output=PATTERN [...] SCRIPT ARGS: queue every task,
# run them one by one in the background, print the job id at once.
array="" output="" ; while [ "${1#-}" != "$1" ]; do
  case "$1" in --array=*) array="${1#*=}" ;; --output=*) output="${1#*=}" ;; esac; shift
done
job=$(( 1000 + RANDOM % 8000 ))
last="${array#*-}"
mkdir -p "$FAKE_QUEUE/$job"
for (( i = 0; i <= last; i++ )); do echo PENDING > "$FAKE_QUEUE/$job/$i"; done
(
  for (( i = 0; i <= last; i++ )); do
    echo RUNNING > "$FAKE_QUEUE/$job/$i"
    log="${output//\%a/$i}"
    # The template's port from the job id may be taken here (tests run side by side); a
    # taken port makes torchrun wait a minute as a client, then fail. Ask the kernel.
    RDZV_PORT=$("$FAKE_PYTHON" -c "$FREE_PORT") \
    SLURM_ARRAY_TASK_ID=$i SLURM_ARRAY_JOB_ID=$job SLURM_JOB_ID=$(( job * 10 + i )) \
      SLURM_JOB_NODELIST=fake-node SLURM_NNODES=1 SLURM_SUBMIT_DIR="$PWD" \
      SLURM_CPUS_PER_TASK=1 bash "$@" > "$log" 2>&1
    rm -f "$FAKE_QUEUE/$job/$i"
  done
) > /dev/null 2>&1 < /dev/null &
disown
echo "$job"
"""

SQUEUE = r"""#!/usr/bin/env bash
# -h -r -j JOB -o "%i %T": one line per task still queued or running.
job="" ; while [ $# -gt 0 ]; do [ "$1" = "-j" ] && job="$2"; shift; done
for f in "$FAKE_QUEUE/$job"/*; do [ -e "$f" ] && echo "${job}_$(basename "$f") $(cat "$f")"; done
exit 0
"""

SRUN = r"""#!/usr/bin/env bash
# The torchrun template's `srun --ntasks-per-node=1 ... CMD`: one task on one node.
while [ "${1#-}" != "$1" ]; do shift; done
SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_NTASKS=1 exec "$@"
"""

FREE_PORT = ('import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); '
             'print(s.getsockname()[1])')

SCONTROL = """#!/usr/bin/env bash
[ "$1 $2" = "show hostnames" ] && echo 127.0.0.1
"""


def stand_in_slurm(folder: Path) -> dict:
    """A PATH with the stand-ins first, and the environment they share."""
    (folder / "bin").mkdir()
    for name, text in {"sbatch": SBATCH, "squeue": SQUEUE, "srun": SRUN,
                       "scontrol": SCONTROL}.items():
        path = folder / "bin" / name
        path.write_text(text)
        path.chmod(0o755)
    (folder / "queue").mkdir()
    return {**os.environ, "PATH": f"{folder / 'bin'}:{os.environ['PATH']}",
            "FAKE_QUEUE": str(folder / "queue"), "FAKE_PYTHON": sys.executable,
            "FREE_PORT": FREE_PORT, "PYTHONPATH": str(ROOT)}


def sweep(env, *args, timeout=120):
    return subprocess.run([sys.executable, str(ROOT / "labs" / "sweep.py"), *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.timeout(400)
@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_a_grid_runs_as_one_job_array_and_is_collected(tmp_path):
    env = stand_in_slurm(tmp_path)
    out = tmp_path / "sweep"
    # microbatches=3 fails: the interleaved schedule needs m a multiple of p = 2
    grid = ["--lab", "pp", "--grid", "microbatches=2,3", "--set", "world_size=2",
            "--set", "schedules=1f1b interleaved", "--set", "steps=1", "--set", "warmup=0",
            "--set", "width=16", "--set", "layers_per_stage=2", "--set", "microbatch_size=2",
            "--slurm", "--out", str(out)]
    submitted = sweep(env, *grid)
    assert submitted.returncode == 0, submitted.stderr[-3000:]
    assert "submitted job array" in submitted.stdout and "--collect" in submitted.stdout
    assert len(list((out / "points").glob("*.args"))) == 2
    first = sweep(env, "--collect", str(out))          # right away: nothing has finished
    assert first.returncode == 0, first.stderr[-3000:]
    assert "not finished" in first.stdout
    deadline = time.monotonic() + 330
    while list((tmp_path / "queue").glob("*/*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    again = sweep(env, *grid, "--plot")                 # the same command again: gathers
    assert again.returncode == 0, again.stderr[-3000:]
    assert "1 of 2 points ok" in again.stdout and "failed: points [1]" in again.stdout
    assert "point 1 (pp): failed, exit" in again.stdout
    assert "multiple of p=2" in again.stdout            # the failed point's log tail
    rows = results.load(out)
    ok = [r for r in rows if r["status"] == "ok"]
    assert {(r["microbatches"], r["m"]) for r in ok} == {(2, 2)}
    assert {r["implementation"] for r in ok} == {"lessonlib", "torch"}
    assert len({frozenset(r) for r in ok}) == 1         # one set of columns for every row
    assert (out / "plot.png").stat().st_size > 10_000
    meta = json.loads((out / "table.json").read_text())
    assert meta["swept"] == ["microbatches"] and meta["headlines"]["pp"]["metric"]
