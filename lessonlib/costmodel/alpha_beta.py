"""The alpha-beta model of a collective, fitted to measurements, and what it predicts for DDP.

What it teaches: a message of S bytes costs alpha + S/B. ``allreduce_terms`` says how many
latencies and how many bytes each all-reduce algorithm pays, either on its busiest link (a
cluster, where every GPU has its own links) or in total (CPU ranks on one machine, sharing
it); ``fit_alpha_beta`` fits alpha and B to measured times; ``bucketed_step`` predicts when
the buckets of a DDP step finish if each starts when its gradients are ready and the link is
free. Pure functions (numpy, no torch): the lab measures, this explains.

Try ``python -c "from lessonlib.costmodel.alpha_beta import predict_s; print(predict_s('ring', 4,
2**24, 1e-5, 1e9))"``
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from lessonlib.costmodel.comm import parameter_server_time_s, ring_allreduce_time_s

ALGORITHMS = ("ring", "naive_ring", "parameter_server", "torch")
LINKS = ("dedicated", "shared")


def allreduce_terms(algorithm: str, n: int, size_bytes: float,
                    links: str = "dedicated") -> tuple[float, float]:
    """(latencies paid, bytes that set the pace) of one all-reduce of S bytes.

    ``links="dedicated"``: every rank has its own link (GPUs on NVLink or InfiniBand), so the
    pace is set by the busiest link: ring and torch (gloo's and NCCL's rings) 2(n-1)/n x S,
    parameter server 2(n-1) x S, naive ring (n-1) x S. ``links="shared"``: all ranks share
    one medium (CPU ranks on one machine share its cores and memory bus), so the pace is set
    by the bytes *all* ranks move: 2(n-1) x S for the ring and the server alike, n(n-1) x S
    for the naive ring."""
    if links not in LINKS:
        raise ValueError(f"links={links!r} must be one of {LINKS}")
    if algorithm in ("ring", "torch"):
        latencies = ring_allreduce_time_s(n, 0, 1, 1)
        per_rank = ring_allreduce_time_s(n, size_bytes, 1)
        return latencies, per_rank * (n if links == "shared" else 1)
    if algorithm == "parameter_server":
        return parameter_server_time_s(n, 0, 1, 1), parameter_server_time_s(n, size_bytes, 1)
    if algorithm == "naive_ring":
        return float(n - 1), float((n - 1) * size_bytes) * (n if links == "shared" else 1)
    raise ValueError(f"algorithm={algorithm!r} must be one of {ALGORITHMS}")


def predict_s(algorithm: str, n: int, size_bytes: float, alpha_s: float, bandwidth: float,
              links: str = "dedicated") -> float:
    """alpha-beta time of one all-reduce; ``bandwidth`` in bytes per second."""
    latencies, nbytes = allreduce_terms(algorithm, n, size_bytes, links)
    return latencies * alpha_s + nbytes / bandwidth


@dataclass(frozen=True)
class AlphaBetaFit:
    """What ``fit_alpha_beta`` found: latency (s), bandwidth (bytes/s), the link model it
    assumed, its rms relative error and how many points it used."""
    alpha_s: float
    bandwidth_Bps: float
    links: str
    rms_relative_error: float
    points: int


def predict_from_fit(algorithm: str, n: int, size_bytes: float,
                     fit: AlphaBetaFit | dict) -> float:
    """``predict_s`` with the alpha, B and link model of a ``fit_alpha_beta`` result, or of
    one a lab stored in its JSON record (a dict: the file's format)."""
    if isinstance(fit, dict):
        return predict_s(algorithm, n, size_bytes, fit["alpha_s"], fit["bandwidth_Bps"],
                         fit.get("links", "dedicated"))
    return predict_s(algorithm, n, size_bytes, fit.alpha_s, fit.bandwidth_Bps, fit.links)


def fit_alpha_beta(points, algorithm: str, links: str = "dedicated") -> AlphaBetaFit:
    """Least-squares alpha (s) and B (bytes/s) from ``points`` = [(n, size_bytes, time_s)],
    on relative error so that 1 KB and 64 MB messages count alike."""
    rows, used = [], []
    for n, size, t in points:
        latencies, nbytes = allreduce_terms(algorithm, n, size, links)
        if t > 0 and (latencies or nbytes):
            rows.append([latencies / t, nbytes / t])
            used.append((n, size, t))
    if len(rows) < 2:
        raise ValueError(f"fitting alpha and B needs at least 2 measured points with n > 1; "
                         f"got {len(rows)}")
    a = np.array(rows)
    alpha, inv_bw = np.linalg.lstsq(a, np.ones(len(rows)), rcond=None)[0]
    if alpha < 0:                                   # latency below resolution: bandwidth only
        alpha, inv_bw = 0.0, float(np.linalg.lstsq(a[:, 1:], np.ones(len(rows)), rcond=None)[0][0])
    inv_bw = max(inv_bw, 1e-15)
    errors = [predict_s(algorithm, n, s, alpha, 1 / inv_bw, links) / t - 1 for n, s, t in used]
    return AlphaBetaFit(alpha_s=float(alpha), bandwidth_Bps=float(1 / inv_bw), links=links,
                        rms_relative_error=float(math.sqrt(sum(e * e for e in errors)
                                                           / len(errors))),
                        points=len(used))


@dataclass(frozen=True)
class BucketedStep:
    """``bucketed_step``'s plan: each bucket's (ready, start, end) in seconds from the start
    of backward, when the last one ends, and the communication left after backward."""
    buckets: list
    end_s: float
    exposed_s: float


def bucketed_step(grad_bytes: float, n: int, bucket_bytes: float, backward_s: float,
                  fit: AlphaBetaFit | dict, overlap: bool = True) -> BucketedStep:
    """Predicted end of a DDP step's communication, measured from the start of backward.

    Gradients become ready at a steady rate during ``backward_s``; bucket j's ring
    all-reduce starts when its last gradient is ready (or, without overlap, when backward
    ends) and the previous bucket is done; each takes the ring time ``fit`` predicts (a
    ``fit_alpha_beta`` result). Returns the buckets' (ready, start, end) and the
    communication left exposed after backward."""
    if bucket_bytes <= 0 or grad_bytes < 0:
        raise ValueError(f"bucket_bytes={bucket_bytes} must be > 0 and grad_bytes={grad_bytes} "
                         f">= 0")
    k = max(1, math.ceil(grad_bytes / bucket_bytes))
    sizes = [min(bucket_bytes, grad_bytes - j * bucket_bytes) for j in range(k)]
    buckets, done, filled = [], 0.0, 0.0
    for size in sizes:
        filled += size
        ready = backward_s * filled / grad_bytes if grad_bytes else backward_s
        start = max(ready if overlap else backward_s, done)
        done = start + (predict_from_fit("ring", n, size, fit) if n > 1 else 0.0)
        buckets.append((ready, start, done))
    return BucketedStep(buckets=buckets, end_s=max(done, backward_s),
                        exposed_s=max(0.0, done - backward_s))
