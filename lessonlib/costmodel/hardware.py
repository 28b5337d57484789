"""GPUs and the servers that hold them: the numbers every cost-model estimate starts from.

A GPU is four numbers from its datasheet: dense 16-bit Tensor Core FLOP/s, memory, HBM
bandwidth and NVLink bandwidth. A cluster adds how many GPUs share one server (one NVLink
domain) and how fast each GPU can talk to GPUs in *other* servers (its share of the
InfiniBand network).

Two conventions to keep straight:

* NVLink datasheet figures are bidirectional totals; a ring collective sends in one direction
  at a time, so the cost model uses half (A100: 600 GB/s -> 300 GB/s per direction).
* InfiniBand is quoted in gigabits per second per port: 200 Gb/s HDR = 25 GB/s,
  400 Gb/s NDR = 50 GB/s. DGX servers give each GPU its own port.

Run ``python -m lessonlib.costmodel --help`` to see the presets on the command line; the
module itself has no script entry point.
"""
from dataclasses import dataclass, replace

GB = 1e9  # datasheet gigabytes and GB/s are decimal


@dataclass(frozen=True)
class GPU:
    """One accelerator, as its datasheet states it."""

    name: str
    peak_flops: float  # dense 16-bit Tensor Core FLOP/s (no 2:4 sparsity)
    memory_bytes: float
    hbm_bytes_per_s: float
    nvlink_bytes_per_s: float  # bidirectional total per GPU, as datasheets quote it
    source: str


GPUS = {
    "V100-SXM2-32GB": GPU(
        "V100-SXM2-32GB", 125e12, 32 * GB, 900 * GB, 300 * GB,
        "NVIDIA Tesla V100 datasheet (SXM2): 125 TFLOP/s Tensor, 32 GB HBM2 at 900 GB/s, "
        "NVLink 300 GB/s"),
    "A100-80GB": GPU(
        "A100-80GB", 312e12, 80 * GB, 2039 * GB, 600 * GB,
        "NVIDIA A100 datasheet (SXM4 80GB): 312 TFLOP/s BF16 dense, 80 GB HBM2e at "
        "2,039 GB/s, NVLink 600 GB/s; Megatron-LM 2021 (Narayanan et al.) uses 312 as peak"),
    "H100-SXM5": GPU(
        "H100-SXM5", 989e12, 80 * GB, 3350 * GB, 900 * GB,
        "NVIDIA H100 datasheet (SXM5): 989 TFLOP/s BF16 dense (1,979 with sparsity), "
        "80 GB HBM3 at 3.35 TB/s, NVLink 900 GB/s"),
    "H200": GPU(
        "H200", 989e12, 141 * GB, 4800 * GB, 900 * GB,
        "NVIDIA H200 datasheet (SXM): 989 TFLOP/s BF16 dense (1,979 with sparsity), "
        "141 GB HBM3e at 4.8 TB/s, NVLink 900 GB/s"),
}

_ALIASES = {"V100": "V100-SXM2-32GB", "A100": "A100-80GB", "H100": "H100-SXM5",
            "H200-SXM": "H200"}


def get_gpu(name):
    """The GPU preset called ``name`` (case-insensitive; "A100" means the 80 GB part)."""
    wanted = name.strip().upper()
    for key in list(GPUS) + list(_ALIASES):
        if key.upper() == wanted:
            return GPUS[_ALIASES.get(key, key)]
    raise ValueError(f"gpu={name!r} is not a known GPU; use one of {', '.join(GPUS)} "
                     f"(or the short names {', '.join(_ALIASES)})")


@dataclass(frozen=True)
class Cluster:
    """Identical servers of ``gpus_per_node`` GPUs joined by a network.

    ``nvlink_bytes_per_s`` and ``network_bytes_per_s`` are per GPU and per direction: what a
    ring collective can push through one GPU's links. The latencies are the alpha of the
    alpha-beta model (one message's fixed cost); they are orders of magnitude, not
    measurements of a particular machine.
    """

    gpu: GPU
    gpus_per_node: int
    nvlink_bytes_per_s: float
    network_bytes_per_s: float
    nvlink_latency_s: float = 5e-6
    network_latency_s: float = 10e-6
    name: str = ""

    def __post_init__(self):
        if self.gpus_per_node < 1:
            raise ValueError(f"gpus_per_node={self.gpus_per_node} must be at least 1")
        if self.nvlink_bytes_per_s <= 0 or self.network_bytes_per_s <= 0:
            raise ValueError("nvlink_bytes_per_s and network_bytes_per_s must be positive")

    def link(self, spans_nodes):
        """(bandwidth bytes/s per GPU, latency s) of a group inside one server or across."""
        if spans_nodes:
            return self.network_bytes_per_s, self.network_latency_s
        return self.nvlink_bytes_per_s, self.nvlink_latency_s


# InfiniBand port speed per GPU in the DGX server of each generation, in Gb/s:
# DGX-1 V100 has 4 x 100 Gb/s EDR for 8 GPUs (NVIDIA DGX-1 datasheet); DGX A100 / Selene
# 8 x 200 Gb/s HDR (Megatron-LM 2021, Narayanan et al., §5); DGX H100 and H200
# 8 x 400 Gb/s NDR (NVIDIA DGX BasePOD docs).
DGX_NETWORK_GBIT_PER_GPU = {"V100-SXM2-32GB": 50, "A100-80GB": 200, "H100-SXM5": 400,
                            "H200": 400}


def make_cluster(gpu, gpus_per_node=8, network_gbit_per_s=None, name=""):
    """A cluster of ``gpu`` servers; NVLink per direction = half the datasheet total.

    ``network_gbit_per_s`` is the InfiniBand port speed per GPU in Gb/s; by default the one
    of the DGX server of that GPU generation.
    """
    gpu = get_gpu(gpu) if isinstance(gpu, str) else gpu
    if network_gbit_per_s is None:
        network_gbit_per_s = DGX_NETWORK_GBIT_PER_GPU.get(gpu.name, 200)
    return Cluster(gpu=gpu, gpus_per_node=gpus_per_node,
                   nvlink_bytes_per_s=gpu.nvlink_bytes_per_s / 2,
                   network_bytes_per_s=network_gbit_per_s * GB / 8, name=name)


CLUSTERS = {
    "dgx1-v100": make_cluster("V100", 8, name="dgx1-v100"),
    "dgx-a100": make_cluster("A100", 8, name="dgx-a100"),
    "dgx-h100": make_cluster("H100", 8, name="dgx-h100"),
    "dgx-h200": make_cluster("H200", 8, name="dgx-h200"),
}


def get_cluster(name):
    """The cluster preset called ``name``, e.g. ``get_cluster("dgx-a100")``."""
    try:
        return CLUSTERS[name.strip().lower()]
    except KeyError:
        raise ValueError(f"cluster={name!r} is not a known cluster; use one of "
                         f"{', '.join(CLUSTERS)}") from None


def with_gpus_per_node(cluster, gpus_per_node):
    """The same cluster with a different server size (e.g. to show 4-GPU nodes)."""
    return replace(cluster, gpus_per_node=gpus_per_node)
