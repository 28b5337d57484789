"""How labs/gpu_check.py runs each lab: its settings on CPU ranks and on a GPU, the world
size it takes, what it shows with one rank, its multi-rank points on one shared GPU, where
its record keeps its parity with one process, and the columns of its line in the report.

GPU box: used by ``python labs/gpu_check.py``; nothing to run on its own.
Laptop:  the same.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Lab:
    """How to run one lab briefly; ``largest(n)`` is the biggest world size <= n it takes."""

    tiny: dict                     # CPU ranks, seconds per lab
    short: dict                    # a GPU, still seconds, sizes that make the GPU work
    at_one: str                    # what the lab shows with a single rank
    largest: object = staticmethod(lambda n: n)
    metrics: dict = field(default_factory=dict)   # label -> flat result column
    # (ranks, extra settings, label) on 2-4 ranks sharing one GPU; a label: a layout of its own
    multi: list = field(default_factory=lambda: [(2, {}, "")])
    parity: tuple = ()             # ends of the flat record's columns compared with one process
    no_parity: str = ""            # why there are none
    cpu_s: float = 2.0             # its tiny settings on 2 CPU ranks here, started warm


def _divisor_at_most(n: int, of: int) -> int:
    return max(k for k in range(1, min(n, of) + 1) if of % k == 0)


def _power_of_two_at_most(n: int, cap: int = 8) -> int:
    k = 1
    while k * 2 <= min(n, cap):
        k *= 2
    return k


# most telling first: the data-parallel step (NCCL all-reduces in a real step), tensor and
# pipeline parallelism, sharding, the 3-D layout; then the bare collectives and launches
LABS = {
    "ddp": Lab(
        tiny={"model": "tiny", "steps": "2", "warmup": "1", "rounds": "1", "batch": "2"},
        short={"model": "10M", "steps": "5", "warmup": "2", "rounds": "1", "batch": "8",
               "dtype": "bf16"},
        at_one="one replica: the gradient all-reduce spans a group of one, so the step time "
               "is the baseline that scaling efficiency divides by",
        metrics={"lessonlib step s": "results.lessonlib.step_time_s",
                 "torch DDP step s": "results.torch.step_time_s"},
        parity=("max_weight_diff_vs_one_process",), cpu_s=4.7),
    "tp": Lab(
        tiny={"steps": "2", "warmup": "1", "batch": "2", "seq": "16", "hidden": "32", "heads": "4"},
        short={"steps": "5", "warmup": "2", "batch": "8", "seq": "512", "hidden": "1024",
               "heads": "16", "dtype": "bf16", "sequence-parallel": "true",
               "recompute": "selective", "overlap": "true"},
        at_one="t = 1: the unsharded layer, f and g are identities and no all-reduce runs; "
               "the dense baseline",
        largest=lambda n: _divisor_at_most(n, 16),
        metrics={"lessonlib step s": "results.lessonlib.step_time_s",
                 "torch step s": "results.torch.step_time_s",
                 "output error": "results.lessonlib.layers.block.output_max_abs_error"},
        multi=[(4, {}, "")], parity=("output_max_abs_error", "input_grad_max_abs_error"),
        cpu_s=2.4),
    "pp": Lab(
        tiny={"steps": "2", "warmup": "1", "microbatches": "2", "width": "32",
              "layers-per-stage": "2", "microbatch-size": "8", "schedules": "1f1b zb-h1 zbv"},
        short={"steps": "5", "warmup": "2", "microbatches": "4 8", "width": "2048",
               "layers-per-stage": "4", "microbatch-size": "256",
               "schedules": "gpipe 1f1b zb-h1 zbv"},
        at_one="p = 1: one stage holds every layer; nothing is sent and the theory's bubble "
               "(p-1)/(m+p-1) is 0, so what it measures is the schedule's own overhead",
        metrics={"lessonlib step s": "results.lessonlib.step_time_s",
                 "torch step s": "results.torch.step_time_s"},
        multi=[(3, {"microbatches": "3"}, "")],        # p = 3: a middle stage sends both ways
        parity=("max_weight_diff_vs_one_process", "max_grad_diff_vs_one_process"),
        cpu_s=6.6),
    "zero": Lab(
        tiny={"steps": "2", "warmup": "1", "rounds": "1", "layers": "2", "hidden": "16",
              "heads": "4", "seq": "8"},
        short={"steps": "3", "warmup": "1", "rounds": "1", "layers": "8", "hidden": "1024",
               "heads": "16", "seq": "512", "dtype": "bf16", "overlap": "true"},
        at_one="d = 1: nothing to shard, every stage holds the whole model state; the "
               "baseline each stage's memory is divided from",
        metrics={"lessonlib stage-3 step s": "results.lessonlib.step_time_s",
                 "torch fully_shard step s": "results.torch.step_time_s"},
        parity=("max_weight_diff_vs_one_process",), cpu_s=5.4),
    "hybrid": Lab(
        tiny={"steps": "2", "warmup": "1", "layers": "2", "hidden": "32", "heads": "2",
              "seq": "16", "global-batch": "8", "microbatches": "2"},
        short={"steps": "3", "warmup": "1"},
        at_one="only the layout t1p1d1: plain training on one GPU, checked against one process",
        largest=_power_of_two_at_most,
        metrics={"layouts": "settings.layouts"},
        # the five-axis builder: c x t with sequence parallelism and c x d with FSDP; then
        # expert parallelism inside d on the MoE GPT, with a pipeline (it takes no cp)
        multi=[(4, {"cp": "2", "sp": "true", "shard": "fsdp", "layouts": "t2p1d1,t1p1d2"},
                "five-axis c2 sp fsdp"),
               (4, {"ep": "2", "layouts": "t1p2d2,t2p1d2"}, "five-axis e2 moe"),
               (4, {}, "")],
        parity=("max_weight_diff_vs_one_process",), cpu_s=4.0),
    "allreduce": Lab(
        tiny={"size-mb": "0.25", "budget-s": "0.3"}, short={"size-mb": "256", "budget-s": "2"},
        at_one="skipped: an all-reduce over one rank moves no bytes (bus bandwidth factor "
               "2(n-1)/n = 0); it needs 2 ranks",
        largest=lambda n: n if n >= 2 else None,
        metrics={"ring busbw GB/s": "results.ring.busbw_GBps",
                 "torch busbw GB/s": "results.torch.busbw_GBps"},
        multi=[(4, {}, "")], parity=("max_error",), cpu_s=0.4),
    "mp": Lab(
        tiny={"steps": "2", "warmup": "1", "rounds": "1", "layers": "4", "hidden": "32"},
        short={"steps": "5", "warmup": "2", "rounds": "2", "layers": "16", "hidden": "1024",
               "batch": "32"},
        at_one="p = 1: the whole model on one rank, nothing idles; the baseline the split "
               "is measured against",
        metrics={"p=1 step s": "results.lessonlib.by_p.1.step_time_s"},
        parity=("weights_max_abs_diff", "loss_max_abs_diff"), cpu_s=1.1),
    "launch_overhead": Lab(
        tiny={"repeats": "1"}, short={"repeats": "3"},
        at_one="starts one rank that all-reduces one number with itself: the fixed cost of a launch",
        metrics={"launch s": "results.lessonlib.total_s"},
        no_parity="nothing to compare: it times launches of a one-number all-reduce",
        cpu_s=10.8),
    "train": Lab(
        tiny={"steps": "20", "checkpoint-every": "10", "layers": "2", "hidden": "32",
              "seq": "16", "global-batch": "8", "microbatches": "2", "fresh": "true"},
        short={"steps": "6", "checkpoint-every": "3", "layers": "4", "hidden": "512",
               "heads": "8", "seq": "256", "fresh": "true"},
        at_one="t1p1d1: plain training with checkpoints every N steps (--fresh: from step 0)",
        largest=_power_of_two_at_most,
        metrics={"step s": "results.lessonlib.step_time_s",
                 "checkpoint save s": "results.lessonlib.checkpoint_save_s"},
        no_parity="none: the NCCL point must resume from its checkpoint (train+resume)",
        cpu_s=1.0),
    "ep": Lab(
        tiny={"steps": "2", "warmup": "1", "experts": "4", "batch": "2", "seq": "16",
              "hidden": "32"},
        short={"steps": "5", "warmup": "2", "experts": "8", "batch": "8", "seq": "1024",
               "hidden": "1024"},
        at_one="e = 1: every expert on one rank; the all-to-alls only copy to itself",
        largest=lambda n: _divisor_at_most(n, 8),
        metrics={"step s": "results.lessonlib.step_time_s",
                 "all-to-all share": "results.lessonlib.moe_layer.alltoall_share",
                 "torch all-to-all s": "results.torch.step_time_s"},
        parity=("output_max_abs_error",), cpu_s=0.4),
    "cp": Lab(
        tiny={"steps": "2", "warmup": "1", "seq": "64"}, short={"steps": "3", "warmup": "1"},
        at_one="c = 1: the whole sequence on one rank; ring attention has no one to pass to",
        metrics={"step s": "results.lessonlib.layouts.zigzag.step_time_s"},
        parity=("max_abs_error",), cpu_s=1.3),
    "fp8": Lab(
        tiny={"steps": "1", "warmup": "1", "gemm-size": "128"},
        short={"steps": "3", "warmup": "1", "gemm-size": "4096"},
        at_one="one GPU: each recipe's GEMM error and step time, and the FP8 GEMM rate "
               "against bf16 at 4096^3 (torch._scaled_mm; H100 or newer)",
        largest=lambda n: 1,
        metrics={"fp8/bf16 GEMM rate": "gemm_tflops.fp8_over_bf16",
                 "blockwise step s": "results.blockwise.step_time_s"},
        no_parity="FP8 is not exact: the record holds each recipe's GEMM error instead",
        cpu_s=3.0),
    "ft": Lab(
        tiny={"what": "straggler", "steps": "3", "device-s": "0.02"},
        short={"what": "straggler", "steps": "5"},
        at_one="skipped: a straggler is told apart from 2 ranks on (the hangs, the torchft "
               "replicas and DiLoCo run on CPU ranks: python labs/ft.py --what ...)",
        largest=lambda n: n if n >= 2 else None,
        metrics={"named": "results.lessonlib.named",
                 "named exactly the slowed": "results.lessonlib.named_exactly_the_slowed",
                 "step s": "results.lessonlib.measured_step_s",
                 "predicted step s": "results.lessonlib.predicted_step_s"},
        no_parity="none: it names the slowed rank (named exactly the slowed: True)",
        cpu_s=1.0),
}
GENERIC = Lab(tiny={"steps": "2", "warmup": "1"}, short={"steps": "3", "warmup": "1"},
              at_one="(a lab this script has no notes for: run with its defaults)",
              metrics={"lessonlib step s": "results.lessonlib.step_time_s",
                       "torch step s": "results.torch.step_time_s"})


# ---------------------------------------------------------------- a lab's line
def parity_of(row: dict) -> float | None:
    """The largest difference from one process that the lab's record holds (its ``parity``
    columns, every layout or implementation), or None when it holds none."""
    ends = LABS.get(row["lab"], GENERIC).parity
    values = [v for k, v in row.items() if k.startswith("results.") and k.endswith(ends)
              and isinstance(v, (int, float)) and not isinstance(v, bool)] if ends else []
    return max(values) if values else None


def show(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, list):
        return ",".join(map(str, value))
    return "" if value is None else str(value)


def lab_summary(row: dict) -> str:
    lab = LABS.get(row["lab"], GENERIC)
    if row["status"] != "ok":
        return row.get("error") or ""
    shown = [f"{label} {show(row[col])}" for label, col in lab.metrics.items() if col in row]
    if parity_of(row) is not None:
        shown.append(f"parity: max diff vs one process {parity_of(row):.2g}")
    if row.get("off_device"):
        shown.append("NOT ALL ON THE GPU: " + " / ".join(row["off_device"]))
    elif row.get("off_device") == []:
        shown.append("every compute call on the GPU")
    return "; ".join(shown)
