"""A published run's predicted sweep: the cost model over a grid around the layout a team ran.

What it teaches: a published layout is one point; the model says what its neighbours would
have cost, so a student sees why the team stood where it did (or where the model thinks it
should have). ``--published NAME`` takes a row of ``lessonlib.costmodel.published`` (the
start of its source is enough), and each ``--grid`` axis changes one field of its
``Layout`` (t, c, p, e, b, v, recompute, schedule, zero_stage, cp_comm, ...); when t, c or
p change, d takes the GPUs left so that the run keeps its GPU count and batch. Each point is
one ``estimate``: step time, TFLOP/s and tokens/s per GPU, MFU, bubble, memory, whether it
fits; the table and plot land where ``labs/sweep.py`` puts a lab's.

    python labs/sweep.py --published "Llama 3 Table 4, 128K" --grid c=1,2,4,8,16 --set v=1
    python labs/sweep.py --published DeepSeek --grid e=8,16,32,64 --set p=16

Pure arithmetic: nothing is launched, laptop and GPU box alike.
"""
from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path

from sweep_points import expand, parse_axis

from lessonlib.costmodel import estimate
from lessonlib.costmodel.published import cluster_of, published_runs
from lessonlib.lab import results as R

def find_run(name: str):
    """The published run whose source starts with ``name``; ValueError listing them if none."""
    runs = published_runs()
    found = [r for r in runs if r.source.lower().startswith(name.lower())]
    if not found:
        raise ValueError(f"--published {name!r} names no published run; give the start of one "
                         f"of: {'; '.join(r.source for r in runs)}")
    return found[0]


def _value(text: str):
    return int(text) if text.lstrip("-").isdigit() else text


def check_counts(run, points: list[dict]) -> None:
    """Every whole-number field of the Layout a whole number, at least 1 (zero_stage, at
    least 0): one ValueError naming the field and value, before any point is estimated."""
    whole = {f.name for f in fields(run.layout) if f.type in (int, "int")}
    for point in points:
        for key, text in point.items():
            least = 0 if key == "zero_stage" else 1
            if key in whole and not (text.isdigit() and int(text) >= least):
                example = max(least, getattr(run.layout, key) or 1)
                raise ValueError(f"--grid/--set {key}={text}: {key} takes whole numbers of at "
                                 f"least {least}, e.g. {key}={example}")


def point_layout(run, point: dict):
    """The run's layout with ``point``'s fields; d takes the GPUs that t, c, p leave."""
    lay = run.layout
    new = {k: _value(v) for k, v in point.items()}
    share = new.get("t", lay.t) * new.get("c", lay.c) * new.get("p", lay.p)
    if "d" not in new and lay.n_gpus % share == 0:
        new["d"] = lay.n_gpus // share
    return replace(lay, **new, m=None)


def rows_of(run, points: list[dict]) -> list[dict]:
    rows = []
    for i, point in enumerate(points):
        row = {"point": i, "run": run.source, **point}
        try:
            lay = point_layout(run, point)
            est = estimate(run.model, lay, cluster_of(run))
        except ValueError as exc:
            rows.append({**row, "status": "invalid", "error": str(exc)})
            continue
        rows.append({**row, "status": "ok", "layout": lay.describe(),
                     "step_time_s": est.step_time_s, "tflops_per_gpu": est.tflops_per_gpu,
                     "tokens_per_s_per_gpu": est.tokens_per_s / lay.n_gpus, "mfu": est.mfu,
                     "bubble_fraction": est.bubble_fraction,
                     "memory_gb": est.memory.total / 1e9, "fits": est.fits})
    return rows


def plot(rows: list[dict], axis: str, run, out: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["status"] == "ok"]
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = [str(r[axis]) for r in ok]
    ax.plot(xs, [r["tokens_per_s_per_gpu"] for r in ok], "o-", color="#4c72b0",
            label="predicted")
    for x, r in zip(xs, ok):
        if not r["fits"]:
            ax.plot(x, r["tokens_per_s_per_gpu"], "x", color="#c44e52", ms=10)
    published = str(getattr(run.layout, axis, ""))
    if published in xs:
        ax.axvline(xs.index(published), color="k", ls="--", lw=1, label="published layout")
    ax.plot([], [], "x", color="#c44e52", label="over the model's memory")
    ax.set_xlabel(axis)
    ax.set_ylabel("tokens/s per GPU (predicted)")
    ax.set_title(f"{run.source[:60]}: predicted against {axis}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def sweep(name: str, grids: list[str], fixed: list[str], out: Path, draw: bool) -> int:
    """The published run's predicted table (and plot) in ``out``; ValueError on bad input."""
    run = find_run(name)
    axes = [parse_axis(g) for g in grids]
    if not axes or any(len(keys) > 1 for keys, _ in axes):
        raise ValueError("--published needs one or more --grid FIELD=V1,V2 (one field each)")
    sets = {keys[0]: values[0][0] for keys, values in (parse_axis(s, split=False) for s in fixed)}
    known = {f.name for f in fields(run.layout)} - {"global_batch", "m"}
    for key in [keys[0] for keys, _ in axes] + list(sets):
        if key not in known:
            raise ValueError(f"--grid/--set {key}: not a field of the run's Layout; use one "
                             f"of {', '.join(sorted(known))}")
    points = [{**p, **sets} for p in expand(axes)]
    check_counts(run, points)
    rows = rows_of(run, points)
    out.mkdir(parents=True, exist_ok=True)
    R.write_csv(rows, out / R.TABLE_CSV)
    R.write_json(rows, out / R.TABLE_JSON, published=run.source, swept=[axes[0][0][0]])
    bad = [r for r in rows if r["status"] != "ok"]
    print(f"{len(rows) - len(bad)} of {len(rows)} points estimated for {run.source}; table: "
          f"{out / R.TABLE_CSV}" + (f"; invalid: {[r['error'] for r in bad][:1]}" if bad else ""))
    if draw:
        print(f"plot: {plot(rows, axes[0][0][0], run, out / R.PLOT_PNG)}")
    return 0
