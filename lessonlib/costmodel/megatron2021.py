"""The cost model against a published result: Megatron-LM 2021, Table 1.

Narayanan et al. (SC21) trained ten GPT models from 1.7 B to 1 T parameters on 32 to 3072
A100 GPUs and reported the TFLOP/s each GPU achieved (137 to 163, 44-52 % of peak). The
table is stored in ``data/megatron2021_table1.csv`` (source in
``data/README-megatron2021.md``). ``table1_report()`` rebuilds every run as a ``Layout``
(d = n/(t*p), m = B/(b*d), the published b and v, interleaved 1F1B with scatter/gather and
full recompute, and the DDP the authors' run script chose: PyTorch's, which overlaps the
gradients' all-reduce with the backward, or Megatron's own, which does not) on a DGX A100
cluster and prints published, predicted and error per row.

Run ``python -c "from lessonlib.costmodel import table1_report; print(table1_report())"``.
"""
import csv
from dataclasses import dataclass
from pathlib import Path

from .hardware import CLUSTERS
from .model import GPT
from .throughput import Layout, estimate

TABLE1_CSV = Path(__file__).resolve().parents[2] / "data" / "megatron2021_table1.csv"
SEQ, VOCAB = 2048, 51200  # every Table 1 row (Megatron-LM 2021, Table 1 setup)


def load_table1(path=None):
    """Table 1 as a list of dicts with int columns (float for parameters and TFLOP/s)."""
    path = Path(path) if path else TABLE1_CSV
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: the table ships in the repository's "
                                f"data/ folder; pass path= to load_table1")
    rows = []
    with open(path, newline="") as f:
        for raw in csv.DictReader(f):
            row = {k: int(v) for k, v in raw.items()
                   if k not in ("params_billion", "tflops_per_gpu")}
            row["params_billion"] = float(raw["params_billion"])
            row["tflops_per_gpu"] = float(raw["tflops_per_gpu"])
            rows.append(row)
    return rows


def table1_model(row):
    """The GPT shape of one Table 1 row."""
    return GPT(row["layers"], row["hidden"], row["heads"], SEQ, VOCAB,
               f"megatron-{row['params_billion']}B")


def table1_layout(row):
    """The paper's layout for one row: d = n/(t*p), m = B/(b*d), interleaved, scatter/gather;
    the gradients' all-reduce overlapped where the run script chose PyTorch's DDP; Megatron's
    own cross entropy (``kernels.MEGATRON_LOSS_BYTES``)."""
    t, p = row["t"], row["p"]
    return Layout(t=t, p=p, d=row["gpus"] // (t * p), b=row["b"], global_batch=row["batch"],
                  v=row["v"], recompute="full", scatter_gather=True,
                  overlap_comm=bool(row.get("ddp_overlap", 0)), loss="megatron")


@dataclass(frozen=True)
class Table1Row:
    """One Table 1 row, its published columns (``load_table1``'s) with the model's
    ``predicted`` TFLOP/s per GPU, the relative ``error`` and the ``estimate``."""
    params_billion: float
    heads: int
    hidden: int
    layers: int
    t: int
    p: int
    gpus: int
    batch: int
    tflops_per_gpu: float
    percent_peak: int
    b: int
    v: int
    ddp_overlap: int
    predicted: float
    error: float
    estimate: object


def table1_rows(path=None, cluster=None) -> list[Table1Row]:
    """Each row of Table 1 predicted, a ``Table1Row``."""
    cluster = cluster or CLUSTERS["dgx-a100"]
    out = []
    for row in load_table1(path):
        est = estimate(table1_model(row), table1_layout(row), cluster)
        predicted = est.tflops_per_gpu
        out.append(Table1Row(**row, predicted=predicted, estimate=est,
                             error=(predicted - row["tflops_per_gpu"]) / row["tflops_per_gpu"]))
    return out


def table1_report(path=None, cluster=None):
    """A text table: published vs predicted TFLOP/s per GPU for every Table 1 row."""
    lines = [f"{'params':>8} {'t':>2} {'p':>3} {'d':>3} {'b':>3} {'v':>2} {'m':>4} {'DDP':>5} "
             f"{'published':>9} {'predicted':>9} {'error':>7} {'bubble':>7} {'memory GB':>9}"]
    for r in table1_rows(path, cluster):
        est = r.estimate
        lines.append(
            f"{r.params_billion:>7.1f}B {r.t:>2} {r.p:>3} {est.layout.d:>3} "
            f"{r.b:>3} {r.v:>2} {est.layout.m:>4} {'torch' if r.ddp_overlap else 'local':>5} "
            f"{r.tflops_per_gpu:>9.0f} "
            f"{r.predicted:>9.1f} {r.error:>+7.1%} {est.bubble_fraction:>7.1%} "
            f"{est.memory.total / 1e9:>9.1f}")
    lines.append("TFLOP/s per GPU with FLOPs counted by Megatron-LM 2021 Eq. 3; "
                 "bubble = share of wall time; DDP: the run script's, PyTorch's (torch: "
                 "the all-reduce under the backward) or Megatron's (local: after it).")
    return "\n".join(lines)
