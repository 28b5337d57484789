"""GPUs and the servers that hold them: the numbers every cost-model estimate starts from.

A GPU is four numbers from its datasheet: dense 16-bit Tensor Core FLOP/s, memory, HBM
bandwidth and NVLink bandwidth (and, from Hopper on, its dense FP8 FLOP/s). A cluster adds how many GPUs share one server (one NVLink
domain) and how fast each GPU can talk to GPUs in *other* servers (its share of the
InfiniBand network).

Two conventions to keep straight:

* NVLink datasheet figures are bidirectional totals; a ring collective sends in one direction
  at a time, so the cost model uses half (A100: 600 GB/s -> 300 GB/s per direction).
* InfiniBand is quoted in gigabits per second per port: 200 Gb/s HDR = 25 GB/s,
  400 Gb/s NDR = 50 GB/s. DGX servers give each GPU its own port, and NCCL drives them all
  at once for a group that spans servers (``Cluster.group_link``): 8 x 25 = 200 GB/s for a
  TP group of 16 on DGX A100, not 25. A cluster with one port per server
  (``network_ports=1``, ``collectives="flat-ring"``) gets one port's rate.

A GPU's measured matmul rate (MAMF) is a burst at its boost clock; in training its clock
settles at the power limit, and a Hopper GPU sustains 0.85 of that rate (``SUSTAINED``,
measured); one held below its datasheet's power runs slower still
(``power_limited_share``: torchtitan's 500 W H100s). ``GPU.clock_share`` is the product.

One job: the hardware a cost-model estimate runs on, each figure with its source; it runs
past 300 lines because every preset quotes its datasheet.

Run ``python -m lessonlib.costmodel --help`` to see the presets on the command line; the
module itself has no script entry point.
"""
import math
from dataclasses import dataclass, replace

from lessonlib.argcheck import positive_int

from .comm import members_per_node

GB = 1e9  # datasheet gigabytes and GB/s are decimal
MiB = 2**20
GiB = 2**30  # what a GPU reports its memory in (nvidia-smi's MiB; torch's total_memory bytes)


@dataclass(frozen=True)
class GPU:
    """One accelerator, as its datasheet states it; ``memory_bytes`` as the GPU reports it
    (nvidia-smi's total: an "80 GB" H100 shows 81,559 MiB, 79.6 GiB, not 80e9 bytes).

    ``matmul_flops`` (and ``fp8_matmul_flops``) is the fastest a single large matrix product
    was measured to run on the part, its Maximum Achievable Matmul FLOPS (MAMF), times
    ``clock_share``, what training sustains of that burst: the ceiling of ``gemm.py``'s curve;
    ``sms`` its streaming multiprocessors, over which a GEMM's tiles run in waves.
    ``peak_flops`` stays the datasheet's: MFU's denominator.
    """

    name: str
    peak_flops: float  # dense 16-bit Tensor Core FLOP/s (no 2:4 sparsity)
    memory_bytes: float
    hbm_bytes_per_s: float
    nvlink_bytes_per_s: float  # bidirectional total per GPU, as datasheets quote it
    source: str
    fp8_peak_flops: float = None  # dense FP8 FLOP/s; None before Hopper (no FP8 Tensor Cores)
    matmul_flops: float = None    # measured BF16 MAMF; None: the datasheet peak
    fp8_matmul_flops: float = None    # measured FP8 MAMF; None: fp8_peak_flops
    sms: int = 108
    clock_share: float = 1.0  # of the measured burst rates that training sustains (SUSTAINED, power)
    nvlink_sharp: bool = False    # its NVSwitches reduce in the switch (NVLS_ALLREDUCE_BUSBW)


# Maximum Achievable Matmul FLOPS, dense BF16 and FP8 (no sparsity), measured as the best
# mean TFLOP/s of 100 iterations over a brute-force sweep of shapes with mamf-finder.py (S.
# Bekman, "Machine Learning Engineering", compute/accelerator, "Maximum Achievable Matmul
# FLOPS comparison table"): A100 SXM 271.2 of 312 (86.9 %); H100 SXM 794.5 of 989 (80.3 %),
# "H200 is the same"; FP8 H100 SXM 1,402.6 of 1,979 (70.9 %), H200 SXM 1,453.4 (73.4 %). The
# table has no V100 row: the V100 keeps the A100's share of its peak, a reading, not a
# measurement.
MAMF = {"V100-SXM2-32GB": (125e12 * 271.2 / 312, None), "A100-80GB": (271.2e12, None),
        "H100-SXM5": (794.5e12, 1402.6e12), "H200": (794.5e12, 1453.4e12)}
# Streaming multiprocessors (NVIDIA's V100, A100 and H100 architecture whitepapers; the
# H200 and H800 are the H100 SXM's GH100 with 132).
SMS = {"V100-SXM2-32GB": 80, "A100-80GB": 108, "H100-SXM5": 132, "H200": 132}


# What a Tensor Core part sustains of its burst rate once its clock settles at the power
# limit: Maximum Sustainable Matmul FLOPS (MSMF) over MAMF, measured together by mamf-finder
# (Bekman, Machine Learning Engineering, compute/accelerator/benchmarks, "What we measured:
# alone vs all-8 concurrent"): H200 BF16 with all 8 GPUs of the node busy, MSMF 698.6 and
# MAMF 823.9 TFLOP/s (n = 40), 0.848; the H100 SXM is the same GH100 at the same 700 W ("H200
# is the same" for MAMF). Training runs at the saturated clock, so every Tensor Core kernel
# (GEMMs, FP8's too, and attention, whose measured rates are bursts) runs at this share. No
# A100 or V100 figure is published: they keep their burst rates, a gap of the model.
SUSTAINED = {"H100-SXM5": 698.6 / 823.9, "H200": 698.6 / 823.9}


# NVLink SHARP (NVLS): inside an HGX/DGX H100 or H200 server the third-generation NVSwitches
# reduce in the switch, and NCCL's all-reduce uses it by default there ("Now allreduce uses
# NVLink SHARP by default ... On 8 GPUs, you should reach a peak busBw of ~480GB/s", where
# every other collective, and the ring, reach 370: NCCL's maintainer, NVIDIA/nccl-tests issue
# 212; "a 30% improvement using NVLink SHARP" for the all-reduce only, NVIDIA/nccl issue
# 1442). By group size, busbw measured on 8 H100 SXM with NCCL_ALGO=NVLS at 2-4 GB (NVIDIA/
# nccl issue 1455): as the ring's up to 4 GPUs, then 420, 440, 460 and 480 GB/s at 5-8. These
# are peaks: the maintainer notes 256 MB "is too small to reach peak bandwidth", so for a
# tensor-parallel all-reduce of tens of MB the gain is an upper bound. Only all-reduces gain;
# all-gathers and reduce-scatters do not (NVIDIA/nccl issue 1506, the maintainer: NVLS
# "does not promise a bandwidth improvement over point-to-point based operations for
# allgather and reduce scatter"). The H800's NVLS is not documented: it keeps the ring.
RING_NVLINK_BUSBW = 370e9
NVLS_ALLREDUCE_BUSBW = {5: 420e9, 6: 440e9, 7: 460e9, 8: 480e9}
NVLINK_SHARP = ("H100-SXM5", "H200")


def _gpu(name, *datasheet, fp8=None, like=None, clock_share=1.0, nvlink_sharp=None):
    """A GPU with the MAMF, SM count and NVSwitch generation (``nvlink_sharp``, unless given)
    of ``like`` (default: its own name's), its matmul rates scaled by what it sustains
    (``SUSTAINED``) and by ``clock_share`` (``power_limited_share``)."""
    like = like or name
    nvlink_sharp = like in NVLINK_SHARP if nvlink_sharp is None else nvlink_sharp
    clock_share *= SUSTAINED.get(like, 1.0)
    bf16, fp8_mamf = MAMF[like]
    return GPU(name, *datasheet, fp8, matmul_flops=bf16 * clock_share,
               fp8_matmul_flops=fp8_mamf and fp8_mamf * clock_share, sms=SMS[like],
               clock_share=clock_share, nvlink_sharp=nvlink_sharp)


# Two datasheets of the same 132-SM GH100 at two power limits: the H100 NVL (350-400 W,
# 1,671 TFLOP/s BF16 with sparsity, 835.5 dense) and the H100 SXM5 (700 W, 989.5 dense).
GH100_BY_WATTS = ((400, 835.5e12), (700, 989.5e12))


def power_limited_share(watts):
    """The share of the H100 SXM's Tensor Core rate a GH100 keeps under a ``watts`` power
    limit: linear in the limit between the two datasheets of ``GH100_BY_WATTS`` (a reading:
    no part between them is measured; the cube-root law of dynamic power, P ~ f V^2 with V
    ~ f, gives nearly the same, (500/700)^(1/3) = 0.894 against 0.896 at 500 W)."""
    (low_w, low), (high_w, high) = GH100_BY_WATTS
    if not low_w <= watts <= high_w:
        raise ValueError(f"watts={watts} is outside the datasheets' {low_w}-{high_w} W; "
                         f"give a power limit between them")
    return (low + (high - low) * (watts - low_w) / (high_w - low_w)) / high


GPUS = {
    "V100-SXM2-32GB": _gpu(
        "V100-SXM2-32GB", 125e12, 32 * GiB, 900 * GB, 300 * GB,
        "NVIDIA Tesla V100 datasheet (SXM2): 125 TFLOP/s Tensor, 32 GB HBM2 at 900 GB/s, "
        "NVLink 300 GB/s; 32 GiB as the GPU reports it"),
    "A100-80GB": _gpu(
        "A100-80GB", 312e12, 81920 * MiB, 2039 * GB, 600 * GB,
        "NVIDIA A100 datasheet (SXM4 80GB): 312 TFLOP/s BF16 dense, 80 GB HBM2e at "
        "2,039 GB/s, NVLink 600 GB/s; Megatron-LM 2021 (Narayanan et al.) uses 312 as peak; "
        "nvidia-smi reports 81,920 MiB; MAMF 271.2 TFLOP/s"),
    "H100-SXM5": _gpu(
        "H100-SXM5", 989e12, 81559 * MiB, 3350 * GB, 900 * GB,
        "NVIDIA H100 datasheet (SXM5): 989 TFLOP/s BF16 dense (1,979 with sparsity), "
        "80 GB HBM3 at 3.35 TB/s, NVLink 900 GB/s; dense FP8 1,979 (3,958 with sparsity); "
        "nvidia-smi reports 81,559 MiB; MAMF 794.5 (BF16), 1,402.6 (FP8) TFLOP/s",
        fp8=1979e12),
    "H200": _gpu(
        "H200", 989e12, 143771 * MiB, 4800 * GB, 900 * GB,
        "NVIDIA H200 datasheet (SXM): 989 TFLOP/s BF16 dense (1,979 with sparsity), "
        "141 GB HBM3e at 4.8 TB/s, NVLink 900 GB/s; dense FP8 1,979 (3,958 with sparsity); "
        "nvidia-smi reports 143,771 MiB; MAMF 794.5 (BF16), 1,453.4 (FP8) TFLOP/s",
        fp8=1979e12),
}

# DeepSeek-V3's GPU, kept out of GPUS (the course's datasheet list) and used by "hgx-h800".
# NVIDIA publishes no H800 SXM datasheet beside the H100's; its compute and memory are the
# H100 SXM5's (so its MAMF is taken as the H100's) and its NVLink 400 GB/s.
H800 = _gpu(
    "H800", 989e12, 81559 * MiB, 3350 * GB, 400 * GB,
    "H100 SXM5's compute and memory with NVLink cut to 400 GB/s; DeepSeek-V3 (DeepSeek-AI "
    "2024, §3.1) trained on 2048 of them, 8 per node, 400 Gb/s InfiniBand per GPU; dense "
    "FP8 1,979 TFLOP/s as the H100", fp8=1979e12, like="H100-SXM5", nvlink_sharp=False)

# torchtitan's H100 benchmarks ran on Meta's Grand Teton hosts: "96GB HBM2e with 2.4 TB/sec
# peak memory bandwidth", "the default 500W power limit, although tuning it up to 700W TDP can
# potentially provide further speedups" (docs/performance.md); kept out of GPUS like the H800.
# What 500 W costs, its team says in a footnote: these H100s "are non-standard. They have
# HBM2e and are limited to a lower TDP. The actual peak TFLOPs should be between SXM and NVL,
# and we don't know the exact value" (PyTorch forum, "[Distributed w/ TorchTitan] Introducing
# Async Tensor Parallelism in PyTorch", benchmark configuration). No measured matmul rate
# exists for this part. The course places it where its team does, between the two
# datasheets, by its power limit (``power_limited_share(500)``, 0.896 of the SXM's): its
# GEMMs and attention run at that share of the H100 SXM's measured rates. Its peak stays
# the SXM's 989 (torchtitan's MFU denominator), with the 96 GB at 2.4 TB/s that are
# published.
H100_96GB = _gpu(
    "H100-96GB", 989e12, 96 * GB, 2400 * GB, 900 * GB,
    "torchtitan docs/performance.md: H100 with 96 GB HBM2e at 2.4 TB/s on Grand Teton, "
    "500 W (96 GB taken as 96e9 bytes, 89.4 GiB: the MiB these parts report is not "
    "published); BF16 peak as the SXM5's (MFU's denominator), its MAMF scaled to 500 W "
    "between the NVL's and the SXM's datasheets (its team: between the two)", fp8=1979e12,
    like="H100-SXM5", clock_share=power_limited_share(500))

_ALIASES = {"V100": "V100-SXM2-32GB", "A100": "A100-80GB", "H100": "H100-SXM5",
            "H200-SXM": "H200"}


def get_gpu(name):
    """The GPU preset called ``name`` (case-insensitive; "A100" means the 80 GB part)."""
    wanted = name.strip().upper() if isinstance(name, str) else None
    for key in list(GPUS) + list(_ALIASES):
        if key.upper() == wanted:
            return GPUS[_ALIASES.get(key, key)]
    raise ValueError(f"gpu={name!r} is not a known GPU; use one of {', '.join(GPUS)} "
                     f"(or the short names {', '.join(_ALIASES)})")


COLLECTIVE_ALGORITHMS = ("multi-ring", "flat-ring")
MAX_GPUS_PER_NODE = 1024  # far above any NVLink domain built so far


@dataclass(frozen=True)
class Cluster:
    """Identical servers of ``gpus_per_node`` GPUs joined by a network.

    ``nvlink_bytes_per_s`` is per GPU and per direction; ``network_bytes_per_s`` is one
    network port's rate per direction, and a server has ``network_ports`` of them (None:
    one per GPU, as in DGX servers). The latencies are the alpha of the alpha-beta model,
    one ring step's fixed cost: on NVLink about 5 us (nccl-tests' smallest all-reduce on two
    A100 SXM4s takes 10.1 us, two steps; NVIDIA/nccl issue 583), across servers taken as
    twice that, an order of magnitude, not a measurement. NCCL's own tuner assumes the same
    order for the large messages of training (its Simple protocol, ring): 3.4 us a step on
    NVLink, 14 across the network, and 8.4 more a collective (src/graph/tuning.cc,
    ``ncclTunerConstantsDefaults``). ``calibration.refit_cluster`` fits both to a machine's
    own all-reduce times.

    ``collectives`` says how a group that spans servers crosses the network:

    * "multi-ring" (NCCL on multi-port servers): NCCL splits a collective into channels,
      rings or trees side by side, and on a server with several ports sends each channel
      through a different one, rail by rail (NCCL user guide, environment variables
      NCCL_MIN_NCHANNELS and NCCL_CROSS_NIC); NVLink lets it cut the data into as many parts
      as there are ports (NVIDIA/nccl issue 601, a maintainer's answer). So a group moves data
      between servers at up to its members' ports together. nccl-tests' doc/PERFORMANCE.md
      defines bus bandwidth to be compared with the hardware bottleneck, NVLink, PCIe or the
      network: for a group spanning DGX servers that is the ports' sum, not one port.
    * "flat-ring": one ring through the group, crossing each server boundary through one
      port, the textbook ring on a cluster with one port per server.

    An all-reduce inside one H100 or H200 server runs faster than its ring: the NVSwitches
    reduce it (NVLS, ``allreduce_speedup``).
    """

    gpu: GPU
    gpus_per_node: int
    nvlink_bytes_per_s: float
    network_bytes_per_s: float
    nvlink_latency_s: float = 5e-6
    network_latency_s: float = 10e-6
    name: str = ""
    network_ports: int = None
    collectives: str = "multi-ring"

    def __post_init__(self):
        if self.network_ports is None:
            object.__setattr__(self, "network_ports", self.gpus_per_node)
        for field, most in (("gpus_per_node", MAX_GPUS_PER_NODE),
                            ("network_ports", MAX_GPUS_PER_NODE * 8)):
            positive_int(field, getattr(self, field), most=most)
        for field in ("nvlink_bytes_per_s", "network_bytes_per_s", "nvlink_latency_s",
                      "network_latency_s"):
            value = getattr(self, field)
            positive = field.endswith("bytes_per_s")
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not math.isfinite(value) or value < 0 or (positive and value == 0)):
                raise ValueError(f"{field}={value!r} must be a finite "
                                 f"{'positive' if positive else 'non-negative'} number")
        if self.collectives not in COLLECTIVE_ALGORITHMS:
            raise ValueError(f"collectives={self.collectives!r} must be one of "
                             f"{', '.join(COLLECTIVE_ALGORITHMS)}")

    def link(self, spans_nodes):
        """(bandwidth bytes/s, latency s) of one GPU's own link inside one server or across:
        NVLink, or its share of the server's network ports (a whole port on DGX servers)."""
        if spans_nodes:
            share = min(1.0, self.network_ports / self.gpus_per_node)
            return self.network_bytes_per_s * share, self.network_latency_s
        return self.nvlink_bytes_per_s, self.nvlink_latency_s

    def group_link(self, n_gpus, size, stride):
        """(bandwidth bytes/s per member, latency s) that a ring collective of the groups of
        ``size`` ranks ``stride`` apart on an ``n_gpus`` grid sees.

        Inside one server: NVLink. Across servers, with k members in a server (the fewest
        over the group's servers) and every group of the grid running at once, a server's
        ports are shared by gpus_per_node/k groups: each gets network_ports*k/gpus_per_node
        ports. "multi-ring" uses one channel per member, up to k ports; "flat-ring" one.
        The data still moves over NVLink inside each server, which caps the rate.

        The latency is per ring step, as ``ring_allreduce_time_s`` counts steps. A flat ring
        waits on the network at every step. NCCL's multi-server algorithms are hierarchical
        (chains inside a server, rings or trees between servers), so of a collective's n-1
        steps only servers-1 pay the network's latency and the rest NVLink's: the latency
        returned is that average.
        """
        k = members_per_node(n_gpus, size, stride, self.gpus_per_node)
        if k >= size:
            return self.nvlink_bytes_per_s, self.nvlink_latency_s
        if self.collectives == "flat-ring":
            ports = min(1, self.network_ports * k / self.gpus_per_node)
            return ports * self.network_bytes_per_s, self.network_latency_s
        ports = min(k, self.network_ports * k / self.gpus_per_node)
        servers = -(-size // k)
        latency = ((servers - 1) * self.network_latency_s
                   + (size - servers) * self.nvlink_latency_s) / (size - 1)
        return min(self.nvlink_bytes_per_s, ports * self.network_bytes_per_s), latency

    def allreduce_speedup(self, n_gpus, size, stride):
        """How much faster an all-reduce of the groups of ``size`` ranks ``stride`` apart
        runs than the ring ``group_link`` prices: NVLS's busbw over the ring's where the
        GPU's NVSwitches reduce and each group sits in one server, else 1."""
        if not self.gpu.nvlink_sharp or size < min(NVLS_ALLREDUCE_BUSBW) or \
                members_per_node(n_gpus, size, stride, self.gpus_per_node) < size:
            return 1.0
        return NVLS_ALLREDUCE_BUSBW[min(size, max(NVLS_ALLREDUCE_BUSBW))] / RING_NVLINK_BUSBW


# Port speeds the model turns into finite times, 1 Mb/s to 1 Pb/s: below, a step runs past
# 1e299 s and then overflows to inf; above, the bytes per second overflow.
NETWORK_GBIT_RANGE = (1e-3, 1e6)

# InfiniBand port speed per GPU in the DGX server of each generation, in Gb/s:
# DGX-1 V100 has 4 x 100 Gb/s EDR for 8 GPUs (NVIDIA DGX-1 datasheet); DGX A100 / Selene
# 8 x 200 Gb/s HDR (Megatron-LM 2021, Narayanan et al., §5); DGX H100 and H200
# 8 x 400 Gb/s NDR (NVIDIA DGX BasePOD docs).
DGX_NETWORK_GBIT_PER_GPU = {"V100-SXM2-32GB": 50, "A100-80GB": 200, "H100-SXM5": 400,
                            "H200": 400, "H800": 400}


def check_network_gbit(name: str, gbit) -> float:
    """A port speed in Gb/s within ``NETWORK_GBIT_RANGE``; ValueError naming ``name`` if not."""
    low, high = NETWORK_GBIT_RANGE
    if (isinstance(gbit, bool) or not isinstance(gbit, (int, float)) or not math.isfinite(gbit)
            or not low <= gbit <= high):
        raise ValueError(f"{name}={gbit!r} must be a port speed in Gb/s from {low} to "
                         f"{high:.0f}, e.g. 200 (HDR) or 400 (NDR)")
    return gbit


def make_cluster(gpu, gpus_per_node=8, network_gbit_per_s=None, name="", network_ports=None,
                 collectives="multi-ring"):
    """A cluster of ``gpu`` servers; NVLink per direction = half the datasheet total.

    ``network_gbit_per_s`` is the InfiniBand port speed in Gb/s (by default the one of the
    DGX server of that GPU generation); ``network_ports`` the ports per server (default one
    per GPU); ``collectives`` "multi-ring" or "flat-ring" (see ``Cluster``).
    """
    gpu = get_gpu(gpu) if isinstance(gpu, str) else gpu
    if network_gbit_per_s is None:
        network_gbit_per_s = DGX_NETWORK_GBIT_PER_GPU.get(gpu.name, 200)
    check_network_gbit("network_gbit", network_gbit_per_s)
    return Cluster(gpu=gpu, gpus_per_node=gpus_per_node,
                   nvlink_bytes_per_s=gpu.nvlink_bytes_per_s / 2,
                   network_bytes_per_s=network_gbit_per_s * GB / 8, name=name,
                   network_ports=network_ports, collectives=collectives)


CLUSTERS = {
    "dgx1-v100": make_cluster("V100", 8, name="dgx1-v100"),
    "dgx-a100": make_cluster("A100", 8, name="dgx-a100"),
    "dgx-h100": make_cluster("H100", 8, name="dgx-h100"),
    "dgx-h200": make_cluster("H200", 8, name="dgx-h200"),
    "hgx-h800": make_cluster(H800, 8, name="hgx-h800"),
    "grand-teton-h100-96gb": make_cluster(H100_96GB, 8, 400, name="grand-teton-h100-96gb"),
}


def get_cluster(name):
    """The cluster preset called ``name``, e.g. ``get_cluster("dgx-a100")``."""
    try:
        return CLUSTERS[name.strip().lower() if isinstance(name, str) else None]
    except KeyError:
        raise ValueError(f"cluster={name!r} is not a known cluster; use one of "
                         f"{', '.join(CLUSTERS)}") from None


def with_gpus_per_node(cluster, gpus_per_node):
    """The same cluster with a different server size (e.g. to show 4-GPU nodes)."""
    return replace(cluster, gpus_per_node=gpus_per_node)
