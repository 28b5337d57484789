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

``--sequence-parallel`` splits the layers' input and output along the sequence (Korthikanti
et al. 2022): ours against PyTorch's ``SequenceParallel`` plan (with ``Colwise``/``Rowwise``
reduce-scattering to ``Shard(1)``), each rank feeding its s/t rows. ``--recompute
{none,selective,full}`` sets the transformer layer's recomputation in both (the same
``Block`` code recomputes inside PyTorch's copy); the MLP has no attention and is not
recomputed. The record's ``saved_bytes`` per layer kind: the bytes one forward keeps for
backward on rank 0, ours and PyTorch's.

``--overlap`` (with ``--sequence-parallel``) also runs our layers with async TP
(``tensor_parallel.async_tp``: the sequence all-gather and reduce-scatter cut into the t
ranks' pieces, each piece's transfer hidden behind a GEMM) against plain SP on the same
weights: the record's ``overlap`` per layer kind holds their output and input-gradient
differences and, for each, the median step, communication and exposed seconds (the time a
rank stood still for communication, ``Ledger.exposed_seconds``), slowest rank.

Laptop:  python labs/tp.py --world-size 2 [--sequence-parallel [--overlap]]
         [--recompute selective] [--json results/tp.json]
GPU box: torchrun --nproc-per-node 4 labs/tp.py --json results/tp.json
"""
import sys

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

import lessonlib
from lessonlib import comm, device
from lessonlib.grid import ParallelContext
from lessonlib.instruments.activations import saved_bytes
from lessonlib.lab import labargs, labkit
from lessonlib.models import MLP, RECOMPUTE, Block, GPTConfig, init_weights_
from lessonlib.tensor_parallel.async_tp import enable_async_tp
from lessonlib.tensor_parallel.async_tp_runs import across_ranks, compare_overlap
from lessonlib.tensor_parallel.dtensor_ref import parallelize_with_dtensor, tp_mesh
from lessonlib.tensor_parallel.layers import TensorParallelMLP
from lessonlib.tensor_parallel.ops import split_sequence
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
    return init_weights_(Block(cfg, settings["recompute"]), seed=0, std=0.02)


def _ours(kind, dense, sp: bool = True):
    return (TensorParallelMLP.from_mlp(dense, sequence_parallel=sp) if kind == "mlp"
            else parallelize_block(dense, sequence_parallel=sp))


def _implementations(kind, dense, settings, mesh) -> dict:
    sp = settings["sequence_parallel"]
    return {"lessonlib": _ours(kind, dense, sp),
            "torch": parallelize_with_dtensor(dense, kind + ("_sp" if sp else ""), mesh)}


def _kept_bytes(module, x) -> int:
    """Bytes one forward keeps for backward (weights left out), freed again."""
    with saved_bytes(exclude=module.parameters()) as meter:
        y = module(x)
    y.sum().backward()
    return meter.bytes


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
    impls = _implementations(kind, dense, settings, mesh)
    x.grad = None
    reference = dense(x)
    reference.backward(grad_out)
    ref_grad = x.grad.clone()
    if settings["sequence_parallel"]:       # each rank feeds and checks its s/t rows
        group = mesh.get_group()
        reference, ref_grad = (split_sequence(v.detach(), group) for v in (reference, ref_grad))
        x, grad_out = (split_sequence(v.detach(), group) for v in (x, grad_out))
        x.requires_grad_()
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
                      "saved_bytes": _kept_bytes(module, x.detach().requires_grad_()),
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
    out = {"rank": dist.get_rank(), **labkit.rank_info(),
           **{kind: _measure(kind, settings, x, grad_out, mesh) for kind in KINDS}}
    if settings.get("overlap"):      # plain SP ("plain") against async TP ("overlapped"), the same weights
        rows, grads = (split_sequence(v.detach(), mesh.get_group()) for v in (x, grad_out))
        out["overlap"] = {kind: compare_overlap(
            _ours(kind, _dense(kind, settings).to(dev)),
            enable_async_tp(_ours(kind, _dense(kind, settings).to(dev))), rows, grads,
            settings["steps"], settings["warmup"]) for kind in KINDS}
    return out


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
    record["saved_bytes"] = {kind: {name: ranks[0][kind][name]["saved_bytes"]
                                    for name in ("lessonlib", "torch")} for kind in KINDS}
    record["matrix_bytes_fraction_of_dense"] = {
        kind: results["lessonlib"]["layers"][kind]["matrix_bytes"]
        / record["dense"][kind]["matrix_bytes"] for kind in KINDS}
    record["rows"], record["headline"] = table(record), HEADLINE
    if settings.get("overlap"):
        record["overlap"] = {kind: across_ranks([r["overlap"][kind] for r in ranks])
                             for kind in KINDS}
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
                "sequence_parallel": record["settings"]["sequence_parallel"],
                "recompute": record["settings"]["recompute"] if kind == "block" else "none",
                "saved_bytes": layer["saved_bytes"],
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
    labargs.check_positive(p, args, "world-size", "steps", "batch", "seq", "hidden", "heads")
    if args.warmup < 0:
        p.error(f"--warmup must be 0 or more; got {args.warmup}")
    if args.hidden % args.heads:
        p.error(f"--hidden {args.hidden} must be divisible by --heads {args.heads}")
    if args.heads % args.world_size:
        p.error(f"--heads {args.heads} must be divisible by the TP degree t = --world-size "
                f"{args.world_size} (each rank gets heads/t heads)")
    labargs.check_fits(p, args, "the MLP's inner activations (b s 4h floats)",
                      [("--batch", args.batch), ("--seq", args.seq), ("--hidden", args.hidden)],
                      itemsize=4 * 4)
    labargs.check_fits(p, args, "the attention scores (b a s^2 floats)",
                      [("--batch", args.batch), ("--heads", args.heads), ("--seq", args.seq),
                       ("--seq", args.seq)])
    if args.sequence_parallel and args.seq % args.world_size:
        p.error(f"--sequence-parallel splits the sequence over the TP ranks: --seq {args.seq} "
                f"(s) must be divisible by t = --world-size {args.world_size}")
    if args.overlap and not args.sequence_parallel:
        p.error("--overlap runs async TP, which decomposes sequence parallelism's gathers: "
                "add --sequence-parallel")
    settings = {"batch": args.batch, "seq": args.seq, "hidden": args.hidden,
                "heads": args.heads, "steps": args.steps, "warmup": args.warmup,
                "sequence_parallel": args.sequence_parallel, "recompute": args.recompute}
    return settings | ({"overlap": True} if args.overlap else {})


def main(argv=None):
    p = labargs.parser("tp", __doc__.splitlines()[0])
    p.set_defaults(steps=20, warmup=3)
    p.add_argument("--batch", type=int, default=8, help="b, sequences per step")
    p.add_argument("--seq", type=int, default=128, help="s, tokens per sequence")
    p.add_argument("--hidden", type=int, default=256, help="h; the MLP's inner size is 4h")
    p.add_argument("--heads", type=int, default=8, help="a, attention heads")
    p.add_argument("--sequence-parallel", action="store_true",
                   help="split the layers' input and output along the sequence (SP)")
    p.add_argument("--overlap", action="store_true",
                   help="also async TP against plain SP: parity and exposed communication")
    p.add_argument("--recompute", default="none", choices=RECOMPUTE,
                   help="what the transformer layer recomputes in backward")
    args = labkit.parse(p, argv)
    settings = check_settings(p, args) | {"dtype": args.dtype}
    record = build_record(labkit.on_ranks(worker, args, settings), settings, args.world_size)
    return labkit.emit(record, args.json)


if __name__ == "__main__":
    main()
