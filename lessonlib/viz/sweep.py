"""The slide a sweep makes: the swept setting on x, measured next to predicted on y.

What it teaches: one measurement is a dot; a sweep is a trend, and a trend is only
convincing beside the cost model's line. ``plot_table`` takes a sweep's rows (one row per
point and implementation, stable columns, see ``lessonlib.lab.results``) and the table's notes
(which settings were swept, each lab's headline metric and its predicted column, the
machine), and draws one panel per lab: one line of measured points per implementation
(schedule, layout, ...), the prediction dashed in the same colour, titled with the machine
the sweep ran on. Settings that are not numbers (layouts) are spaced evenly in grid order.

Laptop:  ``python labs/sweep.py --lab pp --grid microbatches=2,4,8 --plot``
         (or, for a finished folder, ``python -m lessonlib.viz.sweep FOLDER``)
GPU box: the same with ``--launcher torchrun``, or ``--slurm`` then ``--collect FOLDER --plot``.
"""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt

from lessonlib.lab import results


def machine_title(machine: dict | None, rows: list[dict]) -> str:
    """``"on cpu: 2 CPUs, Linux-6.1-x86_64, torch 2.13.0"`` from a record's ``machine``."""
    if not machine:
        devices = sorted({str(r.get("device")) for r in rows if r.get("device")})
        return f"on {', '.join(devices) or 'an unrecorded machine'}"
    return (f"on {machine.get('device', '?')}: {machine.get('cpus', '?')} CPUs, "
            f"{machine.get('platform', '?')}, torch {machine.get('torch', '?')}")


def _x_of(rows: list[dict], swept: list[str], headline: dict, x: str | None) -> str:
    """The x axis: the one asked for, else the first swept setting that varies, else the
    setting the lab itself varies inside one run (m for pp, p for mp, ...)."""
    if x:
        return x
    varying = [k for k in swept if len({repr(r.get(k)) for r in rows}) > 1]
    return varying[0] if varying else headline.get("x") or "point"


def _positions(values: list) -> tuple[list, list | None]:
    """Numbers stay numbers; anything else gets evenly spaced positions and tick labels."""
    if all(isinstance(v, (int, float)) for v in values):
        return values, None
    order = list(dict.fromkeys(values))
    return [order.index(v) for v in values], order


def _panel(ax, rows: list[dict], headline: dict, x: str, swept: list[str]) -> None:
    metric, predicted = headline["metric"], headline.get("predicted")
    keys = [k for k in headline.get("series", []) + swept if k != x
            and len({repr(r.get(k)) for r in rows}) > 1]
    series: dict = {}
    for r in rows:
        if r.get(x) is not None and r.get(metric) is not None:
            series.setdefault(tuple(r.get(k) for k in keys), []).append(r)
    ticks, curves = None, {}
    for i, (name, members) in enumerate(sorted(series.items(), key=lambda kv: str(kv[0]))):
        members.sort(key=lambda r: (isinstance(r[x], str), r[x]))
        xs, ticks = _positions([r[x] for r in members])
        label = " ".join(str(v) for v in name) or "measured"
        ax.plot(xs, [r[metric] for r in members], "o-", color=f"C{i % 10}", label=label)
        pairs = tuple((p, r[predicted]) for p, r in zip(xs, members)
                      if predicted and r.get(predicted) is not None)
        if pairs:
            curves.setdefault(pairs, []).append((f"C{i % 10}", label))
    for pairs, owners in curves.items():
        # one dashed line per distinct prediction: black when every series shares it
        color, label = owners[0] if len(curves) > 1 else ("black", "")
        ax.plot(*zip(*pairs), "--", color=color, alpha=0.8,
                label=f"cost model{': ' + label if label else ''}")
    if ticks:
        ax.set_xticks(range(len(ticks)), [str(t) for t in ticks])
    ax.set_xlabel(x)
    ax.set_ylabel(metric + (f" (dashed: {predicted}, cost model)" if predicted else ""))
    ax.grid(alpha=0.3)
    if series:
        ax.legend(fontsize=7)


def plot_table(rows: list[dict], meta: dict, x: str | None = None):
    """One panel per lab of the sweep: its headline metric against ``x`` (see ``_x_of``).
    ``meta``: the sweep table's notes (``swept``, ``headlines``, ``machine``)."""
    ok = [r for r in rows if r.get("status", "ok") == "ok"]
    labs = list(dict.fromkeys(r["lab"] for r in ok)) or ["(no point finished)"]
    fig, axes = plt.subplots(1, len(labs), figsize=(6 * len(labs), 4.2), squeeze=False)
    swept = meta.get("swept", [])
    for ax, lab in zip(axes[0], labs):
        mine = [r for r in ok if r.get("lab") == lab]
        headline = meta.get("headlines", {}).get(lab) or {"metric": "step_time_s"}
        axis = _x_of(mine, swept, headline, x)
        _panel(ax, mine, headline, axis, swept)
        ax.set_title(f"labs/{lab}.py: {headline['metric']} against {axis}", fontsize=10)
    fig.suptitle(machine_title(meta.get("machine"), ok), fontsize=9)
    fig.tight_layout()
    return fig


def plot_sweep(folder: str | Path, x: str | None = None, out: str | Path | None = None) -> Path:
    """Draw a finished sweep folder (``labs/sweep.py``'s table): each lab's headline metric
    against the swept setting (or ``x``), measured points over the cost model's prediction
    where the lab has one; saved as ``plot.png`` beside the table (or at ``out``)."""
    folder = Path(folder)
    table = folder / results.TABLE_JSON
    if not table.exists():
        raise ValueError(f"{folder} has no {results.TABLE_JSON}: give the folder labs/sweep.py "
                         "wrote")
    meta = {k: v for k, v in json.loads(table.read_text()).items() if k != "rows"}
    fig = plot_table(results.load(table), meta, x=x)
    out = Path(out) if out else folder / results.PLOT_PNG
    fig.savefig(out, dpi=120, bbox_inches="tight")
    return out


if __name__ == "__main__":
    import sys
    USAGE = "usage: python -m lessonlib.viz.sweep FOLDER   (a folder labs/sweep.py wrote)"
    if sys.argv[1:] in (["-h"], ["--help"]):
        sys.exit(print(USAGE))
    if len(sys.argv) != 2:
        sys.exit(USAGE)
    try:
        print(f"plot: {plot_sweep(sys.argv[1])}")
    except ValueError as exc:
        sys.exit(str(exc))
