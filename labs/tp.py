"""Tensor parallelism, lessonlib against PyTorch: the same MLP and transformer layer split
over t ranks by lessonlib's f/g layers and by DTensor (``ColwiseParallel`` /
``RowwiseParallel`` through ``init_device_mesh`` + ``parallelize_module``), from the same
weights.

Per layer kind ("mlp", "block") and implementation it reports the median forward+backward
time (the two alternate step by step, so machine noise hits both), their ratio twice (of
the medians, and the median of the step-by-step ratios, which load that drifts during the
run cannot bias), the collectives and bytes of one step (lessonlib's ledger; for DTensor a
dispatch mode that sees its functional collectives), and the bytes of parameters each rank
holds against the dense layer: t = world size. Outputs and input gradients are checked
against the dense layer first. The record's ``rows``: one per implementation and layer kind,
with t a column and the same metric names in every row.

Laptop:  python labs/tp.py --world-size 2 [--json results/tp.json]
GPU box: torchrun --nproc-per-node 4 labs/tp.py --json results/tp.json
"""
import sys

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

import lessonlib
from lessonlib import comm, device, labkit
from lessonlib.grid import ParallelContext
from lessonlib.models import MLP, Block, GPTConfig, init_weights_
from lessonlib.tensor_parallel.dtensor_ref import parallelize_with_dtensor, tp_mesh
from lessonlib.tensor_parallel.layers import TensorParallelMLP
from lessonlib.tensor_parallel.parallelize import param_bytes, parallelize_block

KINDS = ("mlp", "block")


class CollectiveBytes(TorchDispatchMode):
    """Counts the functional collectives DTensor issues and their input bytes (the same
    payload lessonlib's ledger records), skipping waits and autograd wrappers."""

    def __init__(self):
        super().__init__()
        self.calls, self.bytes = {}, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func._overloadpacket.__name__
        if func.namespace == "_c10d_functional" and not name.startswith(("_", "wait")):
            self.calls[name] = self.calls.get(name, 0) + 1
            self.bytes += args[0].numel() * args[0].element_size()
        return out


def _dense(kind, settings):
    h = settings["hidden"]
    if kind == "mlp":
        return init_weights_(MLP(h), seed=0)
    cfg = GPTConfig(seq=settings["seq"], hidden=h, heads=settings["heads"])
    return init_weights_(Block(cfg), seed=0, std=0.02)


def _matrix_bytes(module) -> int:
    """Bytes of this rank's weight matrices alone (biases and LayerNorms are replicated)."""
    total = 0
    for p in module.parameters():
        if p.ndim == 2:
            local = p.to_local() if hasattr(p, "to_local") else p
            total += local.numel() * local.element_size()
    return total


def _step(module, x, grad_out):
    """One forward + backward; returns the output."""
    x.grad = None
    module.zero_grad(set_to_none=True)
    y = module(x)                                                               # (b, s, h)
    y.backward(grad_out)
    # DTensor leaves its all-reduces in flight until their results are read (the output and
    # the input gradient): read one value of each, so both are timed to a finished step
    y[0, 0, 0].item(), x.grad[0, 0, 0].item()
    return y


def _measure(kind: str, settings: dict, x, grad_out, mesh) -> dict:
    """Check both implementations against the dense layer, count one step's messages, then
    time them alternately (lessonlib first on even steps, DTensor first on odd ones)."""
    dense = _dense(kind, settings).to(x.device)
    impls = {"lessonlib": TensorParallelMLP.from_mlp(dense) if kind == "mlp"
             else parallelize_block(dense),
             "torch": parallelize_with_dtensor(dense, kind, mesh)}
    x.grad = None
    reference = dense(x)
    reference.backward(grad_out)
    ref_grad = x.grad.clone()
    rows = {}
    for name, module in impls.items():
        with comm.ledger() as book, CollectiveBytes() as seen:
            y = _step(module, x, grad_out)
        rows[name] = {"output_max_abs_error": (y - reference).abs().max().item(),
                      "input_grad_max_abs_error": (x.grad - ref_grad).abs().max().item(),
                      "all_reduces": book.count("all_reduce") + seen.calls.get("all_reduce", 0),
                      "collectives": {**{e.op: book.count(e.op) for e in book.events},
                                      **seen.calls},
                      "comm_bytes": book.total_bytes() + seen.bytes,
                      "param_bytes": param_bytes(module), "matrix_bytes": _matrix_bytes(module),
                      "times": []}
    order = list(impls)
    for i in range(settings["warmup"] + settings["steps"]):
        for name in (order if i % 2 == 0 else order[::-1]):
            elapsed = labkit.time_steps(lambda m=impls[name]: _step(m, x, grad_out), 1, 0)[0]
            if i >= settings["warmup"]:
                rows[name]["times"].append(elapsed)
    rows["dense"] = {"param_bytes": param_bytes(dense), "matrix_bytes": _matrix_bytes(dense)}
    return rows


def worker(settings: dict) -> dict:
    dev = device.current_device()
    b, s, h = settings["batch"], settings["seq"], settings["hidden"]
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(b, s, h, generator=gen).to(dev).requires_grad_()            # (b, s, h)
    grad_out = torch.randn(b, s, h, generator=gen).to(dev)
    mesh = tp_mesh(ParallelContext.build(1, 1, dist.get_world_size()))
    return {"rank": dist.get_rank(), **labkit.rank_info(),
            **{kind: _measure(kind, settings, x, grad_out, mesh) for kind in KINDS}}


def build_record(ranks: list[dict], settings: dict, world_size: int) -> dict:
    results, slowest = {}, {}
    for name in ("lessonlib", "torch"):
        layers = {}
        for kind in KINDS:
            row = dict(ranks[0][kind][name])
            # a synchronous step lasts as long as its slowest rank
            slowest[name, kind] = [max(step) for step in
                                   zip(*(r[kind][name]["times"] for r in ranks))]
            row.pop("times")
            row["step_time_s"] = labkit.median(slowest[name, kind])
            row["param_bytes_per_rank"] = [r[kind][name]["param_bytes"] for r in ranks]
            row["matrix_bytes_per_rank"] = [r[kind][name]["matrix_bytes"] for r in ranks]
            layers[kind] = row
        results[name] = {"step_time_s": layers["mlp"]["step_time_s"], "layers": layers}
    record = labkit.result("tp", world_size, settings, results, ranks[0])
    starter = (f"torchrun --nproc-per-node {world_size}" if lessonlib.launcher.under_torchrun()
               else "python")
    record["command"] = " ".join([starter, "labs/tp.py", *sys.argv[1:]])
    record["dense"] = {kind: ranks[0][kind]["dense"] for kind in KINDS}
    record["ratio_lessonlib_over_torch"] = {
        kind: results["lessonlib"]["layers"][kind]["step_time_s"]
        / results["torch"]["layers"][kind]["step_time_s"] for kind in KINDS}
    # the same ratio step by step (the two ran back to back): robust to the machine's load
    # drifting during the run
    record["paired_ratio_lessonlib_over_torch"] = {
        kind: labkit.median([a / b for a, b in zip(slowest["lessonlib", kind],
                                                   slowest["torch", kind])]) for kind in KINDS}
    record["matrix_bytes_fraction_of_dense"] = {
        kind: results["lessonlib"]["layers"][kind]["matrix_bytes"]
        / record["dense"][kind]["matrix_bytes"] for kind in KINDS}
    record["rows"], record["headline"] = table(record), HEADLINE
    return record


HEADLINE = labkit.headline("step_time_s", x="t", series=["implementation", "layer"])


def table(record: dict) -> list[dict]:
    """The record as rows with stable columns: one per implementation and layer kind."""
    rows = []
    for name, result in record["results"].items():
        for kind, layer in result["layers"].items():
            ours = name == "lessonlib"
            rows.append({
                "implementation": name, "layer": kind, "t": record["world_size"],
                "step_time_s": layer["step_time_s"],
                "step_time_over_torch": record["ratio_lessonlib_over_torch"][kind] if ours
                else None,
                "paired_step_time_over_torch":
                    record["paired_ratio_lessonlib_over_torch"][kind] if ours else None,
                "all_reduces": layer["all_reduces"], "comm_bytes": layer["comm_bytes"],
                "param_bytes_per_rank": layer["param_bytes_per_rank"],
                "matrix_bytes_per_rank": layer["matrix_bytes_per_rank"],
                "matrix_bytes_fraction_of_dense":
                    max(layer["matrix_bytes_per_rank"]) / record["dense"][kind]["matrix_bytes"],
                "output_max_abs_error": layer["output_max_abs_error"],
                "input_grad_max_abs_error": layer["input_grad_max_abs_error"]})
    return rows


def check_settings(p, args) -> dict:
    labkit.check_positive(p, args, "world-size", "steps", "batch", "seq", "hidden", "heads")
    if args.warmup < 0:
        p.error(f"--warmup must be 0 or more; got {args.warmup}")
    if args.hidden % args.heads:
        p.error(f"--hidden {args.hidden} must be divisible by --heads {args.heads}")
    if args.heads % args.world_size:
        p.error(f"--heads {args.heads} must be divisible by the TP degree t = --world-size "
                f"{args.world_size} (each rank gets heads/t heads)")
    return {"batch": args.batch, "seq": args.seq, "hidden": args.hidden, "heads": args.heads,
            "steps": args.steps, "warmup": args.warmup}


def main(argv=None):
    p = labkit.parser("tp", __doc__.splitlines()[0])
    p.set_defaults(steps=20, warmup=3)
    p.add_argument("--batch", type=int, default=8, help="b, sequences per step")
    p.add_argument("--seq", type=int, default=128, help="s, tokens per sequence")
    p.add_argument("--hidden", type=int, default=256, help="h; the MLP's inner size is 4h")
    p.add_argument("--heads", type=int, default=8, help="a, attention heads")
    return labkit.main(p, check_settings, worker, build_record, argv)


if __name__ == "__main__":
    main()
