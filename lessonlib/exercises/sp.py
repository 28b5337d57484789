"""Checkers for the sequence-parallel exercises (14): SP's activation saving, and its g.

Each checker returns a ``Verdict`` (``lessonlib.exercises.verdict``) that says what is right
or wrong in plain words; an untouched stub is "your turn", not an error. The gather runs the
student's functions on 2 real ranks, as the tensor-parallel checkers do
(``lessonlib.exercises.tp``), so the cell that defines them must import what they use.

Laptop:  the notebook calls these; e.g. ``check_sp_activation_ratio(1.6)``.
GPU box: the same (the 2-rank check uses NCCL when 2 GPUs are visible).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from lessonlib import comm, device
from lessonlib.costmodel import MODELS
from lessonlib.costmodel.memory import activation_bytes_per_layer
from lessonlib.exercises.tp import run_pair
from lessonlib.exercises.verdict import Verdict, correct, not_yet, number, unanswered


def check_sp_activation_ratio(answer, model: str = "gpt3-175B", t: int = 8) -> Verdict:
    """Exercise: by what factor sequence parallelism shrinks the activations one layer keeps
    per GPU under t-way tensor parallelism (Korthikanti et al. 2022, Table 2, b = 1). The
    question asks for two significant figures: that rounding is right, as is anything
    within 0.5 %."""
    if answer is None:
        return unanswered("my_sp_ratio")
    got = number(answer)
    if got is None:
        return not_yet(f"give one number, the factor; got {answer!r}")
    layer = MODELS[model]
    tp, sp = (activation_bytes_per_layer(layer, 1, t, on) for on in (False, True))
    want = tp / sp
    if abs(got - want) < 5e-3 * want or got == float(f"{want:.2g}"):  # two figures asked
        return correct(f"TP keeps sbh(10 + 24/t + 5as/(ht)), SP sbh(34 + 5as/h)/t: x{want:.2f}. "
                       f"SP splits the 10sbh that TP leaves on every rank; the rest was "
                       f"already split.")
    if abs(got - t) < 1e-3:
        return not_yet(f"x{t} compares SP with the dense layer; TP had already split most of "
                       f"the layer by t: only its replicated 10sbh shrinks now.")
    return not_yet(f"divide TP's sbh(10 + 24/t + 5as/(ht)) by TP+SP's sbh(34 + 5as/h)/t with "
                   f"5as/h = {5 * layer.a * layer.s / layer.h:g} and t = {t}; you gave {got:g}.")


class _StudentGather(torch.autograd.Function):
    """The student's g under autograd; a gradient of the wrong shape is noted in ``seen``
    (and replaced by zeros) so the checker can name it instead of autograd's error."""

    @staticmethod
    def forward(ctx, x, fwd, bwd, seen):
        ctx.bwd, ctx.seen, ctx.shape = bwd, seen, x.shape
        return fwd(x, None)

    @staticmethod
    def backward(ctx, grad):
        got = ctx.bwd(grad.contiguous(), None)
        ctx.seen["grad_shape"] = tuple(got.shape)
        if got.shape != ctx.shape:
            got = grad.new_zeros(ctx.shape)
        return got, None, None, None


def _run_gather(forward, backward) -> dict:
    """On each rank: this rank's rows of one (b, s, h) sequence through the student's g;
    the loss weighs the gathered sequence by a different tensor on every rank, as each
    rank's column layer uses it with its own weights."""
    t, rank, dev = dist.get_world_size(), dist.get_rank(), device.current_device()
    gen = torch.Generator().manual_seed(0)
    whole = torch.randn(3, 4, 5, generator=gen)                           # (b, s, h)
    uses = torch.randn(t, 3, 4, 5, generator=gen)                         # per rank
    x = whole.chunk(t, 1)[rank].clone().to(dev).requires_grad_()          # (b, s/t, h)
    seen = {}
    try:
        with comm.ledger() as fwd_book:
            y = _StudentGather.apply(x, forward, backward, seen)
        out = {"status": "ran", "shape": tuple(y.shape), "rows": tuple(x.shape),
               "want_shape": tuple(whole.shape), "forward_ops": fwd_book.summary()}
        if y.shape != whole.shape:
            return out
        out["error"] = (y.detach().cpu() - whole).abs().max().item()
        with comm.ledger() as bwd_book:
            (y * uses[rank].to(dev)).sum().backward()
    except NotImplementedError:
        return {"status": "todo"}
    grad = x.grad.cpu()
    out.update(grad_shape=seen["grad_shape"], backward_ops=bwd_book.summary(),
               grad_error=(grad - uses.sum(0).chunk(t, 1)[rank]).abs().max().item(),
               own_error=(grad - uses[rank].chunk(t, 1)[rank]).abs().max().item())
    return out


def check_gather_sequence(forward, backward) -> Verdict:
    """Korthikanti's g from ``forward(x, group)`` and ``backward(grad, group)``: all-gather
    this rank's s/t rows along the sequence (dim 1) forward; reduce-scatter the gradient of
    the whole sequence backward, back to this rank's rows. Run on 2 ranks."""
    ranks = run_pair(_run_gather, forward, backward, "my_gather_forward or my_gather_backward")
    if isinstance(ranks, Verdict):
        return ranks
    r = ranks[0]
    b, rows, h = r["rows"]
    if r["shape"] == r["rows"]:
        return not_yet(f"forward returns this rank's rows {r['shape']}; gather every rank's "
                       f"rows along the sequence (dim 1) to get {r['want_shape']}")
    if r["shape"] == (b, rows, h * len(ranks)):
        return not_yet(f"forward gives {r['shape']}: you gathered along the hidden dim, as a "
                       f"column layer's output slices would be; SP splits the sequence, so "
                       f"concatenate along dim 1 to get {r['want_shape']}")
    if r["shape"] != r["want_shape"]:
        return not_yet(f"forward gives {r['shape']}, but the whole sequence is "
                       f"{r['want_shape']}")
    if r["error"] > 1e-5:
        return not_yet(f"forward's values differ from the whole sequence by up to "
                       f"{r['error']:.3g}: concatenate rank 0's rows first along dim 1")
    if "all_gather" not in r["forward_ops"]:
        return not_yet("forward's values are right, but no all_gather went through "
                       "lessonlib.comm: use comm.all_gather so the message can be counted")
    worst = max(ranks, key=lambda x: x["grad_error"])
    if worst["grad_shape"] != r["rows"]:
        return not_yet(f"backward returns {worst['grad_shape']}; the input was this rank's "
                       f"rows {r['rows']}, so its gradient has that shape")
    if worst["grad_error"] > 1e-5:
        if max(x["own_error"] for x in ranks) < 1e-5:
            return not_yet("backward keeps this rank's rows of its own gradient, but every "
                           "rank used the whole gathered sequence: the input's gradient is "
                           "the sum over ranks, so reduce-scatter it")
        return not_yet(f"backward's gradient differs by up to {worst['grad_error']:.3g}: "
                       f"sum the ranks' gradients and keep this rank's rows of the sum")
    ops = r["backward_ops"]
    if "reduce_scatter" not in ops:
        return not_yet(f"the gradient is right, but backward sent {', '.join(ops) or 'nothing'}"
                       f" through lessonlib.comm: an all-reduce then a slice moves twice a "
                       f"reduce-scatter's bytes; use comm.reduce_scatter_tensor")
    return correct(f"the whole sequence forward, with {r['forward_ops']['all_gather']['calls']}"
                   f" all-gather of {r['forward_ops']['all_gather']['bytes']:,} bytes per rank,"
                   f" and this rank's rows of the summed gradient backward, with "
                   f"{ops['reduce_scatter']['calls']} reduce-scatter: that is Korthikanti's g")
