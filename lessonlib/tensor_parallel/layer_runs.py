"""Tensor parallelism checked for real: the rank functions that the tests, notebook 04 and
``labs/tp.py`` launch.

What it teaches: a parallel layer is right when it is the dense layer. ``compare_with_dense``
trains a dense module and its tensor-parallel copy side by side on the same batches and
reports (a ``reports.Parity``), for the first step, the error of the output, the input gradient and every
parameter gradient, and, after the last step, of every weight, each relative to the largest
value it is compared with; a shard is compared with the same slice of the dense tensor.
The ledger of the first forward and backward pass counts what was sent: for a transformer layer 2 all-reduces each way of b*s*h elements, which a
ring turns into 8*b*s*h*(t-1)/t elements per rank (Megatron-LM 2021, §3.2).

``layer_report(t, ...)`` runs on any world size that t divides: ranks form groups of t
consecutive ranks, so one 4-rank launch can check t = 1, 2 and 4.

Laptop:  ``python -c "from lessonlib.tensor_parallel import layer_runs;
         print(layer_runs.run_layer_reports(2, (1, 2)))"``
GPU box: the same call uses NCCL when 2 GPUs are visible.
"""
from __future__ import annotations

from dataclasses import replace

import torch
import torch.distributed as dist
import torch.nn.functional as F

from lessonlib import comm, device, launcher
from lessonlib.argcheck import positive_int
from lessonlib.baseline import grads_as_model, rel_err
from lessonlib.costmodel.comm import tp_elements_per_layer
from lessonlib.grid import ParallelContext
from lessonlib.instruments.breadcrumbs import progress
from lessonlib.models import MLP, Block, GPTConfig, TinyGPT, init_weights_, lm_loss
from lessonlib.tensor_parallel import ops
from lessonlib.tensor_parallel.dtensor_ref import parallelize_with_dtensor, tp_mesh
from lessonlib.tensor_parallel.layers import (ColumnParallelLinear, RowParallelLinear,
                                              TensorParallelMLP, TensorParallelSelfAttention,
                                              check_divisible, check_pair)
from lessonlib.tensor_parallel.parallelize import param_bytes, parallelize_block, parallelize_gpt
from lessonlib.tensor_parallel.reports import LayerReport, Parity, PlanParity, traffic


def worst_error(tensors: dict, reference: dict) -> tuple[float, str]:
    """Largest error between two {name: tensor} dicts relative to the largest reference value
    of all of them (a per-tensor ratio would blow up on gradients that are zero in exact
    arithmetic, like the key bias's: softmax ignores a shift shared by all keys); and where."""
    scale = max(r.detach().abs().max() for r in reference.values()).clamp_min(1e-30)
    err, name = max(((p.detach() - reference[n].detach()).abs().max().item(), n)
                    for n, p in tensors.items())
    return err / scale.item(), name


def _params(module) -> dict:
    return dict(module.named_parameters())


def compare_with_dense(dense, make_tp, batches, loss_fn, lr: float = 0.1) -> Parity:
    """Train ``dense`` (changed in place) and ``make_tp(dense)`` with SGD + momentum on the
    same ``batches`` [(input, target)]; return relative errors, traffic and losses."""
    tp = make_tp(dense)
    opt_d = torch.optim.SGD(dense.parameters(), lr=lr, momentum=0.9)
    opt_t = torch.optim.SGD(tp.parameters(), lr=lr, momentum=0.9)
    first, losses = {}, []
    for step, (x, y) in enumerate(batches):
        progress(f"compare_with_dense step {step}")
        grad_in = x.is_floating_point()
        x_d, x_t = x.clone().requires_grad_(grad_in), x.clone().requires_grad_(grad_in)
        out_d = dense(x_d)
        loss_fn(out_d, y).backward()
        with comm.ledger() as forward:
            out_t = tp(x_t)
            loss = loss_fn(out_t, y)
        with comm.ledger() as backward:
            loss.backward()
        losses.append(loss.item())
        if step == 0:
            expected = _params(make_tp(grads_as_model(dense)))
            grads, worst_grad = worst_error({n: p.grad for n, p in tp.named_parameters()},
                                            expected)
            first = dict(output=rel_err(out_t.detach(), out_d.detach()),
                         input_grad=rel_err(x_t.grad, x_d.grad) if grad_in else None,
                         grads=grads, worst_grad=worst_grad,
                         forward=traffic(forward), backward=traffic(backward))
        for opt in (opt_d, opt_t):
            opt.step()
            opt.zero_grad(set_to_none=True)
    weights, worst_weight = worst_error(_params(tp), _params(make_tp(dense)))
    return Parity(**first, weights_after_steps=weights, worst_weight=worst_weight,
                  losses=losses, param_bytes=param_bytes(tp),
                  dense_param_bytes=param_bytes(dense))


def float_batches(b, s, h, steps, seed, dev):
    gen = torch.Generator().manual_seed(seed)
    return [tuple(torch.randn(b, s, h, generator=gen).to(dev) for _ in "xy")    # (b, s, h)
            for _ in range(steps)]


def token_batches(b, cfg, steps, seed, dev):
    gen = torch.Generator().manual_seed(seed)
    return [tuple(torch.randint(0, cfg.vocab, (b, cfg.seq), generator=gen).to(dev)  # (b, s)
                  for _ in "xy") for _ in range(steps)]


def tp_context(t: int) -> ParallelContext:
    """The world as groups of t consecutive ranks (TP innermost, no pipeline): the context
    every tensor-parallel run here takes its group from. Every rank must call it."""
    return ParallelContext.build(dist.get_world_size() // t, 1, t)


def layer_report(t: int, b: int = 2, s: int = 16, h: int = 64, heads: int = 4, steps: int = 3,
                 seed: int = 0, kinds=("mlp", "block"), with_torch: bool = False) -> LayerReport:
    """On each rank: ``compare_with_dense`` for each of ``kinds`` ("mlp", "block", "gpt") split
    over this rank's group of t; with ``with_torch``, DTensor's split of the same weights too."""
    ctx, dev = tp_context(t), device.current_device()
    group = ctx.axis("tp").group
    cfg = GPTConfig(vocab=64, seq=s, hidden=h, heads=heads, layers=2)
    floats = float_batches(b, s, h, steps, seed + 1, dev)
    builders = {  # kind: (dense module, its tensor-parallel copy, batches, loss)
        "mlp": (lambda: init_weights_(MLP(h), seed),
                lambda m: TensorParallelMLP.from_mlp(m, group), floats, F.mse_loss),
        "block": (lambda: init_weights_(Block(cfg), seed, std=0.02),
                  lambda m: parallelize_block(m, group), floats, F.mse_loss),
        "gpt": (lambda: TinyGPT(cfg, seed),
                lambda m: parallelize_gpt(m, group, vocab_parallel=True),
                token_batches(b, cfg, steps, seed + 1, dev), lm_loss),
    }
    parities = {}
    for kind in kinds:
        build, make_tp, batches, loss_fn = builders[kind]
        parities[kind] = compare_with_dense(build().to(dev), make_tp, batches, loss_fn)
        if with_torch and kind in ("mlp", "block"):
            parities[kind] = replace(parities[kind], torch=_torch_errors(
                build().to(dev), kind, ctx, batches[0]))
    ctx.destroy()          # each t makes its own groups: free them before the next
    return LayerReport(rank=dist.get_rank(), t=t, b=b, s=s, h=h,
                       predicted_elements_per_layer=tp_elements_per_layer(b, s, h, t),
                       **parities)


def layer_reports(ts=(1, 2, 4), **kwargs) -> dict:
    """``layer_report`` for each t in ``ts`` in one launch: {t: LayerReport}."""
    return {t: layer_report(t, **kwargs) for t in ts}


def check_layer_settings(world_size: int, ts=(1, 2, 4), h: int = 64, heads: int = 4,
                         **_) -> None:
    """Raise ValueError naming the setting before any process starts."""
    for t in ts:
        if positive_int("t", t, what="the tensor-parallel size") and world_size % t:
            raise ValueError(f"t={t!r} must be a positive divisor of the world size "
                             f"{world_size} (ranks form groups of t consecutive ranks)")
        check_divisible("heads", heads, t)
    if h % heads:
        raise ValueError(f"h={h} must be divisible by heads={heads}")


def run_layer_reports(world_size: int, ts=(1, 2, 4), timeout: float = 120, **kwargs) -> list:
    """Check the settings here, then launch ``layer_reports`` on ``world_size`` ranks."""
    check_layer_settings(world_size, ts, **kwargs)
    return launcher.launch(layer_reports, world_size, ts, timeout=timeout, **kwargs)


def gathered_mlp_report(t: int, b: int = 2, s: int = 16, h: int = 64,
                        seed: int = 0) -> Parity:
    """The other consistent pairing, gather_output=True with input_is_parallel=False: still
    the dense MLP, but an all-gather (forward) and its transpose (backward) are added."""
    ctx, dev = tp_context(t), device.current_device()
    group = ctx.axis("tp").group
    report = compare_with_dense(
        init_weights_(MLP(h), seed).to(dev),
        lambda m: TensorParallelMLP.from_mlp(m, group, gather_output=True,
                                             input_is_parallel=False),
        float_batches(b, s, h, 2, seed + 1, dev), F.mse_loss)
    ctx.destroy()
    return report


def ops_report(t: int) -> dict:
    """f, g, gather and scatter on this rank's group of t, against what each must compute:
    the largest absolute error of each forward result and input gradient."""
    ctx, dev = tp_context(t), device.current_device()
    group = ctx.axis("tp").group
    shards = [torch.arange(6.0, device=dev).reshape(2, 3) * (r + 1) for r in range(t)]
    mine, full, total = shards[dist.get_rank(group)], torch.cat(shards, dim=-1), sum(shards)
    cases = (  # name, operator, input, upstream gradient, expected output, expected input grad
        ("f", ops.copy_to_tp, mine, mine, mine, total),
        ("g", ops.reduce_from_tp, mine, mine, total, mine),
        ("gather", ops.gather_last_dim, mine, full, full, mine),
        ("scatter", ops.scatter_last_dim, full, mine, mine, full))
    errors = {}
    for name, op, x, upstream, want_out, want_grad in cases:
        x = x.clone().requires_grad_()
        y = op(x, group)
        y.backward(upstream)
        errors[name] = {"forward": (y - want_out).abs().max().item(),
                        "grad": (x.grad - want_grad).abs().max().item()}
    ctx.destroy()
    return errors


def constructor_report(t: int, n_in: int = 8, n_out: int = 12, seed: int = 3) -> dict:
    """Layers built by their constructors hold this rank's slice of the dense layer that
    ``init_weights_`` fills from the same seed: the largest difference of each (0.0)."""
    ctx = tp_context(t)
    dense = init_weights_(torch.nn.Linear(n_in, n_out), seed)
    built = {"column": (ColumnParallelLinear(n_in, n_out, group=ctx.axis("tp").group, seed=seed),
                        ColumnParallelLinear.from_linear(dense, ctx.axis("tp").group)),
             "row": (RowParallelLinear(n_out, n_in, group=ctx.axis("tp").group, seed=seed),
                     RowParallelLinear.from_linear(init_weights_(torch.nn.Linear(n_out, n_in),
                                                                 seed), ctx.axis("tp").group))}
    out = {name: max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))
           for name, (a, b) in built.items()}
    ctx.destroy()
    return out


def _torch_errors(dense, kind, ctx, batch) -> PlanParity:
    """DTensor's ColwiseParallel/RowwiseParallel on the same weights vs the dense module."""
    theirs = parallelize_with_dtensor(dense, kind, tp_mesh(ctx))
    x, y = batch
    x_d, x_t = x.clone().requires_grad_(), x.clone().requires_grad_()
    out_d, out_t = dense(x_d), theirs(x_t)
    F.mse_loss(out_d, y).backward()
    F.mse_loss(out_t, y).backward()
    full = {n: p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
            for n, p in theirs.named_parameters()}
    return PlanParity(output=rel_err(out_t.detach(), out_d.detach()),
                      input_grad=rel_err(x_t.grad, x_d.grad),
                      grads=worst_error(full, {n: p.grad for n, p in dense.named_parameters()})[0],
                      param_bytes=param_bytes(theirs))


def bad_input_report() -> dict:
    """Every bad setting raises ValueError before anything is sent: returns the messages and
    the number of messages sent meanwhile (0). Run it on 4 ranks."""
    cases = {
        "out_features not divisible by t": lambda: ColumnParallelLinear.from_linear(
            torch.nn.Linear(8, 6)),
        "in_features not divisible by t": lambda: RowParallelLinear.from_linear(
            torch.nn.Linear(6, 8)),
        "heads not divisible by t": lambda: TensorParallelSelfAttention.from_attention(
            Block(GPTConfig(hidden=48, heads=6)).attn),
        "hidden not divisible by t": lambda: parallelize_gpt(
            TinyGPT(GPTConfig(hidden=6, heads=2), 0)),
        "gather_output=True with input_is_parallel=True": lambda: check_pair(True, True),
        "gather_output=False with input_is_parallel=False": lambda: TensorParallelMLP.from_mlp(
            MLP(8), gather_output=False, input_is_parallel=False),
        "group size differs from t": lambda: TensorParallelMLP.from_mlp(MLP(8), t=2),
    }
    return refusals(cases)


def refusals(cases: dict) -> dict:
    """Run each of ``cases`` {name: build}: the ValueError each raised (None if it built),
    and the messages sent meanwhile (0 when every check comes before any collective)."""
    messages = {}
    with comm.ledger() as book:
        for name, build in cases.items():
            try:
                build()
                messages[name] = None
            except ValueError as exc:
                messages[name] = str(exc)
    return {"messages": messages, "messages_sent": book.count()}
