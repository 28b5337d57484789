"""What the tensor-parallel runs report, as records with named fields.

What it teaches: a parallel layer is checked by a few numbers with names. ``Parity`` is a
parallel copy against the dense module (the errors of the output, the input gradient, the
gradients and the weights after a few steps, with what the ledger saw), so a test states
``report.block.output < tol`` and a notebook reads ``reports[t].mlp.forward.all_reduce``.
``layer_runs`` and ``sequence_runs`` return these; ``LabRun`` reads a ``labs/tp.py`` record's
rows the same way. Pure Python: nothing here sends a message.

Laptop:  ``python -c "from lessonlib.tensor_parallel import layer_runs;
          print(layer_runs.run_layer_reports(2, (1, 2))[0][2].mlp.errors())"``
GPU box: the same call uses NCCL when 2 GPUs are visible.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from lessonlib.costmodel.comm import ring_allreduce_bytes_per_rank


def ring_bytes_per_rank(event) -> float:
    """What one rank sends for a ledger event on a ring: an all-reduce of S bytes 2(n-1)/n*S,
    a reduce-scatter of S bytes (n-1)/n*S, an all-gather of an S-byte shard (n-1)*S."""
    n, size = event.group_size, event.bytes
    if event.op == "all_reduce":
        return ring_allreduce_bytes_per_rank(n, size)
    return {"reduce_scatter": (n - 1) / n * size, "all_gather": (n - 1) * size}.get(event.op, 0)


@dataclass(frozen=True)
class Traffic:
    """A ledger's collectives: counts by kind, payload bytes, ring bytes each rank sends,
    and every event as (kind, payload bytes) in the order sent."""
    all_reduce: int
    all_gather: int
    reduce_scatter: int
    payload_bytes: int
    ring_bytes_per_rank: float
    events: list
    seconds: float


def traffic(book) -> Traffic:
    """The ``Traffic`` of a ledger (``comm.ledger``)."""
    return Traffic(all_reduce=book.count("all_reduce"), all_gather=book.count("all_gather"),
                   reduce_scatter=book.count("reduce_scatter"),
                   payload_bytes=book.total_bytes(),
                   ring_bytes_per_rank=sum(ring_bytes_per_rank(e) for e in book.events),
                   events=[(e.op, e.bytes) for e in book.events],
                   seconds=sum(e.seconds for e in book.events))


@dataclass(frozen=True)
class PlanParity:
    """PyTorch's DTensor plan on the same weights against the dense module: relative errors
    of the output, the input gradient and the worst gradient, and the bytes it holds."""
    output: float
    input_grad: float
    grads: float
    param_bytes: int


@dataclass(frozen=True)
class Parity:
    """A parallel copy against the dense module (``layer_runs.compare_with_dense``): relative errors
    of the first step's output, input gradient (None for token input) and worst gradient
    (and its name), of the weights after the last step (and the worst one's name); the
    ledgers of the first step's forward and backward; every step's loss; parameter bytes,
    this rank's and the dense module's; ``torch``: DTensor's plan on the same weights."""
    output: float
    input_grad: float | None
    grads: float
    worst_grad: str
    forward: Traffic
    backward: Traffic
    weights_after_steps: float
    worst_weight: str
    losses: list
    param_bytes: int
    dense_param_bytes: int
    torch: PlanParity | None = None

    def errors(self) -> dict:
        """The relative errors measured: {output, input_grad (if any), grads,
        weights_after_steps}."""
        return {name: value for name, value in (
            ("output", self.output), ("input_grad", self.input_grad), ("grads", self.grads),
            ("weights_after_steps", self.weights_after_steps)) if value is not None}


@dataclass(frozen=True)
class LayerReport:
    """One rank's ``layer_runs.layer_report``: its group's t, the shapes, the elements a layer
    sends per rank by Megatron's count, and the ``Parity`` of each kind run (None if not)."""
    rank: int
    t: int
    b: int
    s: int
    h: int
    predicted_elements_per_layer: float
    mlp: Parity | None = None
    block: Parity | None = None
    gpt: Parity | None = None

    def layer(self, kind: str) -> Parity:
        """The ``Parity`` of ``kind``: "mlp", "block" or "gpt"."""
        return {"mlp": self.mlp, "block": self.block, "gpt": self.gpt}[kind]


# ---------------------------------------------------------------- sequence parallelism
@dataclass(frozen=True)
class SequencePlanParity:
    """PyTorch's sequence-parallel plan on this rank's s/t rows: theirs against the dense
    layer (output, input gradient, worst gradient) and ours against theirs."""
    output: float
    input_grad: float
    grads: float
    ours_vs_theirs_output: float
    ours_vs_theirs_input_grad: float

    def largest(self) -> float:
        """The largest of the five errors."""
        return max(getattr(self, f.name) for f in fields(self))


@dataclass(frozen=True)
class SequenceParity:
    """One rank's ``sequence_runs.parity_report``: ``vs_dense`` {mode or model: Parity}
    (the layer in each mode, the TP+SP GPT), ``torch``: PyTorch's plan, when run."""
    rank: int
    t: int
    b: int
    s: int
    h: int
    vs_dense: dict
    torch: SequencePlanParity | None = None


@dataclass(frozen=True)
class Kept:
    """The bytes one layer keeps for backward: measured (and in how many tensors) and by
    the exact formula."""
    measured: int
    tensors: int
    formula: int


@dataclass(frozen=True)
class ActivationBytes:
    """One rank's ``sequence_runs.activation_report``: the shapes, and ``kept`` {mode:
    Kept}, "dense" being the plain layer in one process."""
    rank: int
    t: int
    b: int
    s: int
    h: int
    a: int
    element_size: int
    kept: dict


@dataclass(frozen=True)
class Sent:
    """What one forward and one backward of a layer sent."""
    forward: Traffic
    backward: Traffic


@dataclass(frozen=True)
class LedgerReport:
    """One rank's ``sequence_runs.ledger_report``: the shapes and ``sent`` {mode: Sent}."""
    t: int
    b: int
    s: int
    h: int
    element_size: int
    sent: dict


@dataclass(frozen=True)
class SequenceLesson:
    """What notebook 14 launches (``sequence_runs.lesson_report``), by t (``bytes_by_s``:
    by s at t = 2)."""
    bytes: dict
    bytes_by_s: dict
    ledger: dict
    parity: dict


# ---------------------------------------------------------------- labs/tp.py's records
@dataclass(frozen=True)
class LabRow:
    """One implementation's one layer kind in a ``labs/tp.py`` record (its ``rows``);
    the last three are absent from records written before ``--sequence-parallel``."""
    implementation: str
    layer: str
    t: int
    step_time_s: float
    step_time_over_torch: float | None
    paired_step_time_over_torch: float | None
    all_reduces: int
    comm_bytes: int
    param_bytes_per_rank: list
    matrix_bytes_per_rank: list
    matrix_bytes_fraction_of_dense: float
    output_max_abs_error: float
    input_grad_max_abs_error: float
    sequence_parallel: bool | None = None
    recompute: str | None = None
    saved_bytes: int | None = None


@dataclass(frozen=True)
class LabRun:
    """A ``labs/tp.py`` record read as rows: its command, settings and ``LabRow``s."""
    command: str
    settings: dict
    rows: tuple

    @classmethod
    def from_record(cls, record: dict) -> LabRun:
        return cls(record["command"], record["settings"],
                   tuple(LabRow(**row) for row in record["rows"]))

    def row(self, implementation: str, layer: str) -> LabRow:
        """The row of ``implementation`` ("lessonlib", "torch") and ``layer`` ("mlp",
        "block")."""
        return next(r for r in self.rows
                    if (r.implementation, r.layer) == (implementation, layer))
