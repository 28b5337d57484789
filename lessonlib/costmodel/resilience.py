"""What a slow rank and a slow link cost a synchronous job: stragglers and DiLoCo's WAN.

A synchronous data-parallel step ends when its slowest rank's compute ends, then the
gradient all-reduce runs: ``t_step = max_r(t_compute_r) + t_comm``. One rank slowed by a
factor ``k`` (a throttled GPU, a busy host) makes every step ``(k - 1) * t_compute``
longer, and the other ranks spend exactly that time waiting inside the all-reduce:
``straggler_step``. The fleet's throughput falls by ``1 - t_even / t_slowed`` whatever its
size: one straggler in 16,384 GPUs costs what it costs in 4.

Two datacenters joined by a WAN (``wan_step``): data parallelism sends the gradients across
the link every step; DiLoCo sends the pseudo-gradients every H steps, so the link's share
of a step falls as 1/H; Streaming DiLoCo also hides each fragment's exchange behind compute.
Bandwidth and latency are parameters: give your own link's. ``WAN_BANDWIDTH`` and
``WAN_LATENCY`` are a typical link between two datacenters, from the sources beside them.

Pure arithmetic; tested against hand-computed numbers.
"""
from __future__ import annotations

from dataclasses import dataclass

# A typical link between two datacenters.
# Bandwidth: 1 Gbit/s, the link Streaming DiLoCo prices its runs on (Douillard et al. 2025,
# arXiv 2501.18512, Table 1: "Hours spent w/ 1 Gbits/s"). Its simulator (section 3.1: "we
# consider only the bandwidth between datacenters") finds that "Our best method reaches
# a compute utilization of 95% for models 1B, 10B, and 100B with a bandwidth roughly
# constant between 1 and 5 Gbit/s. Data-Parallel on the other hand requires 100, 200, and
# 300Gbit/s" (Figure 4; Table 4 lists the Gbit/s for each utilization, with H = 100).
# Latency: the papers price bandwidth only. 20 ms one way is two datacenters 2,000 miles
# apart (NetCraftsmen, "How Data Center Interconnect Technologies Shape WAN Performance":
# "One-way latency was roughly 10 milliseconds per 1,000 miles, so these data centers were
# recording up to 40 ms of round-trip latency between them"; the same page: "it is now
# common to see 1 Gbps WAN links, with some carriers offering 10 Gbps paths").
WAN_BANDWIDTH = 1e9 / 8       # bytes/s
WAN_LATENCY = 0.020           # s, one way


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


@dataclass(frozen=True)
class WanStep:
    """Seconds per inner step of two datacenters training one model over a WAN: data
    parallelism (the gradients cross the link every step), DiLoCo (the pseudo-gradient
    every H steps) and Streaming DiLoCo (a fragment every H/F steps, behind ``overlap``
    steps of compute); and the share of each step spent on the link."""
    ddp_s: float
    diloco_s: float
    streaming_s: float
    ddp_link_share: float
    diloco_link_share: float


def wan_step(t_compute: float, model_bytes: float, bandwidth: float, latency: float, H: int,
             fragments: int = 1, overlap: int = 1) -> WanStep:
    """Price the link: each datacenter sends its ``model_bytes`` (gradients or
    pseudo-gradients, already averaged inside it) across a full-duplex link of
    ``bandwidth`` bytes/s and ``latency`` seconds, and receives the other's:
    ``latency + model_bytes / bandwidth`` per exchange. DiLoCo pays it once per H steps;
    Streaming DiLoCo sends 1/F of it every H/F steps and hides it behind ``overlap``
    steps of compute (the paper's tau), paying only what sticks out."""
    if H < 1 or fragments < 1 or H % fragments or bandwidth <= 0 or latency < 0:
        raise ValueError(f"H={H}, fragments={fragments}, bandwidth={bandwidth}, "
                         f"latency={latency}: need H a multiple of fragments, bandwidth > 0")
    exchange = latency + model_bytes / bandwidth
    fragment = latency + model_bytes / fragments / bandwidth
    ddp, diloco = t_compute + exchange, t_compute + exchange / H
    streaming = t_compute + max(0.0, fragment - overlap * t_compute) / (H // fragments)
    return WanStep(ddp, diloco, streaming, exchange / ddp, (exchange / H) / diloco)
