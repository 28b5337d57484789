"""What a slow rank and a slow link cost a synchronous job: stragglers and DiLoCo's WAN.

A synchronous data-parallel step ends when its slowest rank's compute ends, then the
gradient all-reduce runs: ``t_step = max_r(t_compute_r) + t_comm``. One rank slowed by a
factor ``k`` (a throttled GPU, a busy host) makes every step ``(k - 1) * t_compute``
longer, and the other ranks spend exactly that time waiting inside the all-reduce:
``straggler_step``. The fleet's throughput falls by ``1 - t_even / t_slowed`` whatever its
size: one straggler in 16,384 GPUs costs what it costs in 4.

Pure arithmetic; tested against hand-computed numbers.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StragglerStep:
    """One synchronous step with and without a straggler slowed by ``slowdown``: the step's
    seconds, each healthy rank's wait in the all-reduce, and the throughput lost."""
    even_s: float
    slowed_s: float
    healthy_wait_s: float
    throughput_lost: float


def straggler_step(t_compute: float, t_comm: float, slowdown: float) -> StragglerStep:
    """Price one straggler in a synchronous step: every rank computes ``t_compute`` (the
    straggler ``slowdown`` times that), then they all-reduce in ``t_comm``."""
    if slowdown < 1 or t_compute < 0 or t_comm < 0:
        raise ValueError(f"slowdown={slowdown} must be >= 1 and times >= 0")
    even = t_compute + t_comm
    slowed = slowdown * t_compute + t_comm
    return StragglerStep(even, slowed, (slowdown - 1) * t_compute + t_comm, 1 - even / slowed)
