"""Sequence parallelism and recomputation checked for real: the rank functions the tests,
notebook 14 and ``labs/tp.py`` launch.

What it teaches: each way of keeping a layer's activations (``MODES``: tensor parallel alone,
with sequence parallelism, with selective or full recomputation) is still the dense layer,
and differs only in what it keeps for backward and what it sends.

* ``parity_report(t)``: every mode of a transformer layer, and the tiny GPT with TP+SP, against
  the dense one-process model (outputs, input and weight gradients, weights after 3 SGD
  steps), the ledger of one forward and backward each, and PyTorch's own sequence-parallel
  plan (``SequenceParallel`` + ``ColwiseParallel``/``RowwiseParallel``) on the same weights.
* ``activation_report(t)``: the bytes one layer keeps for backward on this rank in every
  mode, measured by ``lessonlib.instruments.activations.saved_bytes``, beside the exact formula
  (``costmodel.memory.course_layer_activation_bytes``).

Each returns a record of ``reports`` (``SequenceParity``, ``ActivationBytes``,
``LedgerReport``), its fields named.

Laptop:  ``python -c "from lessonlib.tensor_parallel import sequence_runs as r; \\
          print(r.run(2, r.activation_report, 2))"``
GPU box: the same functions under torchrun, one rank per GPU (NCCL).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from lessonlib import comm, device, launcher
from lessonlib.baseline import rel_err
from lessonlib.costmodel.memory import course_layer_activation_bytes
from lessonlib.instruments.activations import saved_bytes
from lessonlib.models import Block, GPTConfig, TinyGPT, init_weights_, lm_loss, set_recompute
from lessonlib.tensor_parallel.dtensor_ref import parallelize_with_dtensor, tp_mesh
from lessonlib.tensor_parallel.ops import split_sequence
from lessonlib.tensor_parallel.parallelize import parallelize_block, parallelize_gpt
from lessonlib.tensor_parallel.reports import (ActivationBytes, Kept, LedgerReport, Sent,
                                               SequenceLesson, SequenceParity,
                                               SequencePlanParity, traffic)
from lessonlib.tensor_parallel.layer_runs import (compare_with_dense, float_batches, refusals,
                                            token_batches, tp_context, worst_error)
from lessonlib.tensor_parallel.sequence import SequenceGather, SequenceScatter

MODES = {  # name: (sequence_parallel, recompute); at t = 1 "tp" is the dense layer
    "tp": (False, "none"), "tp+sp": (True, "none"),
    "tp+selective": (False, "selective"), "tp+sp+selective": (True, "selective"),
    "full": (False, "full"), "tp+sp+full": (True, "full")}


def layer_for(mode: str, dense: Block, group) -> nn.Module:
    """``dense`` split over ``group`` in ``mode``, as this rank's layer: under SP it takes
    and returns this rank's s/t rows."""
    sequence_parallel, recompute = MODES[mode]
    return set_recompute(parallelize_block(dense, group, sequence_parallel=sequence_parallel),
                         recompute)


def whole_sequence(mode: str, dense: Block, group) -> nn.Module:
    """``layer_for`` taking and returning the whole (b, s, h), to compare with ``dense``."""
    layer = layer_for(mode, dense, group)
    if not MODES[mode][0]:
        return layer
    return nn.Sequential(SequenceScatter(group), layer, SequenceGather(group))


def _config(s, h, heads) -> GPTConfig:
    return GPTConfig(vocab=48, seq=s, hidden=h, heads=heads, layers=2)


WHOLE_MODELS = ("gpt+sp", "gpt+sp+vocab", "torch+sp")


def parity_report(t: int, b: int = 2, s: int = 12, h: int = 48, heads: int = 12,
                  steps: int = 3, seed: int = 0, modes=tuple(MODES),
                  models=WHOLE_MODELS) -> SequenceParity:
    """On each rank, in float64: each of ``modes`` of a layer vs the dense layer; ``models``:
    the TP+SP GPT (replicated or vocabulary-parallel head) vs the dense GPT, and PyTorch's
    sequence-parallel plan vs the dense layer."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        ctx, dev = tp_context(t), device.current_device()
        group, cfg = ctx.axis("tp").group, _config(s, h, heads)
        dense = lambda: init_weights_(Block(cfg), seed, std=0.02).to(dev)   # noqa: E731
        floats = float_batches(b, s, h, steps, seed + 1, dev)
        vs_dense = {mode: compare_with_dense(dense(), lambda m, mode=mode: whole_sequence(
            mode, m, group), floats, F.mse_loss) for mode in modes}
        tokens = token_batches(b, cfg, steps, seed + 1, dev)
        for name, vocab_parallel in (("gpt+sp", False), ("gpt+sp+vocab", True)):
            if name not in models:
                continue
            vs_dense[name] = compare_with_dense(
                TinyGPT(cfg, seed).to(dev), lambda m, v=vocab_parallel: parallelize_gpt(
                    m, group, vocab_parallel=v, sequence_parallel=True), tokens, lm_loss)
        theirs = (torch_sequence_parallel_errors(dense(), ctx, floats[0])
                  if "torch+sp" in models else None)
        ctx.destroy()
    finally:
        torch.set_default_dtype(before)
    return SequenceParity(rank=dist.get_rank(), t=t, b=b, s=s, h=h, vs_dense=vs_dense,
                          torch=theirs)


def torch_sequence_parallel_errors(dense: Block, ctx, batch) -> SequencePlanParity:
    """PyTorch's plan (``SequenceParallel`` + Colwise/Rowwise) and ours on the same weights
    and this rank's s/t rows: theirs against the dense layer (output, input gradient, every
    gradient), and ours against theirs (output, input gradient)."""
    group = ctx.axis("tp").group
    x, y = batch
    x_d = x.clone().requires_grad_()
    out_d = dense(x_d)
    F.mse_loss(out_d, y).backward()
    results = {}
    for name, module in (("torch", parallelize_with_dtensor(dense, "block_sp", tp_mesh(ctx))),
                         ("lessonlib", layer_for("tp+sp", dense, group))):
        mine = split_sequence(x, group).requires_grad_()
        out = module(mine)                                              # (b, s/t, h)
        # the dense loss is a mean over b*s*h: each rank's share of it, summed by the group
        (F.mse_loss(out, split_sequence(y, group), reduction="sum") / y.numel()).backward()
        results[name] = (out.detach(), mine.grad, module)
    out_t, grad_t, theirs = results["torch"]
    full = {n: p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
            for n, p in theirs.named_parameters()}
    return SequencePlanParity(
        output=rel_err(out_t, split_sequence(out_d.detach(), group)),
        input_grad=rel_err(grad_t, split_sequence(x_d.grad, group)),
        grads=worst_error(full, {n: p.grad for n, p in dense.named_parameters()})[0],
        ours_vs_theirs_output=rel_err(results["lessonlib"][0], out_t),
        ours_vs_theirs_input_grad=rel_err(results["lessonlib"][1], grad_t))


def activation_report(t: int, b: int = 2, s: int = 16, h: int = 32, heads: int = 4,
                      dtype=torch.float64, seed: int = 0) -> ActivationBytes:
    """On each rank: the bytes one layer keeps for backward in every mode (``MODES``), each
    with the formula's bytes; "dense" is the plain ``Block`` in one process."""
    ctx, dev = tp_context(t), device.current_device()
    group, cfg = ctx.axis("tp").group, _config(s, h, heads)
    dense = init_weights_(Block(cfg), seed, std=0.02).to(dev, dtype)
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(b, s, h, generator=gen, dtype=dtype).to(dev)                 # (b, s, h)
    size = torch.finfo(dtype).bits // 8
    kept, layers = {}, {"dense": (dense, x, False, "none")}
    for mode, (sp, recompute) in MODES.items():
        rows = split_sequence(x, group) if sp else x                             # (b, s_r, h)
        layers[mode] = (layer_for(mode, dense, group), rows, sp, recompute)
    for mode, (layer, rows, sp, recompute) in layers.items():
        rows = rows.clone().requires_grad_()
        with saved_bytes(exclude=layer.parameters()) as meter:
            y = layer(rows)
        y.sum().backward()                      # and free what was kept
        kept[mode] = Kept(measured=meter.bytes, tensors=meter.tensors,
                          formula=course_layer_activation_bytes(
                              b, s, h, heads, 1 if mode == "dense" else t, sp, recompute, size))
    ctx.destroy()
    return ActivationBytes(rank=dist.get_rank(), t=t, b=b, s=s, h=h, a=heads,
                           element_size=size, kept=kept)


def ledger_report(t: int, b: int = 2, s: int = 16, h: int = 32, heads: int = 4,
                  modes=("tp", "tp+sp", "full", "tp+sp+full"), seed: int = 0) -> LedgerReport:
    """On each rank: the ledger of one forward and one backward of one layer (this rank's
    rows under SP) in each of ``modes``, as ``sent[mode].forward`` and ``.backward``."""
    ctx, dev = tp_context(t), device.current_device()
    dense = init_weights_(Block(_config(s, h, heads)), seed, std=0.02).to(dev)
    x = torch.randn(b, s, h, generator=torch.Generator().manual_seed(seed + 1)).to(dev)
    sent = {}
    for mode in modes:
        layer = layer_for(mode, dense, ctx.axis("tp").group)
        rows = (split_sequence(x, ctx.axis("tp").group) if MODES[mode][0] else x).requires_grad_()
        with comm.ledger() as forward:
            y = layer(rows)                                              # (b, s_r, h)
        with comm.ledger() as backward:
            y.sum().backward()
        sent[mode] = Sent(forward=traffic(forward), backward=traffic(backward))
    ctx.destroy()
    return LedgerReport(t=t, b=b, s=s, h=h, element_size=x.element_size(), sent=sent)


def bad_sequence_report() -> dict:
    """A sequence that does not split over t, and a sequence-parallel layer fed the whole
    sequence instead of its s/t rows: one error naming s and t each, nothing sent."""
    cfg = GPTConfig(seq=6, hidden=8, heads=4)
    cases = {"parallelize_gpt": lambda: parallelize_gpt(TinyGPT(cfg, 0), sequence_parallel=True),
             "scatter": lambda: SequenceScatter()(torch.zeros(2, 6, 8)),
             "whole sequence into an SP block": lambda: parallelize_block(
                 Block(cfg), sequence_parallel=True)(torch.zeros(2, 6, 8))}
    return refusals(cases)


def lesson_report(ts=(1, 2, 4), seqs=(8, 16, 32)) -> SequenceLesson:
    """What notebook 14 launches on 4 ranks: the bytes per mode at each t (and at t = 2 for
    each s in ``seqs``, the widget's points), the ledgers at t > 1, and TP+SP's parity with
    the dense layer and with PyTorch's plan at t = 2 and 4."""
    return SequenceLesson(
        bytes={t: activation_report(t) for t in ts},
        bytes_by_s={s: activation_report(2, s=s) for s in seqs},
        ledger={t: ledger_report(t) for t in ts if t > 1},
        parity={t: parity_report(t, modes=("tp+sp", "tp+sp+selective", "full"),
                                 models=("gpt+sp", "torch+sp")) for t in ts if t > 1})


def run(world_size: int, fn, *args, timeout: float = 120, **kwargs) -> list:
    """Launch one of the reports above on ``world_size`` ranks."""
    return launcher.launch(fn, world_size, *args, timeout=timeout, **kwargs)
