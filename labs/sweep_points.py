"""A sweep's grid and table: which points to run, and how each finished point becomes rows.

What it teaches: a table is only useful if its columns mean the same thing in every row.
A point is a {flag: value} dict (``parse_axis`` and ``expand`` make them from ``--grid``,
``read_grid_file`` from an INI file); ``lab_argv`` spells one as a lab's command line. A
finished point's record becomes one table row per row of the record (per implementation,
schedule, layout: ``table_rows``), each carrying the point's number, its status and its
grid settings as columns of their own, so a sweep over any flag of any lab gives rows with
the same metric columns. Used by ``labs/sweep.py`` (local, torchrun, srun) and
``labs/sweep_slurm.py`` (a SLURM job array); not a lab itself.

Laptop:  python labs/sweep.py --lab pp --grid microbatches=2,4 --set world_size=2
GPU box: python labs/sweep.py --lab pp --launcher torchrun --grid microbatches=4,8,16
"""
from __future__ import annotations

import ast
import configparser
import hashlib
import itertools
import json
import os
import re
import subprocess
import time
from pathlib import Path

from lessonlib import writable
from lessonlib.lab import results as R

LABS_DIR = Path(__file__).resolve().parent
LEAD_COLUMNS = ["point", "lab", "status", "seconds", "error"]


# ---------------------------------------------------------------- the grid
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
    try:
        ini.read(path)
    except configparser.Error as exc:
        raise ValueError(f"--grid-file {path}: {_ini_problem(exc)}") from None
    except UnicodeDecodeError:
        raise ValueError(f"--grid-file {path} is not UTF-8 text; give an INI file of "
                         f"[lab] sections") from None
    if not ini.sections():
        raise ValueError(f"--grid-file {path} has no [lab] section; start with e.g. [ddp]")
    return [(section.split()[0], expand([parse_axis(f"{k}={v}") for k, v in ini[section].items()]))
            for section in ini.sections()]


def _ini_problem(exc: configparser.Error) -> str:
    """What is wrong with a grid file, at which line, and what would work."""
    if isinstance(exc, configparser.MissingSectionHeaderError):
        return (f"line {exc.lineno} ({exc.line.strip()!r}) comes before any [lab] section; "
                f"start with a section, e.g. [ddp]")
    if isinstance(exc, configparser.DuplicateOptionError):
        return (f"line {exc.lineno}: {exc.option} is given twice in [{exc.section}]; give it "
                f"once, its values comma-separated (e.g. {exc.option} = 1, 2)")
    if isinstance(exc, configparser.DuplicateSectionError):
        return (f"line {exc.lineno}: [{exc.section}] is there twice; name a second grid of "
                f"the same lab apart, e.g. [{exc.section} small]")
    if isinstance(exc, configparser.ParsingError):
        lineno, shown = exc.errors[0]          # configparser gives the line as its repr
        try:
            shown = repr(ast.literal_eval(shown).strip())
        except (ValueError, SyntaxError):
            pass
        return (f"line {lineno} ({shown}) has no '='; write one axis a line, "
                f"key = values (e.g. steps = 1, 2)")
    return str(exc).splitlines()[0]


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


def _typed(value: str):
    return R.parse_value(value) if " " not in value else value


def error_line(log: str) -> str:
    """The line that says what went wrong: the lab's own one-line error (argparse's
    'error:' line) if it printed one, else the last exception (torchrun's report of a failed
    rank comes after the rank's own words)."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    said = [ln for ln in lines if " error: " in ln]
    if said:
        return said[-1][:500]
    for ln in reversed(lines):
        if re.match(r"^[\w.]*(Error|Exception|Timeout)\b.*:", ln):
            return ln[:500]
    return (lines[-1] if lines else "no output")[:500]



def log_tail(path: Path, lines: int = 5) -> str:
    """The last lines of a point's log, for a failed or pending point's report."""
    if not path.exists():
        return "(no log yet)"
    text = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    return "\n".join(text[-lines:]) or "(empty log)"


def point_row(index: int, lab: str, point: dict) -> dict:
    """A point's lead columns and grid settings, before it has a result."""
    return {"point": index, "lab": lab, "status": "ok", "seconds": None, "error": None,
            **{k: _typed(v) for k, v in point.items()}}


def table_rows(row: dict, point: dict, record: dict | None) -> list[dict]:
    """A point's rows in the sweep's table: one per row of its record (stable columns,
    ``lessonlib.lab.results.record_rows``), each with the point's lead and grid columns, or the
    point's own row when it failed or its lab writes no rows."""
    if record is None or not isinstance(record.get("rows"), list):
        return [row]
    keep = {k: row[k] for k in [*LEAD_COLUMNS, *point, "log", "command"] if k in row}
    return [{**keep, **r, "lab": row["lab"]} for r in R.record_rows(record)]


def table_meta(jobs: list[tuple[str, list[dict]]], records: list[dict], **meta) -> dict:
    """The table's notes: grid columns, which of them vary, each lab's headline, the
    machine of the first finished point (a plot's title)."""
    grid_cols = list(dict.fromkeys(k for _, points in jobs for p in points for k in p))
    swept = [k for k in grid_cols if len({p.get(k) for _, ps in jobs for p in ps}) > 1]
    headlines = {r["lab"]: r.get("headline") for r in records if r.get("headline")}
    machine = next((r["machine"] for r in records if r.get("machine")), None)
    return {**meta, "grid_columns": grid_cols, "swept": swept, "headlines": headlines,
            "machine": machine}


def write_table(out: Path, rows: list[dict], meta: dict) -> None:
    """``table.csv`` and ``table.json``: lead and grid columns first, then what tells a
    lab's rows apart (implementation, schedule, ...), then the metrics."""
    order = LEAD_COLUMNS + meta["grid_columns"]
    for headline in meta["headlines"].values():
        order += [c for c in [*headline["series"], headline["x"]] if c not in order]
    R.write_csv(rows, out / R.TABLE_CSV, order=order)
    R.write_json(rows, out / R.TABLE_JSON, **meta)


def read_record(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


# ---------------------------------------------------------------- the results folder
def default_folder(name: str, jobs, opts) -> Path:
    """A local sweep's folder is new each time; a --slurm sweep's is named by its grid, so
    running the same command again finds the array it submitted and collects it."""
    if not opts.slurm:
        return Path("results", "sweeps", f"{name}-{time.strftime('%Y%m%d-%H%M%S')}")
    digest = hashlib.sha1(json.dumps([jobs, opts.sbatch_args]).encode()).hexdigest()[:8]
    return Path("results", "sweeps", f"{name}-{digest}")


def check_folder(parser, out: Path) -> None:
    """The results folder: one this user can write, on a disk, before any point runs."""
    place = next(p for p in [out, *out.parents, Path(".")] if p.exists())
    if not place.is_dir() or (place == out and not out.is_dir()):
        parser.error(f"--out {out}: {place} is a file, not a folder; give a folder")
    kernel = writable.kernel_filesystem(place)
    if kernel:                 # to root, os.access says yes, then the first table fails
        parser.error(f"--out {out}: {place} is on the kernel's {kernel} file system, where no "
                     f"result can be kept; choose a folder on a disk")
    if not os.access(place, os.W_OK):
        parser.error(f"--out {out}: no write permission in {place}; choose a writable place")
