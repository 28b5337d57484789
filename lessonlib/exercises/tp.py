"""Checkers for the model-parallel (03) and tensor-parallel (04) exercises.

Each checker runs the student's function, prints what is right or wrong in plain words and
returns True or False (a hidden solution cell asserts it). A function that still raises
``NotImplementedError`` is reported as "not written yet", not as an error.

The tensor-parallel checkers run the student's code on 2 real ranks: the launcher sends a
function written in a notebook cell by value (``cloudpickle``), with the globals it uses, so
the cell that defines it must import what it uses (``torch``, ``dist``, ``F``, ``comm``).

Laptop:  the notebooks call these; e.g. ``check_stage_split(my_split)``.
GPU box: the same (the 2-rank checks use NCCL when 2 GPUs are visible).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from lessonlib import comm, device
from lessonlib.costmodel import tp_elements_per_layer
from lessonlib.launcher import LaunchTimeout, RankError, launch
from lessonlib.model_parallel import idle_fraction

def _say(ok: bool, message: str) -> bool:
    print(("✅ " if ok else "❌ ") + message)
    return ok


def _todo(name: str) -> bool:
    print(f"⏳ {name} is not written yet (it raises NotImplementedError): fill it in and run "
          f"this cell again.")
    return False


# ---------------------------------------------------------------- notebook 03, in process
def check_stage_split(fn) -> bool:
    """``fn(n_layers, p)`` -> p lists of consecutive layer indices, sizes differing by <= 1."""
    for n, p in ((8, 4), (6, 4), (7, 2), (5, 5), (12, 3)):
        try:
            got = fn(n, p)
        except NotImplementedError:
            return _todo(fn.__name__)
        got = [list(s) for s in got]
        if len(got) != p:
            return _say(False, f"{fn.__name__}({n}, {p}) gave {len(got)} stages; "
                               f"p={p} asks for {p}")
        if [i for s in got for i in s] != list(range(n)):
            return _say(False, f"{fn.__name__}({n}, {p}) = {got}: every layer 0..{n - 1} must "
                               f"appear once, in order, stage after stage")
        sizes = [len(s) for s in got]
        if min(sizes) < 1 or max(sizes) - min(sizes) > 1:
            return _say(False, f"{fn.__name__}({n}, {p}) = {got}: stage sizes {sizes} are not "
                               f"balanced; they should differ by at most one layer")
    return _say(True, "contiguous, complete and balanced for every case tried")


def check_idle_share(fn, results: list[dict]) -> bool:
    """``fn(timeline, wall)`` -> idle share of one rank, on the notebook's real timelines."""
    line = [r for r in results if r["rank"] < results[0]["p"]]      # the first line
    wall = max(x.end for r in line for x in r["timeline"])
    for r in line:
        try:
            got = fn(r["timeline"], wall)
        except NotImplementedError:
            return _todo(fn.__name__)
        want = idle_fraction(r["timeline"], wall)
        if abs(got - want) > 1e-9:
            return _say(False, f"rank {r['rank']}: you got {got:.3f}, but the rank worked "
                               f"(F, B and OPT spans) {1 - want:.3f} of the wall time, so it "
                               f"idled {want:.3f}. Waiting and sending count as idle.")
    return _say(True, "idle share right for every rank")


# ---------------------------------------------------------------- notebook 04
def check_tp_bytes(fn) -> bool:
    """``fn(b, s, h, t)`` -> bytes one rank sends per layer per micro-batch (fp32, ring)."""
    for b, s, h, t in ((1, 2048, 12288, 8), (4, 32, 128, 2), (2, 16, 64, 4), (8, 128, 256, 1)):
        try:
            got = fn(b, s, h, t)
        except NotImplementedError:
            return _todo(fn.__name__)
        want = 4 * tp_elements_per_layer(b, s, h, t)
        if abs(got - want) > 1e-6 * max(want, 1):
            return _say(False, f"{fn.__name__}({b}, {s}, {h}, {t}) = {got:,.0f} but one rank "
                               f"sends {want:,.0f} bytes: 4 all-reduces (2 forward, 2 backward) "
                               f"of b*s*h fp32 values, each costing 2(t-1)/t of its size in a ring")
    return _say(True, "matches 8bsh(t-1)/t elements x 4 bytes (Megatron-LM 2021 §3.2)")


def _launch_student(worker, *fns) -> list | str:
    """Run ``worker(*fns)`` on 2 ranks, the student's functions sent by value; return the
    ranks' results, or what went wrong in plain words."""
    try:
        return launch(worker, 2, *fns, timeout=60)
    except RankError as exc:
        return f"your code raised on rank {exc.rank}:\n{exc}"
    except LaunchTimeout:
        return ("the 2 ranks waited on each other for 60 s: does every rank call the same "
                "collectives, in the same order, with tensors of the same shape?")


def _run_column(fn) -> dict:
    """On each rank: the student's column-parallel forward on this rank's weight rows."""
    t, rank, dev = dist.get_world_size(), dist.get_rank(), device.current_device()
    gen = torch.Generator().manual_seed(0)
    dense = nn.Linear(16, 24).to(dev)
    with torch.no_grad():
        dense.weight.copy_(torch.randn(24, 16, generator=gen))
        dense.bias.copy_(torch.randn(24, generator=gen))
    x = torch.randn(3, 5, 16, generator=gen).to(dev)                          # (b, s, in)
    w, b = dense.weight.detach().chunk(t, 0)[rank], dense.bias.detach().chunk(t, 0)[rank]
    try:
        with comm.ledger() as book:
            y = fn(x, w, b, None)
    except NotImplementedError:
        return {"status": "todo"}
    want = dense(x).detach()
    ok_shape = tuple(y.shape) == tuple(want.shape)
    return {"status": "ran", "shape": tuple(y.shape), "want_shape": tuple(want.shape),
            "error": (y - want).abs().max().item() if ok_shape else None,
            "local_error": (y - want.chunk(t, -1)[rank]).abs().max().item()
            if tuple(y.shape) == tuple(want.chunk(t, -1)[rank].shape) else None,
            "ops": book.summary()}


def check_column_forward(fn) -> bool:
    """``fn(x, weight, bias, group)``: this rank's rows of a Linear's weight and bias in, the
    full (..., out) output out, on every rank. Run on 2 ranks."""
    ranks = _launch_student(_run_column, fn)
    if isinstance(ranks, str):
        return _say(False, ranks)
    r = ranks[0]
    if r["status"] == "todo":
        return _todo(fn.__name__)
    if r["local_error"] is not None and r["local_error"] < 1e-5:
        return _say(False, f"you return this rank's slice {r['shape']}; gather the slices of "
                           f"all ranks along the last dim to get {r['want_shape']}")
    if r["error"] is None:
        return _say(False, f"output shape {r['shape']} but the dense layer gives {r['want_shape']}")
    if r["error"] > 1e-5:
        return _say(False, f"values differ from the dense layer by up to {r['error']:.3g}: "
                           f"F.linear(x, weight, bias) per rank, then concatenate rank 0's slice "
                           f"first along dim -1")
    if "all_gather" not in r["ops"]:
        return _say(False, "the values are right, but no all_gather went through lessonlib.comm: "
                           "use comm.all_gather so the message can be counted")
    return _say(True, f"output equals the dense layer on both ranks, with "
                      f"{r['ops']['all_gather']['calls']} all-gather of "
                      f"{r['ops']['all_gather']['bytes']:,} bytes per rank")


class _StudentF(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, fwd, bwd):
        ctx.bwd = bwd
        return fwd(x, None)

    @staticmethod
    def backward(ctx, grad):
        return ctx.bwd(grad, None), None, None


def _run_f(forward, backward) -> dict:
    """On each rank: x = rank + 1, y = f(x), loss = sum(y * (rank + 1))."""
    rank, dev = dist.get_rank(), device.current_device()
    x = torch.full((4,), float(rank + 1), device=dev, requires_grad=True)
    try:
        with comm.ledger() as fwd_book:
            y = _StudentF.apply(x, forward, backward)
        with comm.ledger() as bwd_book:
            (y * (rank + 1)).sum().backward()
    except NotImplementedError:
        return {"status": "todo"}
    return {"status": "ran", "y": y.tolist(), "x": x.tolist(), "grad": x.grad.tolist(),
            "forward_all_reduces": fwd_book.count("all_reduce"),
            "backward_all_reduces": bwd_book.count("all_reduce")}


def check_f_operator(forward, backward) -> bool:
    """Megatron's f from two functions ``forward(x, group)`` and ``backward(grad, group)``.

    On 2 ranks, x = rank + 1 and the loss weighs f(x) by rank + 1, so the right input
    gradient is 1 + 2 = 3 on both ranks."""
    ranks = _launch_student(_run_f, forward, backward)
    if isinstance(ranks, str):
        return _say(False, ranks)
    if ranks[0]["status"] == "todo":
        return _todo(f"{forward.__name__} or {backward.__name__}")
    for r in ranks:
        if r["y"] != r["x"]:
            return _say(False, f"f must not change x in the forward pass: got {r['y']} for "
                               f"x = {r['x']}")
        if r["grad"] != [3.0] * 4:
            return _say(False, f"input gradient {r['grad']}, expected [3.0, ...]: every rank used "
                               f"the whole x, so its gradient is the sum of the ranks' gradients "
                               f"(1 + 2): all-reduce it in backward")
        if r["forward_all_reduces"] != 0 or r["backward_all_reduces"] != 1:
            return _say(False, f"{r['forward_all_reduces']} all-reduce(s) forward and "
                               f"{r['backward_all_reduces']} backward through lessonlib.comm; f "
                               f"has none forward and exactly one backward")
    return _say(True, "identity forward, one all-reduce backward: that is Megatron's f")
