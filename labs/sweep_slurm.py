"""A sweep on a SLURM cluster: the grid as one job array, collected when it is done.

What it teaches: a grid of points is what job arrays are for. ``submit`` writes each
point's lab and flags to ``points/NNNN-<lab>.args`` and hands the whole grid to the queue
as one ``sbatch --array=0-(N-1) labs/slurm/array.sbatch FOLDER``: array task i runs point i
with the torchrun template (``labs/slurm/torchrun.sbatch``) on the nodes it was given, and
leaves its record in ``points/``, its log in ``logs/`` and its exit code in
``points/NNNN.rc``. ``submit`` returns at once with the job id (kept in ``slurm.json``).
``collect`` (``labs/sweep.py --collect FOLDER``, or the same ``--slurm`` command again)
gathers the finished points into the table and lists the ones still pending or running
(from ``squeue``) and the failed ones, with the last lines of their logs.

Laptop (no SLURM): the tests stand in ``sbatch``, ``squeue``, ``srun`` and ``scontrol``
with scripts that run the array tasks here.
Cluster: python labs/sweep.py --lab pp --grid microbatches=4,8,16 --set world_size=8 --slurm
         python labs/sweep.py --collect results/sweeps/pp-1a2b3c4d --plot
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

from sweep_points import (LABS_DIR, error_line, lab_argv, log_tail, point_row, read_record,
                          table_meta, table_rows, write_table)

STATE = "slurm.json"
TEMPLATE = LABS_DIR / "slurm" / "array.sbatch"


def _points(jobs: list[tuple[str, list[dict]]]) -> list[tuple[int, str, dict]]:
    return [(i, lab, p) for i, (lab, p) in
            enumerate((lab, p) for lab, points in jobs for p in points)]


def _name(out: Path, index: int, lab: str, suffix: str) -> Path:
    return out / ("logs" if suffix == "log" else "points") / f"{index:04d}-{lab}.{suffix}"


def submit(jobs: list[tuple[str, list[dict]]], out: Path, opts) -> str:
    """Write every point's arguments and submit the grid as one array; the job id."""
    (out / "points").mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(exist_ok=True)
    for index, lab, point in _points(jobs):
        ranks = point.get("world_size") or str(opts.nproc_per_node or 1)
        argv = lab_argv(point, "torchrun") + ["--json",
                                              str(_name(out, index, lab, "json").resolve())]
        # one word a line: the lab, ranks per node, then the lab's flags (array.sbatch reads it)
        _name(out, index, lab, "args").write_text("\n".join([lab, ranks, *argv]) + "\n")
    n = len(_points(jobs))
    cmd = ["sbatch", "--parsable", f"--array=0-{n - 1}", f"--job-name=sweep-{out.name}",
           f"--output={(out / 'logs' / 'array-%a.log').resolve()}",
           *shlex.split(opts.sbatch_args or ""), str(TEMPLATE), str(out.resolve())]
    # sbatch passes its environment to the job: the array tasks run the same interpreter
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHON": opts.python})
    if done.returncode != 0:
        raise RuntimeError(f"sbatch refused the array (exit {done.returncode}): "
                           f"{(done.stderr or done.stdout).strip()[-500:]}")
    job = done.stdout.strip().split(";")[0]
    (out / STATE).write_text(json.dumps({"job_id": job, "jobs": jobs, "command": cmd,
                                         "launcher": "slurm"}, indent=1) + "\n")
    return job


def queued(job: str) -> dict[int, str]:
    """{array index: state} of the array's tasks still in the queue (``squeue``)."""
    try:
        done = subprocess.run(["squeue", "-h", "-r", "-j", job, "-o", "%i %T"],
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    states = {}
    for line in done.stdout.splitlines():
        task, _, state = line.strip().partition(" ")
        index = task.rpartition("_")[2]
        if index.isdigit():
            states[int(index)] = state.strip().lower() or "queued"
    return states


def collect(out: Path) -> tuple[list[dict], list[dict]]:
    """(table rows of the finished points, one row per point not finished with its status
    and log tail); writes the table."""
    state = json.loads((out / STATE).read_text())
    jobs = [(lab, points) for lab, points in state["jobs"]]
    waiting = queued(state["job_id"])
    table, records, open_points = [], [], []
    for index, lab, point in _points(jobs):
        row = point_row(index, lab, point)
        row["log"] = str(Path("logs") / f"array-{index}.log")
        record = read_record(_name(out, index, lab, "json"))
        rc = _name(out, index, lab, "rc")
        if record is not None:
            records.append(record)
            table += table_rows(row, point, record)
            continue
        if index in waiting:
            row.update(status=waiting[index], error="not finished yet")
        else:
            code = rc.read_text().strip() if rc.exists() else "none (not in the queue)"
            log = out / row["log"]
            said = error_line(log.read_text(errors="replace")) if log.exists() else "no log"
            row.update(status="failed", error=f"exit {code}, no record: {said}")
        row["log_tail"] = log_tail(out / row["log"])
        open_points.append(row)
        table.append(row)
    write_table(out, table, table_meta(jobs, records, launcher="slurm", job_id=state["job_id"]))
    return table, open_points
