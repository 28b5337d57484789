"""Measured results as plain rows, so a notebook can draw them over the cost model.

What it teaches: a measurement is only useful beside a prediction. Every lab writes one
JSON shape (see ``labkit``); ``labs/sweep.py`` gathers many of them into one table. This
module reads any of these into a list of flat dicts. A lab record's ``rows`` come out as
they are, with stable columns (one row per implementation, schedule or layout), each
tagged with the run's lab, world size, backend, device and dtype:

    {"lab": "pp", "world_size": 2, "implementation": "lessonlib", "schedule": "1f1b",
     "m": 4, "step_time_s": 0.031, "bubble_measured": 0.26, "bubble_predicted": 0.2, ...}

``flat=True`` (and any record without ``rows``) gives the whole record flattened instead,
nested keys joined with dots (``"results.lessonlib.step_time_s"``). ``points`` picks (x, y)
pairs for a plot (``lessonlib.viz.sweep.plot_sweep`` draws a finished sweep folder). Pure
Python (json, csv), no torch, no matplotlib.

Laptop and GPU box alike::

    from lessonlib.lab import results
    rows = results.load("results/sweeps/ddp-20250101-120000")     # a sweep folder
    rows = results.load("data/pp_cpu_results.json")               # a lab's record
    xs, ys = results.points(rows, "m", "bubble_measured", schedule="1f1b")
    flat = results.load("data/dp_cpu_results.json", flat=True)
    ring = results.explode(results.where(flat, name="allreduce_sweep"), "results.ring.points")
    print(results.format_table(rows, ["m", "schedule", "step_time_s"]))

From a shell: ``python -m lessonlib.lab.results data/tp_cpu_results.json --match step_time_s``
(``python -m lessonlib.viz.sweep FOLDER`` draws a sweep folder).
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

TABLE_JSON = "table.json"
TABLE_CSV = "table.csv"
PLOT_PNG = "plot.png"
RECORD_COLUMNS = ("lab", "world_size", "backend", "device")


# ---------------------------------------------------------------- records -> rows
def flatten(record: dict, prefix: str = "") -> dict:
    """One nested record as one flat dict: ``{"a": {"b": 1}}`` -> ``{"a.b": 1}``.

    Lists stay lists (a row of a table may hold the per-rank times of a step)."""
    flat = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def _is_record(value) -> bool:
    return isinstance(value, dict) and "lab" in value


def record_rows(record: dict, flat: bool = False) -> list[dict]:
    """A lab record as table rows: its ``rows`` tagged with the run's columns, or (``flat``,
    or a record from before rows existed) the whole record as one flattened row."""
    if flat or not isinstance(record.get("rows"), list):
        return [flatten({k: v for k, v in record.items() if k != "rows"})]
    run = {k: record.get(k) for k in RECORD_COLUMNS}
    run["dtype"] = record.get("settings", {}).get("dtype", "fp32")
    return [{**run, **flatten(r)} for r in record["rows"]]


def _rows_of(data, source: str, flat: bool = False) -> list[dict]:
    """Rows from whatever a results file holds: a table, one record, a list of records, or
    a bundle of named records (``{"about": ..., "ddp": {record}, ...}``, each row then
    tagged with its ``name``)."""
    if isinstance(data, dict) and isinstance(data.get("rows"), list) and not _is_record(data):
        return [flatten(r) for r in data["rows"]]
    if isinstance(data, dict) and not _is_record(data):
        named = {k: v for k, v in data.items()
                 if _is_record(v) or (isinstance(v, list) and v and all(map(_is_record, v)))}
        if named:
            return [{"name": k, **row} for k, v in named.items()
                    for r in (v if isinstance(v, list) else [v]) for row in record_rows(r, flat)]
    if isinstance(data, dict):
        return record_rows(data, flat)
    if isinstance(data, list) and all(isinstance(r, dict) for r in data):
        return [row for r in data for row in record_rows(r, flat)]
    raise ValueError(f"{source} holds neither a lab record, a list of records nor a results "
                     f"table ({{'rows': [...]}}); got a {type(data).__name__}")


def parse_value(text: str):
    """A CSV cell (or a command-line value) back to the value it spells: int, float, bool,
    JSON list or dict, None for an empty cell, else the text."""
    if text == "":
        return None
    if text in ("True", "true"):
        return True
    if text in ("False", "false"):
        return False
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    if text[:1] in "[{":
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            pass
    return text


def read_csv(path: str | Path) -> list[dict]:
    with open(path, newline="") as f:
        return [{k: parse_value(v) for k, v in row.items()} for row in csv.DictReader(f)]


def load(path: str | Path, flat: bool = False) -> list[dict]:
    """Every row in a results file or folder, as flat dicts (``flat``: whole records
    flattened, not their ``rows``; see the module docstring).

    ``path`` may be a lab's JSON record, a JSON list of records, a sweep's ``table.json`` or
    ``table.csv``, or a folder: its table if it has one, else every ``*.json`` in it."""
    path = Path(path)
    if path.is_dir():
        for name in (TABLE_JSON, TABLE_CSV):
            if (path / name).exists() and not flat:
                return load(path / name)
        files = sorted(path.glob("*.json") if not flat else (path / "points").glob("*.json"))
        files = files or sorted(path.glob("*.json"))
        if not files:
            raise ValueError(f"{path} has no {TABLE_JSON}, {TABLE_CSV} or *.json results; "
                             f"run a lab with --json or labs/sweep.py first")
        return [row for f in files for row in load(f, flat)]
    if not path.exists():
        raise ValueError(f"no results at {path}: give a lab's --json file, a sweep folder "
                         f"or its {TABLE_JSON} / {TABLE_CSV}")
    if path.suffix == ".csv":
        return read_csv(path)
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON ({exc})") from None
    return _rows_of(data, str(path), flat)


def load_many(paths) -> list[dict]:
    """The rows of several files or folders, one list, each row tagged with its ``source``."""
    rows = []
    for p in paths:
        rows += [{**row, "source": str(p)} for row in load(p)]
    return rows


# ---------------------------------------------------------------- picking points
def where(rows: list[dict], **conditions) -> list[dict]:
    """Rows whose columns equal every condition; dots in column names are spelled ``__``:
    ``where(rows, lab="ddp", settings__model="tiny")``."""
    wanted = {k.replace("__", "."): v for k, v in conditions.items()}
    return [r for r in rows if all(r.get(k) == v for k, v in wanted.items())]


def explode(rows: list[dict], prefix: str, key: str = "key") -> list[dict]:
    """One row per entry of a nested series, the row's other columns repeated.

    A series is either a list of dicts (``results.ring.points``: one dict per measured
    point) or dicts keyed by a value (``results.lessonlib.by_world_size.2.step_time_s``:
    the key goes to column ``key``, e.g. ``explode(rows, "...by_world_size", "world_size")``)."""
    out = []
    for row in rows:
        rest = {k: v for k, v in row.items() if k != prefix and not k.startswith(prefix + ".")}
        series = row.get(prefix)
        if isinstance(series, list) and all(isinstance(p, dict) for p in series):
            out += [{**rest, **flatten(p)} for p in series]
            continue
        groups: dict = {}
        for k, v in row.items():
            if k.startswith(prefix + "."):
                name, _, field_ = k[len(prefix) + 1:].partition(".")
                groups.setdefault(name, {})[field_ or "value"] = v
        out += [{**rest, key: parse_value(name), **fields} for name, fields in groups.items()]
    return out


def column(rows: list[dict], key: str) -> list:
    return [r.get(key) for r in rows]


def columns(rows: list[dict]) -> list[str]:
    """Every column name, in the order they first appear."""
    seen = {}
    for r in rows:
        for k in r:
            seen.setdefault(k, None)
    return list(seen)


def points(rows: list[dict], x: str, y: str, **conditions) -> tuple[list, list]:
    """(xs, ys) of the rows that match ``conditions`` and have both columns, sorted by x:
    ready for ``ax.plot(xs, ys, "o")`` over a predicted curve."""
    pairs = [(r[x], r[y]) for r in where(rows, **conditions)
             if r.get(x) is not None and r.get(y) is not None and r.get("status", "ok") == "ok"]
    pairs.sort(key=lambda p: p[0])
    return [p[0] for p in pairs], [p[1] for p in pairs]


# ---------------------------------------------------------------- writing and showing
def write_csv(rows: list[dict], path: str | Path, order: list[str] | None = None) -> None:
    """A CSV with every column (``order`` first); lists and dicts written as JSON text."""
    cols = list(order or []) + [c for c in columns(rows) if c not in (order or [])]
    with open(path, "w", newline="") as f:
        out = csv.DictWriter(f, fieldnames=cols)
        out.writeheader()
        for r in rows:
            out.writerow({k: json.dumps(v) if isinstance(v, (list, dict)) else v
                          for k, v in r.items()})


def write_json(rows: list[dict], path: str | Path, **meta) -> None:
    Path(path).write_text(json.dumps({**meta, "rows": rows}, indent=1, sort_keys=False) + "\n")


def _cell(value, digits: int) -> str:
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return "" if value is None else str(value)


def format_table(rows: list[dict], cols: list[str] | None = None, digits: int = 4,
                 markdown: bool = False) -> str:
    """A text (or markdown) table of ``cols`` (default: every column) for printing."""
    cols = cols or columns(rows)
    cells = [[_cell(r.get(c), digits) for c in cols] for r in rows]
    if markdown:
        lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in cells])
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(cols)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(cols, widths))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def main(argv=None) -> None:
    """``python -m lessonlib.lab.results FILE_OR_FOLDER [--columns a,b] [--match text]``"""
    import argparse

    p = argparse.ArgumentParser(prog="python -m lessonlib.lab.results",
                                description="Print a results file or sweep folder as a table.")
    p.add_argument("path", type=Path)
    p.add_argument("--columns", default=None, help="comma-separated columns to show")
    p.add_argument("--match", default=None,
                   help="show the columns whose name contains this text (e.g. step_time_s)")
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args(argv)
    try:
        rows = load(args.path)
    except ValueError as exc:
        p.error(str(exc))
    cols = args.columns.split(",") if args.columns else None
    if args.match:
        lead = [c for c in ("name", "lab", "world_size", "status") if c in columns(rows)]
        cols = lead + [c for c in columns(rows) if args.match in c and c not in lead]
    print(format_table(rows, cols, markdown=args.markdown))


if __name__ == "__main__":
    main()
