"""The straggler: which rank sets the pace of a synchronous step.

What it teaches: in a synchronous step every rank waits for the slowest, so a slow GPU
does not look slow: its step takes as long as everyone's. What tells it apart is *where*
the time goes. Each rank splits its step into compute and the time communication held it
(the ledger's ``exposed_seconds``): the straggler computes long and waits little; the
others compute briefly and wait in the all-reduce for it.

The rule is NVIDIA's Resiliency Extension's relative performance score (its straggler
detection usage guide: "Relative performance score: The best-performing rank in the
workload is used as a reference"; "If the relative performance score is 0.5, it means
that a rank is twice as slow as the fastest rank"), applied to each rank's median compute
time per step: ``score_r = min_q(t_q) / t_r``. A rank whose score is below ``threshold``
(0.7 here, our choice: 1.43 times slower than the fastest) is named.
``lessonlib.costmodel.resilience.straggler_step`` prices it.

Laptop:  ``python -c "from lessonlib.faults import stragglers as s; print(s.detect(s.measure(slow_rank=2)))"``
GPU box: the same; on a GPU the ledger's held time is a pair of CUDA events per call.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from lessonlib import comm
from lessonlib.device import current_device
from lessonlib.instruments.ledger import ledger
from lessonlib.launcher import launch
from lessonlib.models import init_weights_, mlp_stack

THRESHOLD = 0.7


@dataclass(frozen=True)
class StepTimes:
    """One rank's seconds per step: ``compute`` (the step less its wait) and ``wait`` (the
    time the gradient all-reduce held it)."""
    rank: int
    compute: tuple[float, ...]
    wait: tuple[float, ...]


@dataclass(frozen=True)
class Stragglers:
    """Each rank's median compute and wait, its relative score, and the ranks named."""
    compute: dict[int, float]
    wait: dict[int, float]
    scores: dict[int, float]
    named: tuple[int, ...]
    threshold: float

    def __str__(self) -> str:
        rows = "\n".join(f"  rank {r}: compute {self.compute[r] * 1e3:7.1f} ms, wait "
                         f"{self.wait[r] * 1e3:7.1f} ms, score {self.scores[r]:.2f}"
                         for r in sorted(self.scores))
        verdict = f"straggler(s): {list(self.named)}" if self.named else "no straggler"
        return f"{verdict} (score below {self.threshold}):\n{rows}"


def relative_scores(seconds: dict[int, float]) -> dict[int, float]:
    """The relative performance score: the fastest rank's time over each rank's."""
    fastest = min(seconds.values())
    return {r: fastest / t for r, t in seconds.items()}


def detect(times: list[StepTimes], threshold: float = THRESHOLD) -> Stragglers:
    """Name the ranks whose median compute per step scores below ``threshold``."""
    compute = {t.rank: statistics.median(t.compute) for t in times}
    wait = {t.rank: statistics.median(t.wait) for t in times}
    scores = relative_scores(compute)
    named = tuple(r for r, s in sorted(scores.items()) if s < threshold)
    return Stragglers(compute, wait, scores, named, threshold)


def rank_steps(steps: int, slow_rank: int | None, slowdown: float, device_s: float) -> StepTimes:
    """A data-parallel MLP's steps, each split into compute and wait. Each step computes the
    gradient for real, then holds ``device_s`` as a GPU's kernels would; ``slow_rank``'s
    device is ``slowdown`` times slower. (CPU ranks share the laptop's cores, so their real
    compute alone varies with the machine's load: the held stretch keeps the lesson's
    signal above that noise.)"""
    rank, dev = dist.get_rank(), current_device()
    model = init_weights_(mlp_stack(64, depth=4, seed=0), seed=0).to(dev)
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(rank)).to(dev)
    compute, wait = [], []
    for _ in range(steps):
        start = time.perf_counter()
        with ledger() as book:
            model.zero_grad()
            model(x).square().mean().backward()
            time.sleep(device_s * (slowdown if rank == slow_rank else 1.0))   # the straggler
            comm.all_reduce(torch.cat([p.grad.flatten() for p in model.parameters()]))
        wall, held = time.perf_counter() - start, book.exposed_seconds()
        compute.append(wall - held)
        wait.append(held)
    return StepTimes(rank, tuple(compute[1:]), tuple(wait[1:]))   # the first step warms up


def measure(world_size: int = 4, steps: int = 6, slow_rank: int | None = None,
            slowdown: float = 3.0, device_s: float = 0.05,
            timeout: float = 60.0) -> list[StepTimes]:
    """Every rank's step times, one launch; ``slow_rank`` None runs them evenly."""
    if slow_rank is not None and not 0 <= slow_rank < world_size:
        raise ValueError(f"slow_rank={slow_rank} is not a rank of {world_size}; "
                         f"choose 0..{world_size - 1} or None")
    if slowdown < 1:
        raise ValueError(f"slowdown={slowdown} must be at least 1 (1: no slowdown)")
    return launch(rank_steps, world_size, steps, slow_rank, slowdown, device_s, timeout=timeout)
