"""What communication costs: the alpha-beta model of collectives and the bytes each
parallelism sends.

alpha-beta: a message of S bytes over a link of bandwidth B costs alpha + S/B.

* Ring all-reduce = reduce-scatter + all-gather: each of the n ranks sends (and receives)
  2(n-1)/n * S bytes in 2(n-1) steps, so T = 2(n-1)*alpha + 2(n-1)/n * S/B. The bandwidth term
  barely grows with n: rings are bandwidth-optimal (MPICH's collective cost comments; Baidu's
  ring all-reduce).
* A parameter server's one link carries every worker's gradient in and the new weights out:
  about 2(n-1)*S bytes, so it grows with n.
* nccl-tests (doc/PERFORMANCE.md) reports algbw = S/t and busbw = algbw times
  2(n-1)/n for all-reduce, (n-1)/n for reduce-scatter and all-gather, 1 for broadcast and
  reduce: busbw is comparable with the link's bandwidth whatever n is.

Bytes each parallelism sends, per micro-batch (Megatron-LM 2021, Narayanan et al.):

* tensor parallel, per layer and GPU: 8*b*s*h*(t-1)/t elements (§3.2): two all-reduces of
  b*s*h elements in the forward (operator g after attention and after the MLP) and two in
  the backward (operator f); full recompute repeats the forward two.
* pipeline parallel, per stage boundary: b*s*h elements, b*s*h/t with the scatter/gather
  optimisation (§4.1), once forward and once backward.
* data parallel, per step: an all-reduce of the gradients of the GPU's parameters.

Groups follow the grid ``arange(n).view(p, d, t)`` with t innermost (``layout.py``'s rank
order): a TP group is t consecutive GPUs, a DP group strides by t, a PP group by t*d. A
group whose members are all in one server talks over NVLink. How fast one that spans servers
goes depends on how many of its members share each server (``members_per_node``):
``Cluster.group_link`` in ``hardware.py`` turns that into a bandwidth, one network port per
member on DGX-class servers.

Try ``python -c "from lessonlib.costmodel import ring_allreduce_time_s as f;
print(f(8, 1e9, 300e9))"``.
"""
import math
from functools import lru_cache

from lessonlib.argcheck import positive_int

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce")


def _check(n, size_bytes):
    positive_int("n", n, what="ranks")
    if size_bytes < 0:
        raise ValueError(f"size_bytes={size_bytes} must not be negative")


def ring_allreduce_bytes_per_rank(n, size_bytes):
    """Bytes each rank sends in a ring all-reduce of S bytes: 2(n-1)/n * S."""
    _check(n, size_bytes)
    return 2 * (n - 1) / n * size_bytes


def ring_allreduce_time_s(n, size_bytes, bandwidth, latency=0.0):
    """Ring all-reduce time: 2(n-1)*alpha + 2(n-1)/n * S/B."""
    _check(n, size_bytes)
    return 2 * (n - 1) * latency + ring_allreduce_bytes_per_rank(n, size_bytes) / bandwidth


def ring_reduce_scatter_time_s(n, size_bytes, bandwidth, latency=0.0):
    """Reduce-scatter (or all-gather) of an S-byte buffer: (n-1)*alpha + (n-1)/n * S/B."""
    _check(n, size_bytes)
    return (n - 1) * latency + (n - 1) / n * size_bytes / bandwidth


ring_all_gather_time_s = ring_reduce_scatter_time_s


def parameter_server_bytes(n, size_bytes):
    """Bytes through the server's link per step: (n-1) gradients in, (n-1) weights out."""
    _check(n, size_bytes)
    return 2 * (n - 1) * size_bytes


def parameter_server_time_s(n, size_bytes, bandwidth, latency=0.0):
    """Parameter-server step: 2*alpha + 2(n-1)*S/B, the server's link being the bottleneck."""
    return 2 * latency + parameter_server_bytes(n, size_bytes) / bandwidth


def busbw_factor(collective, n):
    """nccl-tests' busbw/algbw factor: 2(n-1)/n all-reduce, (n-1)/n reduce-scatter and
    all-gather, 1 broadcast and reduce."""
    _check(n, 0)
    factors = {"all_reduce": 2 * (n - 1) / n, "reduce_scatter": (n - 1) / n,
               "all_gather": (n - 1) / n, "broadcast": 1.0, "reduce": 1.0}
    if collective not in factors:
        raise ValueError(f"collective={collective!r} must be one of {', '.join(COLLECTIVES)}")
    return factors[collective]


def bus_bandwidth(collective, n, size_bytes, time_s):
    """nccl-tests busbw in bytes/s of one measured collective: S/t * busbw_factor."""
    if time_s <= 0:
        raise ValueError(f"time_s={time_s} must be positive")
    return size_bytes / time_s * busbw_factor(collective, n)


def tp_elements_per_layer(b, s, h, t, recompute=False):
    """Elements one GPU sends per layer per micro-batch for tensor parallelism.

    8*b*s*h*(t-1)/t (Megatron-LM 2021 §3.2); 12*b*s*h*(t-1)/t when the forward is recomputed.
    """
    all_reduces = 6 if recompute else 4
    return all_reduces * 2 * b * s * h * (t - 1) / t


def pp_elements_per_boundary(b, s, h, t=1, scatter_gather=True):
    """Elements sent across one pipeline boundary per micro-batch and direction.

    b*s*h; b*s*h/t when each of the t GPUs sends its own slice and the receiver all-gathers
    over NVLink (scatter/gather, Megatron-LM 2021 §4.1).
    """
    return b * s * h / (t if scatter_gather else 1)


def _first_positions(n_gpus, size, stride, gpus_per_node):
    """Where in its server each group's first member sits, one entry per distinct case.

    Groups tile the grid in blocks of size*stride ranks, each block holding ``stride``
    groups whose first members are consecutive; a group's shape across servers depends only
    on its first member's position in its server, so at most ``gpus_per_node`` cases need
    looking at, however large n is (each block marks an arc of positions, as a difference
    array, in O(1)).
    """
    g = gpus_per_node
    block = size * stride
    period = block * g // math.gcd(block, g)  # the pattern repeats
    blocks = min(-(-min(n_gpus, period) // block), g)
    if stride >= g:
        return set(range(g))
    marks = [0] * (g + 1)
    for start in {(j * block) % g for j in range(blocks)}:
        end = start + stride
        marks[start] += 1
        marks[min(end, g)] -= 1
        if end > g:  # the arc wraps past the end of the server
            marks[0] += 1
            marks[end - g] -= 1
    covered, positions = 0, set()
    for position in range(g):
        covered += marks[position]
        if covered:
            positions.add(position)
    return positions


@lru_cache(maxsize=4096)      # the planner asks the same few shapes thousands of times
def members_per_node(n_gpus, size, stride, gpus_per_node):
    """Fewest members any group of ``size`` ranks ``stride`` apart has in one of its servers.

    ``size`` when every group fits in one server. A TP group of 16 on 8-GPU servers has 8
    members in each of its two servers; a DP group striding by a whole server has 1 in each.
    The fewest sets the pace: those members' links carry the group's traffic out.
    """
    if size <= 1 or n_gpus <= gpus_per_node:
        return max(size, 1)
    if stride >= gpus_per_node:  # consecutive members are a server or more apart
        return 1
    fewest = size
    for first in _first_positions(n_gpus, size, stride, gpus_per_node):
        last = first + (size - 1) * stride
        if last < gpus_per_node:
            continue  # this group stays in one server
        in_first = -(-(gpus_per_node - first) // stride)
        in_last = (last % gpus_per_node) // stride + 1
        fewest = min(fewest, in_first, in_last)
        if last // gpus_per_node >= 2:  # servers in between hold whole runs of members
            fewest = min(fewest, gpus_per_node // stride)
    return fewest


def group_spans_nodes(n_gpus, size, stride, gpus_per_node):
    """True if any group of ``size`` ranks ``stride`` apart crosses a server boundary."""
    return members_per_node(n_gpus, size, stride, gpus_per_node) < size
