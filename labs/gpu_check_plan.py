"""The points labs/gpu_check.py runs, in order, with the time each should take and the
parity each reports: what ``--dry-run`` lists.

Every lab runs twice on a GPU machine: once at the world size the GPUs allow on NCCL (one
GPU: one rank, its own GPU), and once at 2-4 ranks that share ``cuda:0`` over gloo with
CUDA tensors (``lessonlib.device``'s shared-GPU mode; send and receive go through the CPU,
``lessonlib.gloo_cuda``), which runs the multi-rank code of every lab on one GPU. The hybrid
lab adds two five-axis layouts (context parallelism with sequence parallelism and FSDP;
expert parallelism on the MoE GPT). Each point's parity with one process is read from the
lab's own record where the lab computes it.

Order, most telling first (a budget that runs out cuts the tail, and the report says so):
the five-axis layouts and the other multi-rank points (code no NCCL run at one rank
reaches), then the NCCL points (timings, MFU), the train-and-resume last. Each point's time
is estimated from its CPU time here scaled: ``LAUNCH_S`` to start the ranks (an interpreter,
torch and a CUDA context each) plus the lab's ``cpu_s`` (its tiny settings on 2 CPU ranks)
times ``SCALE`` (the GPU settings are larger, the GPU faster: a guess to check on a GPU).

GPU box: used by ``python labs/gpu_check.py``; ``--dry-run`` prints the plan.
Laptop:  ``python labs/gpu_check.py --dry-run`` (no GPU needed)
"""
from __future__ import annotations

from dataclasses import dataclass, field

from gpu_check_labs import GENERIC, LABS

LAUNCH_S = 8.0          # interpreter + torch import + fork server + CUDA context per point
SCALE = {"nccl": 2.0, "shared": 1.5, "cpu": 1.0}
FIXED = [("versions", 1.0), ("launch", 10.0), ("gemm", 15.0)]
MODES = {"nccl": "its own GPU (NCCL)", "shared": "ranks share cuda:0 (gloo, CUDA tensors)",
         "cpu": "CPU ranks (gloo)"}


@dataclass
class Point:
    """One run of one lab: where its ranks compute, its settings and how it is checked."""

    name: str                      # the report's row, e.g. "pp x3 shared"
    lab: str
    ranks: int | None              # None: not run (the lab needs more ranks)
    mode: str                      # a key of MODES
    settings: dict = field(default_factory=dict)
    parity: str = ""               # what is compared with one process, or why nothing
    estimate_s: float = 0.0
    note: str = ""

    @property
    def backend(self) -> str:
        return "nccl" if self.mode == "nccl" else "gloo"

    @property
    def needs_gpu(self) -> bool:
        return self.mode != "cpu"

    def job(self) -> dict:
        """The point as labs/sweep.py runs it: {flag: value}."""
        return {"world_size": str(self.ranks), "backend": self.backend, **self.settings}


def parity_text(lab: str) -> str:
    spec = LABS.get(lab, GENERIC)
    if spec.parity:
        return "max of " + ", ".join(spec.parity) + " (the lab's record)"
    return spec.no_parity


def _estimate(lab: str, mode: str, ranks: int) -> float:
    return round(LAUNCH_S + SCALE[mode] * LABS.get(lab, GENERIC).cpu_s * max(ranks, 2) / 2, 1)


def plan(present: list[str], gpus: int, quick: bool) -> list[Point]:
    """Every point, in the order they run. ``gpus``: the GPUs visible (0: CPU ranks only,
    each lab's multi-rank points on gloo with tiny settings)."""
    first, then, last = [], [], []
    for name in list(LABS) + [lab for lab in present if lab not in LABS]:
        lab = LABS.get(name, GENERIC)
        if name not in present:
            last.append(Point(name, name, None, "cpu", note=f"labs/{name}.py is not there yet"))
            continue
        shared = "shared" if gpus else "cpu"
        for ranks, extra, label in lab.multi:
            point = Point(f"{name} x{ranks}{label and ' ' + label}", name, ranks, shared,
                          {**lab.tiny, **extra}, parity_text(name),
                          _estimate(name, shared, ranks))
            (first if label else then).append(point)
        if not gpus and name != "train":
            continue                           # CPU ranks: the multi-rank points say it all
        mode, ranks = ("nccl", lab.largest(gpus)) if gpus else ("cpu", 2)
        if ranks is None:
            last.append(Point(f"{name} nccl", name, None, "nccl", note=lab.at_one))
            continue
        settings = lab.tiny if quick else lab.short
        point = Point("train+resume" if name == "train" else f"{name} nccl", name, ranks, mode,
                      dict(settings), parity_text(name), _estimate(name, mode, ranks),
                      note=lab.at_one if ranks == 1 else "")
        (last if name == "train" else then).append(point)
    nccl_last = sorted(then, key=lambda p: p.mode == "nccl")       # stable: lab order kept
    return first + nccl_last + [p for p in last if p.ranks] + [p for p in last if not p.ranks]


def within(points: list[Point], budget_s: float) -> tuple[list[Point], list[Point]]:
    """(the points whose estimates fit the budget after the fixed ones, in order; the rest)."""
    left = budget_s - sum(s for _, s in FIXED)
    fits, cut = [], []
    for p in points:
        if p.ranks is not None and p.estimate_s <= left and not cut:
            fits.append(p)
            left -= p.estimate_s
        elif p.ranks is not None:
            cut.append(p)
    return fits, cut


def listing(points: list[Point], budget_s: float, gpus: int) -> str:
    """The plan as a markdown table, what the budget cuts, and which points need a GPU."""
    fits, cut = within(points, budget_s)
    rows = ["| # | point | ranks | backend | where the ranks compute | parity with one process "
            "| est. s | needs a GPU |", "|---|---|---|---|---|---|---|---|"]
    for i, (name, s) in enumerate(FIXED, 1):
        rows.append(f"| {i} | {name} | {1 if name == 'launch' else ''} | "
                    f"{'nccl' if gpus and name == 'launch' else ''} | | | {s:.0f} | "
                    f"{'yes' if name != 'versions' else 'no'} |")
    for i, p in enumerate(fits + cut, len(FIXED) + 1):
        flag = " (cut: past --budget-s)" if p in cut else ""
        rows.append(f"| {i} | {p.name}{flag} | {p.ranks} | {p.backend} | {MODES[p.mode]} | "
                    f"{p.parity} | {p.estimate_s:.0f} | {'yes' if p.needs_gpu else 'no'} |")
    for p in points:
        if p.ranks is None:
            rows.append(f"| - | {p.name} (not run) | | | | {p.note} | | |")
    total = sum(s for _, s in FIXED) + sum(p.estimate_s for p in fits)
    gpu_points = [p.name for p in fits + cut if p.needs_gpu]
    return "\n".join(rows + [
        "", f"{len(fits)} lab points fit --budget-s {budget_s:.0f} (about {total:.0f} s "
        f"estimated with the launch, the versions and the products)"
        + (f"; cut, in order: {', '.join(p.name for p in cut)}." if cut else "."),
        f"Need a GPU ({len(gpu_points)}): " + (", ".join(gpu_points) or "none") + ".",
        "Without one, tests/test_gpu_check.py runs the shared-GPU points' code on CPU ranks "
        "whose GPU is the placement audit's stand-in (LESSONLIB_STAND_IN_GPU=1)."])
