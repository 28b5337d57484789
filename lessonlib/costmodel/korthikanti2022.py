"""The cost model against a published result: Korthikanti et al. 2022, Tables 4 and 5.

"Reducing Activation Recomputation in Large Transformer Models" timed one layer of a 22 B GPT
(Table 4) under each way of keeping its activations, and whole training iterations of four
models with full recompute and with selective recompute + sequence parallelism (Table 5), on
A100 GPUs. Both are *checks*, not calibrations: nothing here is fitted to them, nor to any
other table (``throughput.py``: a GEMM's rate from a published matmul sweep, the
memory-bound passes counted).

* ``table4_rows()``: one layer's forward + backward time, as the difference of two
  one-stage estimates (L = 2 minus L = 1), which cancels the embedding and the logits, less
  the optimizer's step, which grows with the layers' weights and so does not cancel; the
  overhead of each mode is relative to the baseline (TP alone).
* ``table5_rows()``: the iteration time of each Table 3 run (t = 8, the published p, batch,
  micro-batch 1 or 4, 3 interleaved chunks for 175 B and 530 B), full recompute against
  selective + SP, and ``table5_speedups()`` the ratio of the two, what recompute costs.
  Every absolute time comes out faster than published (``report()`` prints by how much),
  as on Megatron-LM 2021's Table 1, the same A100s: a cost the model lacks there; the
  ratios, which a cost common to both modes cancels out of, are within 6 %.

FLOPs: Table 5's MFU counts the model's FLOPs (``72*B*L*s*h^2*(1 + s/(6h) + V/(12hL))``);
its HFU adds the recomputed attention core (``s/(3h)`` in place of ``s/(6h)``, App. A).
A TFLOP/s quoted "with recompute" counts hardware FLOPs: higher than the model's, for the
same work done.

Run ``python -c "from lessonlib.costmodel import korthikanti2022 as k; print(k.report())"``.
"""
from dataclasses import dataclass, replace

from .hardware import CLUSTERS
from .model import GPT
from .throughput import Layout, estimate

SEQ, VOCAB = 2048, 51200

# Table 4: one layer of the 22 B model (a = 64, h = 6144, t = 8, micro-batch 4), ms.
TABLE4 = {  # mode: (sequence_parallel, recompute, forward ms, backward ms, combined ms)
    "baseline": (False, "none", 7.7, 11.9, 19.6),
    "sequence parallel": (True, "none", 7.2, 11.8, 19.0),
    "full recompute": (False, "full", 7.7, 19.5, 27.2),
    "selective recompute": (False, "selective", 7.7, 13.2, 20.9),
    "selective + sequence parallel": (True, "selective", 7.2, 13.1, 20.3),
}
# Table 3 runs and Table 5 iteration times (s): full recompute -> selective + SP.
TABLE5 = [  # name, L, h, a, t, p, GPUs, batch, micro-batch, v, full s, selective+SP s
    ("22B", 48, 6144, 64, 8, 1, 8, 4, 4, 1, 1.42, 1.10),
    ("175B", 96, 12288, 96, 8, 8, 64, 64, 1, 3, 18.13, 13.75),
    ("530B", 105, 20480, 128, 8, 35, 280, 280, 1, 3, 49.05, 37.83),
    ("1T", 128, 25600, 160, 8, 64, 512, 512, 1, 1, 94.42, 71.49),
]


# Table 5's model and hardware FLOPs utilization (%), selective recompute + SP.
TABLE5_UTILIZATION = {"22B": (41.5, 43.7), "175B": (51.4, 52.8), "530B": (56.0, 57.0),
                      "1T": (56.3, 57.0)}


@dataclass(frozen=True)
class UtilizationRow:
    """One Table 5 model: published MFU and HFU (%), their ratio, App. A's, and the error."""
    model: str
    mfu: float
    hfu: float
    published: float
    predicted: float
    error: float


@dataclass(frozen=True)
class Table4Row:
    """One Table 4 mode: published and predicted ms of a layer, the error, and the mode's
    overhead over the baseline, published and predicted."""
    mode: str
    published_ms: float
    predicted_ms: float
    error: float
    published_overhead: float
    predicted_overhead: float


@dataclass(frozen=True)
class Table5Row:
    """One Table 5 model and mode: published and predicted iteration seconds, the error."""
    model: str
    mode: str
    published_s: float
    predicted_s: float
    error: float


@dataclass(frozen=True)
class Table5Speedup:
    """One Table 5 model: full recompute's time over selective + SP's, published and
    predicted, and the error."""
    model: str
    published: float
    predicted: float
    error: float


def utilization_rows() -> list[UtilizationRow]:
    """Per Table 5 model: published HFU / MFU against App. A's FLOP counts, whose ratio is
    (1 + s/(3h) + V/(12hL)) / (1 + s/(6h) + V/(12hL)): the same step, counted two ways."""
    rows = []
    for name, L, h, *_ in TABLE5:
        mfu, hfu = TABLE5_UTILIZATION[name]
        logits = VOCAB / (12 * h * L)
        predicted = (1 + SEQ / (3 * h) + logits) / (1 + SEQ / (6 * h) + logits)
        rows.append(UtilizationRow(model=name, mfu=mfu, hfu=hfu, published=hfu / mfu,
                                   predicted=predicted, error=predicted / (hfu / mfu) - 1))
    return rows


def layer_time_s(model, layout, cluster):
    """One layer's forward + backward (+ recompute) time, as Table 4 times it: the estimate
    of two one-stage layers minus that of one, which cancels everything that is not a
    layer, less the optimizer's step, which grows with the layers' parameters but is no
    part of a layer's forward or backward."""
    def passes_s(layers):
        est = estimate(replace(model, L=layers), replace(layout, p=1, v=1), cluster)
        return est.step_time_s - est.time["optimizer"]
    return passes_s(2) - passes_s(1)


def table4_rows(cluster=None) -> list[Table4Row]:
    """Per Table 4 row: published and predicted ms, the error, and each mode's overhead."""
    cluster = cluster or CLUSTERS["dgx-a100"]
    model = GPT(48, 6144, 64, SEQ, VOCAB, "korthikanti-22B")
    times = {}                          # mode: (published ms, predicted ms)
    for name, (sp, recompute, fwd, bwd, combined) in TABLE4.items():
        lay = Layout(t=8, b=4, m=1, recompute=recompute, sequence_parallel=sp)
        times[name] = (combined, 1e3 * layer_time_s(model, lay, cluster))
    base_published, base_predicted = times["baseline"]
    return [Table4Row(mode=name, published_ms=published, predicted_ms=predicted,
                      error=predicted / published - 1,
                      published_overhead=published / base_published - 1,
                      predicted_overhead=predicted / base_predicted - 1)
            for name, (published, predicted) in times.items()]


def table5_rows(cluster=None) -> list[Table5Row]:
    """Per Table 5 model and mode: published and predicted iteration seconds, the error."""
    cluster = cluster or CLUSTERS["dgx-a100"]
    rows = []
    for name, L, h, a, t, p, gpus, batch, mb, v, full_s, sel_s in TABLE5:
        model = GPT(L, h, a, SEQ, VOCAB, name)
        for mode, published, recompute, sp in (("full recompute", full_s, "full", False),
                                               ("selective + SP", sel_s, "selective", True)):
            lay = Layout(t=t, p=p, d=gpus // (t * p), b=mb, global_batch=batch, v=v,
                         recompute=recompute, sequence_parallel=sp)
            predicted = estimate(model, lay, cluster).step_time_s
            rows.append(Table5Row(model=name, mode=mode, published_s=published,
                                  predicted_s=predicted, error=predicted / published - 1))
    return rows


def table5_speedups(cluster=None) -> list[Table5Speedup]:
    """Per Table 5 model: full recompute's iteration time over selective + SP's, published
    and predicted, and the error of the prediction."""
    rows = table5_rows(cluster)
    out = []
    for full, selective in zip(rows[::2], rows[1::2]):
        published = full.published_s / selective.published_s
        predicted = full.predicted_s / selective.predicted_s
        out.append(Table5Speedup(model=full.model, published=published, predicted=predicted,
                                 error=predicted / published - 1))
    return out


def report(cluster=None) -> str:
    """Both tables as text: published, predicted, error."""
    lines = ["Table 4, one 22B layer (ms): published / predicted / error; overhead published "
             "/ predicted"]
    for r in table4_rows(cluster):
        lines.append(f"  {r.mode:30s} {r.published_ms:6.1f} {r.predicted_ms:6.1f} "
                     f"{r.error:+6.1%}   {r.published_overhead:+6.1%} "
                     f"{r.predicted_overhead:+6.1%}")
    lines.append("Table 5, iteration (s): published / predicted / error")
    for r in table5_rows(cluster):
        lines.append(f"  {r.model:5s} {r.mode:16s} {r.published_s:7.2f} "
                     f"{r.predicted_s:7.2f} {r.error:+6.1%}")
    lines.append("Table 5, full recompute / selective + SP: published / predicted / error")
    for r in table5_speedups(cluster):
        lines.append(f"  {r.model:5s} {r.published:5.2f} {r.predicted:5.2f} "
                     f"{r.error:+6.1%}")
    return "\n".join(lines)
