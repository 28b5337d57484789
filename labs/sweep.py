"""Run one lab over a grid of settings and gather every result into one table.

What it teaches: a single measurement says little; a row of them, over world sizes,
layouts or micro-batch counts, shows the trend the cost model predicts. Each point of the
grid is one run of ``labs/<lab>.py ... --json``; its record's rows (one per implementation,
schedule or layout, with stable metric columns) become rows of the table, each with the
point's number, status and grid settings as columns (``sweep_points.table_rows``), written
after every point to ``table.csv`` and ``table.json`` in the results folder, beside each
point's JSON and log. A point that fails or times out becomes a row with ``status`` and
``error``; the sweep goes on. ``--plot`` draws the lab's headline metric against the swept
setting, over the cost model's prediction where the lab has one, into ``plot.png``.

    python labs/sweep.py --lab ddp --grid world_size=1,2,4 --grid bucket_cap_mb=1,25 \\
        --set model=tiny --set steps=3
    python labs/sweep.py --lab hybrid --grid world_size:layouts=4:t2p2d1,8:t2p2d2
    python labs/sweep.py --grid-file my_grid.ini            # several labs, one file

``--grid key=a,b`` makes ``--key a`` and ``--key b`` points (underscores become dashes;
``true`` passes a bare flag, ``false`` leaves it out, a value with spaces becomes several
words, for flags like ``--microbatches 4 8``); ``--grid a:b=1:x,2:y`` ties keys together
(layouts whose sizes must agree); ``--set key=value`` is fixed, never split on commas.
A grid file is INI: one section per lab (``[ddp]``, or ``[ddp small]`` for a second grid
of the same lab), one ``key = a, b`` line per axis; a quoted value is never split.

Launchers (``world_size`` is special: it sets how many ranks start):
  local     ``python labs/X.py --world-size W`` (spawned CPU ranks, or one per GPU)
  torchrun  ``torchrun --standalone --nproc-per-node W labs/X.py`` (one GPU node)
  srun      ``srun --ntasks=W bash labs/slurm/rank_env.sh python labs/X.py`` (inside a
            SLURM allocation: ``salloc -N 2 --ntasks-per-node 8`` or an sbatch script)
  --slurm   the grid as one job array, a task per point through labs/slurm/torchrun.sbatch;
            returns at once; ``--collect FOLDER`` (or the same command again) gathers it
            (``labs/sweep_slurm.py``)

Laptop:  python labs/sweep.py --lab tp --grid world_size=1,2,4 --set steps=5
GPU box: python labs/sweep.py --lab tp --launcher torchrun --grid world_size=1,2,4,8 --plot
Cluster: python labs/sweep.py --lab pp --grid microbatches=4,8,16 --set world_size=8 --slurm
Schedules: python labs/sweep.py --lab pp --grid schedules=1f1b,zb-h1,zbv --set world_size=2
Predicted: python labs/sweep.py --published "Llama 3 Table 4, 128K" --grid c=1,2,4,8,16 --set v=1

However the sweep ends (Ctrl-C, ``kill``/``timeout``'s SIGTERM, a closed terminal's SIGHUP,
or the death of the process that started it, which Linux turns into a SIGHUP), the running
point's whole process group ends with it: the lab, its fork server and ranks.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import sweep_published
import sweep_slurm
from sweep_points import (LABS_DIR, check, check_folder, default_folder, error_line, expand,
                          lab_argv, lab_flags, parse_axis, point_row, read_grid_file,
                          read_record, table_meta, table_rows, write_table)

from lessonlib import argcheck
from lessonlib.lab import results as R

# The kit's own tools, and minimal_ddp.py: plain PyTorch for students to copy, no lab flags
NOT_LABS = {"sweep", "sweep_points", "sweep_published", "sweep_slurm", "gpu_check",
            "gpu_check_labs", "gpu_check_plan", "gpu_check_report", "minimal_ddp"}
LAUNCHERS = ("local", "torchrun", "srun")
MAX_POINT_TIMEOUT_S = 1e7  # the launcher's own limit on a run (116 days)
__all__ = ["parse_axis", "expand", "read_grid_file", "lab_flags", "check", "command", "sweep"]


def available_labs() -> list[str]:
    return sorted(p.stem for p in LABS_DIR.glob("*.py") if p.stem not in NOT_LABS)


# ---------------------------------------------------------------- one point
def command(lab: str, point: dict, json_path: Path, opts) -> list[str]:
    script = [str(LABS_DIR / f"{lab}.py"), *lab_argv(point, opts.launcher), "--json",
              str(json_path)]
    ranks = point.get("world_size")
    if opts.launcher == "local":
        return [opts.python, *script]
    if opts.launcher == "torchrun":
        return [opts.python, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", str(ranks or opts.nproc_per_node), *script]
    starter = ["srun", "--kill-on-bad-exit=1"]
    starter += [f"--ntasks={ranks}"] if ranks else []
    starter += [f"--ntasks-per-node={opts.nproc_per_node}"] if opts.nproc_per_node else []
    return [*starter, "bash", str(LABS_DIR / "slurm" / "rank_env.sh"), opts.python, *script]


def run_point(index: int, lab: str, point: dict, out: Path, opts) -> dict:
    json_path = out / "points" / f"{index:04d}-{lab}.json"
    log_path = out / "logs" / f"{index:04d}-{lab}.log"
    cmd = command(lab, point, json_path, opts)
    row = point_row(index, lab, point)
    start = time.monotonic()
    with open(log_path, "w") as log:
        log.write(shlex.join(cmd) + "\n\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=opts.point_timeout)
        except subprocess.TimeoutExpired:
            rc = None
        finally:       # also on Ctrl-C or a signal (``Stopped``): its own session hears neither
            if proc.returncode is None:
                os.killpg(proc.pid, signal.SIGKILL)   # the launcher and every rank it started
                proc.wait()
    row["seconds"] = round(time.monotonic() - start, 3)
    text = log_path.read_text(errors="replace")
    if rc is None:
        row.update(status="timeout", error=f"stopped after --point-timeout {opts.point_timeout} s")
    elif rc != 0:
        row.update(status="failed", error=f"exit {rc}: {error_line(text)}")
    elif not json_path.exists():
        row.update(status="failed", error="exited 0 but wrote no --json record")
    else:
        row.update(R.flatten(json.loads(json_path.read_text())))
        row["lab"] = lab
    row["log"] = str(log_path.relative_to(out))
    row["command"] = shlex.join(cmd)
    return row


class Stopped(BaseException):
    """A signal ended the sweep (its number: ``signum``); raised where the sweep waits."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _stop(signum, frame):
    raise Stopped(signum)


PR_SET_PDEATHSIG = 1       # linux/prctl.h


def stop_on_signals() -> None:
    """SIGTERM and SIGHUP raise ``Stopped`` (``run_point`` then ends the running point's
    group, as on Ctrl-C), and on Linux the death of the sweep's parent sends it SIGHUP."""
    parent = os.getppid()
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _stop)
    if sys.platform.startswith("linux"):
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGHUP))
        if os.getppid() != parent:             # it died before it could be watched
            raise Stopped(signal.SIGHUP)


# ---------------------------------------------------------------- progress and the table
def progress_line(done: int, total: int, started: float, note: str) -> str:
    width = 24
    filled = width * done // total
    elapsed = time.monotonic() - started
    eta = f", ~{elapsed / done * (total - done):.0f} s left" if 0 < done < total else ""
    return f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {elapsed:.0f} s{eta}  {note}"


def sweep(jobs: list[tuple[str, list[dict]]], out: Path, opts) -> list[dict]:
    """Run every point here, one after another; write the table (stable rows) after each.
    Returns one row per point: its status and its whole record flattened."""
    (out / "points").mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(exist_ok=True)
    total = sum(len(points) for _, points in jobs)
    tty = sys.stderr.isatty()
    rows, table, records, started = [], [], [], time.monotonic()
    varying = set(table_meta(jobs, [])["swept"])
    for lab, point in ((lab, p) for lab, points in jobs for p in points):
        label = f"{lab} " + " ".join(f"{k}={v}" for k, v in point.items()
                                     if k in varying or k == "world_size")
        if tty:
            print("\r" + progress_line(len(rows), total, started, f"running {label}")[:150],
                  end="", file=sys.stderr, flush=True)
        row = run_point(len(rows), lab, point, out, opts)
        record = read_record(out / "points" / f"{row['point']:04d}-{lab}.json") \
            if row["status"] == "ok" else None
        rows.append(row)
        records += [record] if record else []
        table += table_rows(row, point, record)
        status = row["status"] + ("" if row["status"] == "ok" else f" ({row['error'][:80]})")
        line = progress_line(len(rows), total, started,
                             f"{label}: {status} in {row['seconds']:.1f} s")
        print(("\r\033[K" if tty else "") + line, file=sys.stderr, flush=True)
        write_table(out, table, table_meta(jobs, records, launcher=opts.launcher))
    return rows


def parse_args(argv=None):
    p = argcheck.LabParser(prog="labs/sweep.py", description=__doc__.splitlines()[0],
                           formatter_class=argparse.RawDescriptionHelpFormatter,
                           epilog=__doc__.split("\n\n", 2)[2])
    p.add_argument("--lab", help=f"one of: {', '.join(available_labs())}")
    p.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2",
                   help="one axis of the grid (repeat for more axes)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a fixed setting for every point (not split on commas)")
    p.add_argument("--grid-file", type=Path, help="an INI file of lab grids (see below)")
    p.add_argument("--launcher", default="local", choices=LAUNCHERS)
    p.add_argument("--nproc-per-node", type=int, default=None,
                   help="torchrun: ranks when the grid has no world_size (default 1); "
                        "srun: tasks per node")
    p.add_argument("--out", type=Path, default=None,
                   help="results folder (default results/sweeps/<name>-<date>-<time>)")
    p.add_argument("--point-timeout", type=float, default=1800.0,
                   help=f"seconds per point (at most {MAX_POINT_TIMEOUT_S:g})")
    p.add_argument("--python", default=sys.executable, help="interpreter for the labs")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    p.add_argument("--strict", action="store_true", help="exit 1 if any point failed")
    p.add_argument("--plot", action="store_true",
                   help="draw the headline metric against the swept setting into plot.png")
    p.add_argument("--slurm", action="store_true",
                   help="submit the grid as one SLURM job array and return (run it again, or "
                        "--collect FOLDER, to gather the finished points)")
    p.add_argument("--sbatch-args", default="", help="extra sbatch flags for --slurm, quoted")
    p.add_argument("--published", metavar="RUN", help="no lab: the cost model around a "
                   "published run's layout (labs/sweep_published.py)")
    p.add_argument("--collect", type=Path, default=None, metavar="FOLDER",
                   help="gather a --slurm sweep's finished points into its table")
    return p, p.parse_args(argv)


def build_jobs(opts) -> list[tuple[str, list[dict]]]:
    if opts.grid_file and (opts.lab or opts.grid):
        raise ValueError("give either --grid-file or --lab with --grid, not both")
    if opts.grid_file:
        jobs = read_grid_file(opts.grid_file)
    elif opts.lab:
        jobs = [(Path(opts.lab).stem, expand([parse_axis(g) for g in opts.grid]))]
    else:
        raise ValueError(f"say which lab: --lab NAME (one of {', '.join(available_labs())}) "
                         f"or --grid-file FILE")
    fixed = [parse_axis(s, split=False) for s in opts.set]
    for keys, _ in fixed:
        clash = [lab for lab, points in jobs if points and keys[0] in points[0]]
        if clash:
            raise ValueError(f"{keys[0]} is both a grid axis and --set {keys[0]}=...; keep one")
    jobs = [(lab, [{**p, **{ks[0]: vs[0][0] for ks, vs in fixed}} for p in points])
            for lab, points in jobs]
    argcheck.positive_number("--point-timeout", opts.point_timeout, most=MAX_POINT_TIMEOUT_S,
                             example="1800")       # 0 kills every point at once; nan, never
    if shutil.which(opts.python) is None:
        raise ValueError(f"--python {opts.python}: no such program can be run here; give a "
                         f"Python with torch, e.g. --python {sys.executable}")
    if opts.launcher == "srun" and not opts.dry_run and (
            "SLURM_JOB_ID" not in os.environ or shutil.which("srun") is None):
        raise ValueError("--launcher srun runs inside a SLURM allocation (salloc or sbatch), "
                         "and this is none (no SLURM_JOB_ID, or no srun); use --launcher local "
                         "or torchrun here, --slurm to submit the grid, or --dry-run to see "
                         "the commands")
    if opts.nproc_per_node is not None:
        argcheck.positive_int("--nproc-per-node", opts.nproc_per_node)
    if opts.launcher == "torchrun" and opts.nproc_per_node is None:
        opts.nproc_per_node = 1
    for lab, points in jobs:
        for p in points:
            w = p.get("world_size")
            if w is not None:
                argcheck.positive_int("world_size", int(w) if w.isdigit() else w,
                                      what=f"the ranks of a {lab} point")
    return jobs


def finish(rows: list[dict], out: Path, opts, pending: list[dict] = ()) -> int:
    """Say how many points finished (and plot them with --plot); exit 1 with --strict if
    any failed."""
    waiting = {r["point"] for r in pending}
    points = sorted({r["point"] for r in rows})
    bad = sorted({r["point"] for r in rows if r["status"] != "ok" and r["point"] not in waiting})
    print(f"{len(points) - len(bad) - len(pending)} of {len(points)} points ok; table: "
          f"{out / R.TABLE_CSV} and {out / R.TABLE_JSON}"
          + (f"; failed: points {bad}" if bad else "")
          + (f"; not finished: points {[r['point'] for r in pending]}" if pending else ""))
    if opts.plot:
        from lessonlib.viz import sweep as draw     # matplotlib only when asked to plot
        print(f"plot: {draw.plot_sweep(out)}")
    return 1 if bad and opts.strict else 0


def collect(parser, out: Path, opts) -> int:
    if not (out / sweep_slurm.STATE).exists():
        parser.error(f"--collect {out}: no {sweep_slurm.STATE} there; give the folder that "
                     f"labs/sweep.py --slurm printed")
    table, open_points = sweep_slurm.collect(out)
    for row in open_points:
        print(f"point {row['point']} ({row['lab']}): {row['status']}, {row['error']}; "
              f"{row['log']}:\n  " + row["log_tail"].replace("\n", "\n  "))
    pending = [r for r in open_points if r["status"] != "failed"]
    return finish(table, out, opts, pending)


def predicted(parser, opts) -> int:
    """``--published RUN``: the cost model over the grid, around that run's layout."""
    check_folder(parser, out := opts.out or default_folder("published", [], opts))
    try:
        return sweep_published.sweep(opts.published, opts.grid, opts.set, out, opts.plot)
    except ValueError as exc:
        parser.error(str(exc))


def main(argv=None) -> int:
    parser, opts = parse_args(argv)
    if opts.collect:
        return collect(parser, opts.collect, opts)
    if opts.published:
        return predicted(parser, opts)
    try:
        jobs = build_jobs(opts)
        out = opts.out or default_folder((opts.grid_file or Path(jobs[0][0])).stem, jobs, opts)
        submitted = opts.slurm and (out / sweep_slurm.STATE).exists()
        for lab, points in [] if submitted else jobs:      # a submitted grid was checked then
            if lab not in available_labs():
                raise ValueError(f"lab={lab!r} is not in labs/; choose one of "
                                 f"{', '.join(available_labs())}")
            check(lab, points, lab_flags(opts.python, lab))   # runs its --help (seconds)
    except ValueError as exc:
        parser.error(str(exc))
    check_folder(parser, out)
    if submitted:
        return collect(parser, out, opts)          # the same command again: gather
    if opts.slurm and not opts.dry_run:
        try:
            job = sweep_slurm.submit(jobs, out, opts)
        except (OSError, RuntimeError) as exc:
            parser.error(f"--slurm: {exc}")
        print(f"submitted job array {job}: {sum(len(p) for _, p in jobs)} points; gather them "
              f"with: python labs/sweep.py --collect {out}" + (" --plot" if opts.plot else ""))
        return 0
    if opts.dry_run:
        for i, (lab, point) in enumerate((lab, p) for lab, points in jobs for p in points):
            print(shlex.join(command(lab, point, out / "points" / f"{i:04d}-{lab}.json", opts)))
        return 0
    try:
        stop_on_signals()
        return finish(sweep(jobs, out, opts), out, opts)
    except (Stopped, KeyboardInterrupt) as stop:
        signum = getattr(stop, "signum", signal.SIGINT)
        name = signal.Signals(signum).name
        try:                                       # a closed terminal cannot be written to
            print(f"\nlabs/sweep.py: stopped by {name}; the running point and every process "
                  f"it started were ended; the points done so far are in {out}",
                  file=sys.stderr)
        except OSError:
            pass
        return 128 + signum


if __name__ == "__main__":
    sys.exit(main())
