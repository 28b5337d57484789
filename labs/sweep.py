"""Run one lab over a grid of settings and gather every result into one table.

What it teaches: a single measurement says little; a row of them, over world sizes,
layouts or micro-batch counts, shows the trend the cost model predicts. Each point of the
grid is one run of ``labs/<lab>.py ... --json``; its record is flattened into a row
(``lessonlib.results.flatten``), and the rows are written after every point to
``table.csv`` and ``table.json`` in the results folder, beside each point's JSON and log.
A point that fails or times out becomes a row with ``status`` and ``error``; the sweep goes on.

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

Laptop:  python labs/sweep.py --lab tp --grid world_size=1,2,4 --set steps=5
GPU box: python labs/sweep.py --lab tp --launcher torchrun --grid world_size=1,2,4,8
"""
from __future__ import annotations

import argparse
import configparser
import itertools
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from lessonlib import results as R

LABS_DIR = Path(__file__).resolve().parent

NOT_LABS = {"sweep", "gpu_check"}
LAUNCHERS = ("local", "torchrun", "srun")
LEAD_COLUMNS = ["point", "lab", "status", "seconds", "error"]


# ---------------------------------------------------------------- the grid
def available_labs() -> list[str]:
    return sorted(p.stem for p in LABS_DIR.glob("*.py") if p.stem not in NOT_LABS)


def _split_values(text: str) -> list[str]:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] == '"':
        return [text[1:-1]]
    return [v.strip() for v in text.split(",") if v.strip()]


def parse_axis(spec: str, split: bool = True) -> tuple[list[str], list[tuple[str, ...]]]:
    """``"a:b=1:x,2:y"`` -> (["a", "b"], [("1", "x"), ("2", "y")])."""
    if "=" not in spec:
        raise ValueError(f"grid setting {spec!r} has no '='; write key=value1,value2 "
                         f"(e.g. world_size=2,4)")
    keys_text, values_text = spec.split("=", 1)
    keys = [k.strip() for k in keys_text.split(":")]
    if not all(re.fullmatch(r"[A-Za-z][\w-]*", k) for k in keys):
        raise ValueError(f"grid setting {spec!r}: {keys_text!r} is not a flag name "
                         f"(letters, digits, '_' or '-'; tie several with ':')")
    values = _split_values(values_text) if split else [values_text.strip()]
    if not values:
        raise ValueError(f"grid setting {spec!r} has no values after '='")
    tuples = [tuple(v.split(":")) if len(keys) > 1 else (v,) for v in values]
    for t in tuples:
        if len(t) != len(keys):
            raise ValueError(f"grid setting {spec!r}: value {':'.join(t)!r} has {len(t)} "
                             f"part(s) for {len(keys)} key(s) {keys}; write one per key, "
                             f"joined with ':'")
    return keys, tuples


def expand(axes: list[tuple[list[str], list[tuple[str, ...]]]]) -> list[dict]:
    """The cartesian product of the axes, each point a {key: value} dict in axis order."""
    points = []
    for combo in itertools.product(*(values for _, values in axes)):
        point = {}
        for (keys, _), values in zip(axes, combo):
            point.update(zip(keys, values))
        points.append(point)
    return points


def read_grid_file(path: Path) -> list[tuple[str, list[dict]]]:
    """[(lab, points)] from an INI grid file, one section per lab grid."""
    if not path.exists():
        raise ValueError(f"--grid-file {path} does not exist")
    ini = configparser.ConfigParser(interpolation=None, delimiters=("=",))  # ":" ties keys
    ini.optionxform = str
    ini.read(path)
    if not ini.sections():
        raise ValueError(f"--grid-file {path} has no [lab] section; start with e.g. [ddp]")
    return [(section.split()[0], expand([parse_axis(f"{k}={v}") for k, v in ini[section].items()]))
            for section in ini.sections()]


def lab_flags(python: str, lab: str) -> set[str]:
    """The flags ``labs/<lab>.py`` accepts, read from its --help (before anything runs)."""
    out = subprocess.run([python, str(LABS_DIR / f"{lab}.py"), "--help"], capture_output=True,
                         text=True, timeout=300)
    if out.returncode != 0:
        raise ValueError(f"labs/{lab}.py --help failed:\n{out.stderr.strip()[-2000:]}")
    return set(re.findall(r"(?<![\w-])(--[a-z][\w-]*)", out.stdout))


def check(lab: str, points: list[dict], flags: set[str]) -> None:
    """Every grid key must be one of the lab's flags."""
    for key in {k for p in points for k in p}:
        flag = "--" + key.replace("_", "-")
        if flag not in flags:
            raise ValueError(f"labs/{lab}.py has no {flag} (from grid key {key!r}); its flags "
                             f"are {', '.join(sorted(flags - {'--help'}))}")


# ---------------------------------------------------------------- one point
def lab_argv(point: dict, launcher: str) -> list[str]:
    argv = []
    for key, value in point.items():
        if key == "world_size" and launcher != "local":
            continue                       # the launcher starts that many ranks instead
        flag = "--" + key.replace("_", "-")
        if value.lower() == "true":
            argv.append(flag)
        elif value.lower() != "false":
            argv += [flag, *value.split()]
    return argv


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


def _typed(value: str):
    return R.parse_value(value) if " " not in value else value


def _error_line(log: str) -> str:
    """The line that says what went wrong: an exception or argparse's 'error:' line."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.match(r"^[\w.]*(Error|Exception|Timeout)\b.*:", ln) or " error: " in ln:
            return ln[:500]
    return (lines[-1] if lines else "no output")[:500]


def run_point(index: int, lab: str, point: dict, out: Path, opts) -> dict:
    json_path = out / "points" / f"{index:04d}-{lab}.json"
    log_path = out / "logs" / f"{index:04d}-{lab}.log"
    cmd = command(lab, point, json_path, opts)
    row = {"point": index, "lab": lab, "status": "ok", "seconds": None, "error": None,
           **{k: _typed(v) for k, v in point.items()}}
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
        except KeyboardInterrupt:             # its own session: Ctrl-C does not reach it
            os.killpg(proc.pid, signal.SIGKILL)
            raise
        if rc is None:
            os.killpg(proc.pid, signal.SIGKILL)   # the launcher and every rank it started
            proc.wait()
    row["seconds"] = round(time.monotonic() - start, 3)
    text = log_path.read_text(errors="replace")
    if rc is None:
        row.update(status="timeout", error=f"stopped after --point-timeout {opts.point_timeout} s")
    elif rc != 0:
        row.update(status="failed", error=f"exit {rc}: {_error_line(text)}")
    elif not json_path.exists():
        row.update(status="failed", error="exited 0 but wrote no --json record")
    else:
        row.update(R.flatten(json.loads(json_path.read_text())))
        row["lab"] = lab
    row["log"] = str(log_path.relative_to(out))
    row["command"] = shlex.join(cmd)
    return row


# ---------------------------------------------------------------- progress and the table
def progress_line(done: int, total: int, started: float, note: str) -> str:
    width = 24
    filled = width * done // total
    elapsed = time.monotonic() - started
    eta = f", ~{elapsed / done * (total - done):.0f} s left" if 0 < done < total else ""
    return f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {elapsed:.0f} s{eta}  {note}"


def sweep(jobs: list[tuple[str, list[dict]]], out: Path, opts) -> list[dict]:
    (out / "points").mkdir(parents=True, exist_ok=True)
    (out / "logs").mkdir(exist_ok=True)
    total = sum(len(points) for _, points in jobs)
    tty = sys.stderr.isatty()
    rows, started = [], time.monotonic()
    grid_cols = list(dict.fromkeys(k for _, points in jobs for p in points for k in p))
    varying = {k for _, points in jobs for k in grid_cols
               if len({p.get(k) for p in points}) > 1}
    for lab, point in ((lab, p) for lab, points in jobs for p in points):
        label = f"{lab} " + " ".join(f"{k}={v}" for k, v in point.items()
                                     if k in varying or k == "world_size")
        if tty:
            print("\r" + progress_line(len(rows), total, started, f"running {label}")[:150],
                  end="", file=sys.stderr, flush=True)
        row = run_point(len(rows), lab, point, out, opts)
        rows.append(row)
        status = row["status"] + ("" if row["status"] == "ok" else f" ({row['error'][:80]})")
        line = progress_line(len(rows), total, started,
                             f"{label}: {status} in {row['seconds']:.1f} s")
        print(("\r\033[K" if tty else "") + line, file=sys.stderr, flush=True)
        R.write_csv(rows, out / R.TABLE_CSV, order=LEAD_COLUMNS + grid_cols)
        R.write_json(rows, out / R.TABLE_JSON, launcher=opts.launcher, grid_columns=grid_cols)
    return rows


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="labs/sweep.py", description=__doc__.splitlines()[0],
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
    p.add_argument("--point-timeout", type=float, default=1800.0, help="seconds per point")
    p.add_argument("--python", default=sys.executable, help="interpreter for the labs")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    p.add_argument("--strict", action="store_true", help="exit 1 if any point failed")
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
    if opts.nproc_per_node is not None and opts.nproc_per_node < 1:
        raise ValueError(f"--nproc-per-node must be a positive integer; got {opts.nproc_per_node}")
    if opts.launcher == "torchrun" and opts.nproc_per_node is None:
        opts.nproc_per_node = 1
    for lab, points in jobs:
        for p in points:
            w = p.get("world_size")
            if w is not None and not (w.isdigit() and int(w) >= 1):
                raise ValueError(f"world_size={w!r} in the {lab} grid must be a positive integer")
    return jobs


def main(argv=None) -> int:
    parser, opts = parse_args(argv)
    try:
        jobs = build_jobs(opts)
        for lab, points in jobs:
            if lab not in available_labs():
                raise ValueError(f"lab={lab!r} is not in labs/; choose one of "
                                 f"{', '.join(available_labs())}")
            check(lab, points, lab_flags(opts.python, lab))
    except ValueError as exc:
        parser.error(str(exc))
    name = opts.grid_file.stem if opts.grid_file else jobs[0][0]
    out = opts.out or Path("results", "sweeps", f"{name}-{time.strftime('%Y%m%d-%H%M%S')}")
    if opts.dry_run:
        for i, (lab, point) in enumerate((lab, p) for lab, points in jobs for p in points):
            print(shlex.join(command(lab, point, out / "points" / f"{i:04d}-{lab}.json", opts)))
        return 0
    rows = sweep(jobs, out, opts)
    failed = [r for r in rows if r["status"] != "ok"]
    print(f"{len(rows) - len(failed)} of {len(rows)} points ok; table: {out / R.TABLE_CSV} "
          f"and {out / R.TABLE_JSON}" + (f"; failed: points {[r['point'] for r in failed]}"
                                         if failed else ""))
    return 1 if failed and opts.strict else 0


if __name__ == "__main__":
    sys.exit(main())
