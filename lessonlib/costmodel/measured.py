"""Your own measured runs against the cost model: how far off it is, and whether it ranks
your layouts in the order they ran.

What it teaches: a cost model earns trust on runs it has never seen, and for choosing a
layout the order of the layouts matters as much as the number. ``read_runs(path)`` reads a
CSV of runs you measured, one per line; ``measured_report(runs)`` predicts each one as
``published.published_report`` predicts the record (the same ``published_rows``, so the
same error: predicted / measured - 1), prints the error's median and worst, the memory
where you measured it, and then, job by job (the layouts of one model on one cluster and
GPU count), how many pairs of layouts the model puts in the measured order (Kendall's tau),
and what the layout it ranks first ran at against the fastest you measured.

The CSV, one run per line (a header line names the columns; an empty cell takes the default,
but for ``recompute``, which every run must give: a full recompute adds a forward pass; and
``fp8_scaling`` with ``precision`` fp8):

* ``name``: how the report names the run (default: its line number);
* the model: ``model``, a preset (``model.MODELS``), with ``seq`` to change its sequence
  length; or its shape: ``layers``, ``hidden``, ``heads``, ``seq``, ``vocab`` (and
  ``kv_heads``, ``ffn``, ``mlp``, ``tied_embeddings``, ``position_table``);
* the cluster: ``cluster``, a preset (``hardware.CLUSTERS``; default dgx-h100); or ``gpu``
  with ``gpus_per_node``, ``network_gbit``, ``network_ports``, ``collectives``;
* the layout: any of ``Layout``'s settings by name (``t``, ``c``, ``p``, ``d``, ``b``,
  ``global_batch``, ``v``, ``recompute``, ``zero_stage``, ``overlap_comm``, ...), and ``gpus``
  to check t*c*p*d against (or, without ``d``, to set d to the GPUs the other axes leave);
* what you measured, exactly one of ``tokens_per_s_per_gpu``, ``step_s``,
  ``tflops_per_gpu`` and ``mfu`` (a fraction of the dense BF16 peak), with ``flops``
  naming the FLOP count behind TFLOP/s or MFU (``compute.team_flops_per_token``; default
  "megatron-eq3", the hardware count, for TFLOP/s and "course" for MFU); and, if you
  measured it, ``peak_gib``, the peak memory per GPU (``torch.cuda.max_memory_reserved()``,
  which torchtitan logs: the allocator's fragmentation, which the model leaves out,
  included);
* ``job``: which runs are layouts of one job, to rank together (default: same model, GPU
  count and cluster).

A bad cell stops the read with one line naming the line, the column, the value and what
would work. ``data/measured_runs_example.csv`` holds torchtitan's published benchmark runs
in this form. Two sets of runs no term of the model was shaped on are held out beside it:
``data/measured_runs_bigscience_2022.csv``, BigScience's timed layouts of ~180-200B models
before BLOOM, and ``data/measured_runs_megatron_bridge_h100.csv``, NVIDIA's Megatron-Bridge
benchmarks of Llama 3 8B, 70B and 405B on DGX-H100 (releases 25.09 and 26.02).

One job: measured runs read and set against the model; it runs past 300 lines because a
CSV cell that cannot be read gets its own line naming what would work.

Run ``python -m lessonlib.costmodel --measured data/measured_runs_example.csv``.
"""
import csv
from dataclasses import dataclass, fields, replace
from itertools import combinations
from pathlib import Path

from .compute import team_flops_per_token
from .gemm import FP8_SCALINGS
from .hardware import GiB, get_cluster, get_gpu, make_cluster
from .layout import RECOMPUTE_MODES
from .model import GPT, get_model
from .published import MISSED_BEYOND, error_summary, published_rows, published_step_s
from .record import CHECKED, PublishedRun
from .throughput import Layout

# torchtitan's published benchmark runs in this form (the module docstring), and two sets held
# out (none of their runs shaped the model): BigScience's layout sweep before BLOOM and
# Megatron-Bridge's Llama 3 benchmarks on H100
EXAMPLE_CSV = Path(__file__).resolve().parents[2] / "data" / "measured_runs_example.csv"
HELD_OUT_CSV = EXAMPLE_CSV.with_name("measured_runs_bigscience_2022.csv")
HELD_OUT_H100_CSV = EXAMPLE_CSV.with_name("measured_runs_megatron_bridge_h100.csv")
# What a run may say it measured, and the ``published`` metric each becomes.
METRICS = {"tokens_per_s_per_gpu": "tokens", "step_s": "seconds", "tflops_per_gpu": "tflops",
           "mfu": "mfu"}
DEFAULT_FLOPS = {"tflops": "megatron-eq3", "mfu": "course"}
SHAPE = {"layers": "L", "hidden": "h", "heads": "a", "seq": "s", "vocab": "V",
         "kv_heads": "kv_heads", "ffn": "ffn", "mlp": "mlp", "tied_embeddings": "tied_embeddings",
         "position_table": "position_table"}
CLUSTER_COLUMNS = ("cluster", "gpu", "gpus_per_node", "network_gbit", "network_ports",
                   "collectives")
LAYOUT_FIELDS = {f.name: f for f in fields(Layout)}
OTHER = ("name", "model", "gpus", "flops", "peak_gib", "job")
COLUMNS = OTHER + tuple(SHAPE) + CLUSTER_COLUMNS + tuple(LAYOUT_FIELDS) + tuple(METRICS)
TRUE, FALSE = ("true", "yes", "1"), ("false", "no", "0")


@dataclass(frozen=True)
class MeasuredRun:
    """One run you measured: ``run`` (a ``record.PublishedRun`` whose published figure is
    your measurement), your peak memory per GPU in GiB (``peak_gib``, or None) and the
    ``job`` it is ranked in."""
    run: PublishedRun
    peak_gib: float | None
    job: str


def _bad(line, column, value, what):
    return ValueError(f"line {line}: {column}={value!r} {what}")


def _number(line, column, text, kind=int, zero=False):
    """The cell as a positive ``kind`` (or zero, with ``zero``)."""
    try:
        value = kind(text)
    except ValueError:
        raise _bad(line, column, text, f"is not {'an integer' if kind is int else 'a number'}"
                   ) from None
    if value < 0 or (value == 0 and not zero) or value != value or value == float("inf"):
        raise _bad(line, column, text, f"must be a {'non-negative' if zero else 'positive'} "
                   "number")
    return value


def _boolean(line, column, text):
    if text.lower() in TRUE + FALSE:
        return text.lower() in TRUE
    raise _bad(line, column, text, f"must be true or false ({', '.join(TRUE + FALSE)})")


def _setting(line, name, text):
    """A ``Layout`` setting from its cell, by the type of its default."""
    default = LAYOUT_FIELDS[name].default
    if isinstance(default, bool):
        return _boolean(line, name, text)
    if isinstance(default, (int, float)) or default is None:
        kind = float if isinstance(default, float) else int
        return _number(line, name, text, kind, zero=default == 0)
    return text


def _model(line, cells):
    shape = {}
    for column, key in SHAPE.items():
        if column in cells:
            text = cells[column]
            shape[key] = (text if column == "mlp" else _boolean(line, column, text)
                          if column in ("tied_embeddings", "position_table")
                          else _number(line, column, text))
    if "model" in cells:
        base = get_model(cells["model"])
        if set(shape) - {"s"}:
            raise _bad(line, "model", cells["model"], "is a preset: with it give only seq, "
                       f"not {', '.join(sorted(set(cells) & set(SHAPE) - {'seq'}))}")
        return replace(base, s=shape["s"]) if "s" in shape else base
    missing = [c for c in ("layers", "hidden", "heads", "seq", "vocab") if c not in cells]
    if missing:
        raise ValueError(f"line {line}: the model is not set: give model (a preset, e.g. "
                         f"llama3-8B) or its shape; missing {', '.join(missing)}")
    return GPT(**shape, name=f"{shape['L']} layers of h {shape['h']}")


def _cluster(line, cells):
    if "cluster" in cells:
        if set(cells) & set(CLUSTER_COLUMNS[1:]):
            raise _bad(line, "cluster", cells["cluster"], "is a preset: give either it or "
                       "gpu with gpus_per_node, network_gbit, network_ports, collectives")
        get_cluster(cells["cluster"])
        return cells["cluster"]
    if "gpu" not in cells:
        return "dgx-h100"
    gpu = get_gpu(cells["gpu"])
    per_node = _number(line, "gpus_per_node", cells.get("gpus_per_node", "8"))
    return make_cluster(gpu, per_node,
                        _number(line, "network_gbit", cells["network_gbit"], float)
                        if "network_gbit" in cells else None,
                        network_ports=_number(line, "network_ports", cells["network_ports"])
                        if "network_ports" in cells else None,
                        collectives=cells.get("collectives", "multi-ring"),
                        name=f"servers of {per_node} {gpu.name}")


def _measured(line, cells):
    given = [c for c in METRICS if c in cells]
    if len(given) != 1:
        raise ValueError(f"line {line}: give exactly one measured figure, one of "
                         f"{', '.join(METRICS)}; this line has "
                         f"{', '.join(given) if given else 'none'}")
    column = given[0]
    metric, value = METRICS[column], _number(line, column, cells[column], float)
    if metric == "mfu" and value > 1:
        raise _bad(line, "mfu", cells["mfu"], f"must be a fraction of peak ({value / 100:g} "
                   "for a percentage)")
    flops = cells.get("flops", DEFAULT_FLOPS.get(metric, ""))
    if flops and metric not in DEFAULT_FLOPS:
        raise _bad(line, "flops", flops, "names a FLOP count, which only tflops_per_gpu "
                   "and mfu use")
    return metric, value, flops


def parse_run(line, cells):
    """A ``MeasuredRun`` from one CSV line's non-empty cells (a dict by column);
    ValueError naming the line, the column and the value for any that cannot be read."""
    try:
        return _parse_run(line, cells)
    except ValueError as error:
        text = str(error)
        raise ValueError(text if text.startswith("line ") else f"line {line}: {text}") from None


def _parse_run(line, cells):
    unknown = [c for c in cells if c not in COLUMNS]
    if unknown:
        raise ValueError(f"line {line}: unknown column {unknown[0]!r}; the columns are "
                         f"{', '.join(COLUMNS)}")
    model, cluster = _model(line, cells), _cluster(line, cells)
    metric, value, flops = _measured(line, cells)
    settings = {k: _setting(line, k, v) for k, v in cells.items() if k in LAYOUT_FIELDS}
    if "gpus" in cells and "d" not in cells:      # d: the GPUs the other axes leave
        gpus = _number(line, "gpus", cells["gpus"])
        others = settings.get("t", 1) * settings.get("c", 1) * settings.get("p", 1)
        if gpus % others:
            raise _bad(line, "gpus", cells["gpus"], f"is not divisible by t*c*p = {others}")
        settings["d"] = gpus // others
    if "recompute" not in settings:
        raise ValueError(f"line {line}: recompute is not given; say what the run recomputed: "
                         f"{', '.join(RECOMPUTE_MODES)} (no default here: Layout's, full, is "
                         f"Megatron-LM 2021's, and today's frameworks recompute nothing unless "
                         f"told)")
    if settings.get("precision") == "fp8" and "fp8_scaling" not in settings:
        raise ValueError(f"line {line}: precision=fp8 needs fp8_scaling, how its casts scale: "
                         f"{', '.join(FP8_SCALINGS)} (torchao's Float8 is tensorwise, "
                         f"Transformer Engine's delayed scaling te, its current scaling "
                         f"te-current)")
    layout = Layout(**settings)
    layout.check(model)
    if flops:
        team_flops_per_token(model, flops)
    if "gpus" in cells and _number(line, "gpus", cells["gpus"]) != layout.n_gpus:
        raise _bad(line, "gpus", cells["gpus"], f"does not match t*c*p*d = {layout.t}*"
                   f"{layout.c}*{layout.p}*{layout.d} = {layout.n_gpus}")
    peak = _number(line, "peak_gib", cells["peak_gib"], float) if "peak_gib" in cells else None
    name = cells.get("name", f"line {line}")
    where = cluster if isinstance(cluster, str) else cluster.name
    job = cells.get("job", f"{model.name or 'model'} (s {model.s}) on {layout.n_gpus} "
                           f"GPUs of {where}")
    return MeasuredRun(PublishedRun(name, model, cluster, layout, metric, value, flops,
                                    CHECKED), peak, job)


def read_runs(path):
    """The ``MeasuredRun``s of a CSV file (columns in the module docstring); ValueError with
    one line for the first cell that cannot be read, before anything is predicted."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"measured={str(path)!r} is not a file; give a CSV of your runs, "
                         f"e.g. data/measured_runs_example.csv")
    with open(path, newline="") as f:       # the file's lines but its comments, numbered
        kept = [(n, text) for n, text in enumerate(f, start=1) if not text.startswith("#")]
    reader = csv.DictReader(text for _, text in kept)
    runs = [parse_run(kept[reader.line_num - 1][0],
                      {k.strip(): v.strip() for k, v in row.items()
                       if k is not None and v is not None and v.strip()})
            for row in reader]
    if not runs:
        raise ValueError(f"measured={str(path)!r} holds no runs: a header line, then a run "
                         f"per line")
    return runs


@dataclass(frozen=True)
class JobRanking:
    """The layouts of one job in the measured and in the predicted order: ``names``, the
    measured and predicted tokens/s per GPU, the pairs in the same order (``agree``) of
    ``pairs`` compared (measured ties left out; a pair the model prices alike agrees with
    neither order), Kendall's tau, and what the layout the model ranks first ran at as a
    share of the fastest measured (``first_choice``)."""
    job: str
    names: tuple
    measured: tuple
    predicted: tuple
    agree: int
    pairs: int
    tau: float | None
    first_choice: float

    @property
    def fastest(self):
        """The name of the run measured fastest."""
        return self.names[self.measured.index(max(self.measured))]

    @property
    def first(self):
        """The name of the run the model ranks first."""
        return self.names[self.predicted.index(max(self.predicted))]


def _measured_tokens(row):
    """Tokens/s per GPU that a row's measurement implies (``published_step_s``)."""
    run = row.run
    return run.layout.global_batch * run.model.s / published_step_s(row) / run.n_gpus


def rank_jobs(runs, rows):
    """A ``JobRanking`` per job with two or more runs, in the order the jobs first appear."""
    jobs = {}
    for measured, row in zip(runs, rows):
        jobs.setdefault(measured.job, []).append(row)
    out = []
    for job, members in jobs.items():
        if len(members) < 2:
            continue
        real = [_measured_tokens(r) for r in members]
        model = [r.estimate.tokens_per_s / r.run.n_gpus for r in members]
        compared = [(i, j) for i, j in combinations(range(len(members)), 2)
                    if real[i] != real[j]]
        # a pair the model prices alike counts neither way (Kendall's tau-a)
        agree = sum((real[i] > real[j]) == (model[i] > model[j]) for i, j in compared
                    if model[i] != model[j])
        ties = sum(model[i] == model[j] for i, j in compared)
        tau = (2 * agree + ties - len(compared)) / len(compared) if compared else None
        first = max(range(len(members)), key=model.__getitem__)
        out.append(JobRanking(job, tuple(r.run.source for r in members), tuple(real),
                              tuple(model), agree, len(compared), tau, real[first] / max(real)))
    return out


@dataclass(frozen=True)
class Judgement:
    """Measured runs judged: ``rows`` (``published.PublishedRow`` per run, the error in what
    you measured), ``memory`` ((predicted GiB, measured GiB or None, error or None, fits)
    per run) and ``jobs`` (``JobRanking``)."""
    rows: list
    memory: list
    jobs: list


def judge(runs):
    """Every ``MeasuredRun`` predicted, its memory, and its job's ranking."""
    rows = published_rows([m.run for m in runs])
    memory = []
    for measured, row in zip(runs, rows):
        gib, peak = row.estimate.memory.total / GiB, measured.peak_gib
        memory.append((gib, peak, gib / peak - 1 if peak else None, row.estimate.fits))
    return Judgement(rows, memory, rank_jobs(runs, rows))


_UNITS = {"tokens": "tok/s/GPU", "seconds": "s/step", "tflops": "TFLOP/s", "mfu": "MFU"}


def measured_report(runs):
    """A text report of ``judge(runs)``: a line per run, the error's median and worst, the
    memory, then a line per job on the order of its layouts."""
    result = judge(runs)
    lines = [f"{'run':50} {'GPUs':>6} {'metric':>9} {'measured':>9} {'predicted':>9} "
             f"{'error':>7}  memory GiB (measured)"]
    for row, (gib, peak, error, fits) in zip(result.rows, result.memory):
        run = row.run
        scale = 100 if run.metric == "mfu" else 1
        memory = (f"{gib:.1f}" + (f" ({peak:.1f}, {error:+.1%})" if peak else "")
                  + ("" if fits else " does not fit, says the model"))
        lines.append(f"{run.source[:50]:50} {run.n_gpus:>6} {_UNITS[run.metric]:>9} "
                     f"{run.published * scale:>9.4g} {row.predicted * scale:>9.4g} "
                     f"{row.error:>+7.1%}  {memory}")
    mid, worst = error_summary([r.error for r in result.rows])
    within = sum(abs(r.error) <= MISSED_BEYOND for r in result.rows)
    lines.append(f"Time: {len(result.rows)} runs, median |error| {mid:.1%}, worst {worst:+.1%}; "
                 f"{within} within 15 %.")
    errors = [error for _, _, error, _ in result.memory if error is not None]
    if errors:
        mid, worst = error_summary(errors)
        lines.append(f"Memory: {len(errors)} runs, median |error| {mid:.1%}, worst "
                     f"{worst:+.1%}.")
    refused = sum(not fits for *_, fits in result.memory)
    if refused:
        lines.append(f"{refused} run(s) you measured do not fit, says the model: its memory "
                     f"misses them.")
    if not result.jobs:
        lines.append("No job has two runs to rank (a job: one model on one cluster and GPU "
                     "count, or the job column).")
    if len(result.jobs) > 1:
        agree, pairs = sum(j.agree for j in result.jobs), sum(j.pairs for j in result.jobs)
        fastest = sum(j.first_choice == 1 for j in result.jobs)
        lines.append(f"Over {len(result.jobs)} jobs: {agree} of {pairs} pairs in the measured "
                     f"order; the model's first choice ran fastest in {fastest}, and at "
                     f"{min(j.first_choice for j in result.jobs):.1%} of the fastest at worst.")
    for job in result.jobs:
        order = (f"{job.agree} of {job.pairs} pairs in the measured order (Kendall's tau "
                 f"{job.tau:+.2f})" if job.pairs else "every run measured alike")
        choice = (f"the model's first choice, {job.first}, ran fastest" if job.first == job.fastest
                  else f"the model's first choice, {job.first}, ran at "
                       f"{job.first_choice:.1%} of the fastest, {job.fastest}")
        lines.append(f"{job.job}, {len(job.names)} layouts: {order}; {choice}.")
    return "\n".join(lines)
