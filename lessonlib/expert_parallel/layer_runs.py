"""Expert parallelism checked for real: the rank functions the tests, notebook 13 and
``labs/ep.py`` launch.

What it teaches: the e-rank layer is right when it is the one-process layer. ``rank_parity``
trains the full ``MoELayer`` on every rank's batch in one process (the loss is the mean of
the d ranks' losses, each with its auxiliary loss, capacity counted per rank's batch) next
to the expert-parallel copy (each rank its own batch, gradients averaged by
``sync_gradients``), in float64, and reports for the first step the error of this rank's
output, auxiliary loss, drops and every gradient, and of every weight after the last step
(and of the balancing bias, moved after each step by the whole batch's load: on one process
the sum of the d batches' loads, on the ranks ``update_biases``' all-reduce).
``ROUTING_CASES`` runs the routing options (balance aux, bias or none; softmax or sigmoid
gates; capacity 1.0 or dropless; with and without a node limit) pairwise at e = 1, 2 and 4:
at each e, 6 cases in which every pair of option values appears (a covering array, 18 of
the 24 combinations over the three e), in the same launch; ``TWO_RANK_CASES`` are the two
cases a 2-rank launch runs.
The ledger of the first step shows what the all-to-alls moved: per rank, 8E bytes of counts
plus, in the forward, the rows it dispatched and the rows it returned, each h elements.

One job: the expert-parallel layer's and GPT's parity with one process and the bytes their
all-to-alls move; its length is the cases and the records they return.

Laptop:  ``python -c "from lessonlib.expert_parallel import layer_runs;
         print(layer_runs.run_parity(4))"``
GPU box: the same call uses NCCL when 4 GPUs are visible.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from lessonlib import comm, device, launcher
from lessonlib.baseline import grads_as_model, rel_err
from lessonlib.baseline import corpus_batches
from lessonlib.data_parallel.ladder import sync_gradients
from lessonlib.expert_parallel.groups import (ExpertParallelContext, expert_parameters,
                                              update_biases)
from lessonlib.expert_parallel.layer import check_split, expert_parallel, expert_parallel_gpt
from lessonlib.instruments.breadcrumbs import progress
from lessonlib.models import moe
from lessonlib.models import corpus_config, init_weights_, lm_loss, moe_gpt
from lessonlib.models.moe import MoELayer, aux_loss

# (E, e, k, C, shared): e = 1, 2, 4; E/e = 1 and 2; k = 1 and 2; C = 1.0 drops tokens
CASES = ((4, 1, 1, 1.0, False), (4, 2, 2, 1.0, True), (4, 4, 2, 1.0, False),
         (8, 4, 1, 1.0, False))
# (E, e, k, C, shared, routing): a bias step far above DeepSeek-V3's 0.001, so that 3 steps
# move choices; the node limit: 4 nodes of 2 experts, each token's 2 experts on 1 of them


def _route(e: int, balance: str, gate: str, C, nodes) -> tuple:
    return (8, e, 2, C, False, {"balance": balance, "gate": gate, "bias_step": 0.05,
                                "max_nodes": nodes, "experts_per_node": 2 if nodes else None})


# at each e, 6 of the 24 combinations (balance x gate x capacity 1.0 or dropless x node
# limit or not) that hold every pair of option values at least once: one row per balance and
# gate, the two gates of a balance opposite in capacity and in node limit; the three e share
# no row, so the launch runs 18 combinations, DeepSeek-V3's (bias, sigmoid, dropless, node
# limit) at e = 4
PAIRWISE_ROUTES = {
    1: (("aux", "softmax", 1.0, None), ("aux", "sigmoid", None, 1),
        ("bias", "softmax", None, None), ("bias", "sigmoid", 1.0, 1),
        ("none", "softmax", 1.0, 1), ("none", "sigmoid", None, None)),
    2: (("aux", "softmax", None, 1), ("aux", "sigmoid", 1.0, None),
        ("bias", "softmax", 1.0, 1), ("bias", "sigmoid", None, None),
        ("none", "softmax", None, None), ("none", "sigmoid", 1.0, 1)),
    4: (("aux", "softmax", 1.0, 1), ("aux", "sigmoid", None, None),
        ("bias", "softmax", 1.0, None), ("bias", "sigmoid", None, 1),
        ("none", "softmax", None, 1), ("none", "sigmoid", 1.0, None))}
ROUTING_CASES = tuple(_route(e, *row) for e, rows in PAIRWISE_ROUTES.items() for row in rows)
# the smallest launch whose sums over data-parallel ranks can go wrong: 2 ranks, one group
# of e = 2 (each expert on one rank only, the bias moved by both ranks' loads); a capacity
# that drops tokens with a shared expert, then DeepSeek-V3's routing
TWO_RANK_CASES = (CASES[1], _route(2, "bias", "sigmoid", None, 1))


def _batches(d, b, s, h, steps, seed, dev):
    """[step][rank] -> (x, y), float64, the same on every rank."""
    gen = torch.Generator().manual_seed(seed)
    return [[tuple(torch.randn(b, s, h, generator=gen, dtype=torch.float64).to(dev)
                   .requires_grad_(xy == "x") for xy in "xy") for _ in range(d)]
            for _ in range(steps)]                                                # (b, s, h)


def _loss(layer, x, y):
    return F.mse_loss(layer(x), y) + layer.aux_loss


def _worst(module, reference, attr=None) -> float:
    """Largest error over ``module``'s parameters (or their ``.grad``) against the same names
    in ``reference``, relative to the largest reference value of them all: a per-tensor
    ratio would blow up on a gradient that is zero in exact arithmetic (the key biases':
    softmax ignores a shift shared by all keys)."""
    want = {n: p.detach() for n, p in reference.named_parameters()}
    got = {n: (getattr(p, attr) if attr else p).detach() for n, p in module.named_parameters()}
    scale = max(w.abs().max().item() for w in want.values()) or 1e-30
    return max((g - want[n]).abs().max().item() for n, g in got.items()) / scale


@dataclass
class LayerParity:
    """One rank's ``rank_parity``: the case, the experts this rank holds; the first step's errors
    against one process, drops and tokens per expert (ours, one process's), routing stats,
    ledger events and sync all-reduces; the last step's weight and bias errors, bias moved."""
    rank: int
    E: int
    e: int
    k: int
    C: float | None
    shared: bool
    d: int
    h: int
    routing: dict
    expert_ids: list
    output: float
    input_grad: float
    aux_loss: float
    dropped: tuple
    tokens_per_expert: tuple
    grads: float
    stats: dict
    events: list
    sync_all_reduces: int
    weights_after_steps: float
    bias_after_steps: float
    bias_moved: float


def rank_parity(E: int, e: int, k: int, C, shared: bool = False, routing: dict | None = None,
                h: int = 8, b: int = 2, s: int = 8, steps: int = 3, seed: int = 0) -> LayerParity:
    """On each rank: the expert-parallel layer against the one-process layer, ``steps``
    SGD steps on every rank's batch (see the module docstring); ``routing``: the layer's
    routing options (``MoELayer``'s keywords)."""
    ctx, dev = ExpertParallelContext.build(e), device.current_device()
    rank, d = dist.get_rank(), dist.get_world_size()
    full = init_weights_(MoELayer(h, E, k, C, ffn_mult=2, shared_expert=shared,
                                  **(routing or {})), seed)
    full = full.double().to(dev)
    ep = expert_parallel(full, ctx.ep.group)
    opt_full = torch.optim.SGD(full.parameters(), lr=0.1, momentum=0.9)
    opt_ep = torch.optim.SGD(ep.parameters(), lr=0.1, momentum=0.9)
    first = {}
    for step, batch in enumerate(_batches(d, b, s, h, steps, seed + 1, dev)):
        progress(f"expert-parallel parity E={E} e={e} step {step}")
        losses, loads = [], []
        for x, y in batch:
            losses.append(_loss(full, x, y))
            loads.append(full.stats["routed_per_expert"])
        mine_out = full(batch[rank][0]).detach()
        mine_stats, mine_aux = full.stats, full.aux_loss
        (sum(losses) / d).backward()
        x, y = batch[rank][0].detach().clone().requires_grad_(), batch[rank][1]
        with comm.ledger() as book:
            got = ep(x)
            loss = F.mse_loss(got, y) + ep.aux_loss
            loss.backward()
        with comm.ledger() as sync:
            sync_gradients(ep, None, expert_parameters(ep), ctx.edp.group, ctx.d)
        if step == 0:
            first.update(output=rel_err(got.detach(), mine_out),
                       # this rank's loss is L_r; the one-process loss the mean of d of them
                       input_grad=rel_err(x.grad, d * batch[rank][0].grad),
                       aux_loss=abs(ep.aux_loss.item() - mine_aux.item()),
                       dropped=(ep.stats["dropped"], mine_stats["dropped"]),
                       tokens_per_expert=(ep.stats["tokens_per_expert"],
                                          mine_stats["tokens_per_expert"]),
                       grads=_worst(ep, expert_parallel(grads_as_model(full), ctx.ep.group),
                                    "grad"),
                       stats=ep.stats,
                       events=book.events, sync_all_reduces=sync.count("all_reduce"))
        for opt in (opt_full, opt_ep):
            opt.step()
            opt.zero_grad(set_to_none=True)
        full.update_bias([sum(col) for col in zip(*loads)])   # the whole batch's load
        update_biases(ep)
    biased = full.expert_bias is not None
    report = LayerParity(
        rank, E, e, k, C, shared, d, h, routing or {}, ep.expert_ids, **first,
        weights_after_steps=_worst(ep, expert_parallel(full, ctx.ep.group)),
        bias_after_steps=(ep.expert_bias - full.expert_bias).abs().max().item() if biased
        else 0.0,
        bias_moved=full.expert_bias.abs().max().item() if biased else 0.0)
    ctx.destroy()
    return report


DEEPSEEK_V3 = {"capacity_factor": None, "balance": "bias", "gate": "sigmoid",
               "bias_step": 0.05, "max_nodes": 1, "experts_per_node": 2}   # E = 4: 2 nodes


@dataclass
class GPTParity:
    """One rank's ``gpt_parity``: the loss error of each step, the first step's worst
    gradient error, the weights' and the balancing biases' worst errors after the last."""
    rank: int
    e: int
    d: int
    loss: list
    grads: float
    weights_after_steps: float
    bias_after_steps: float


def gpt_parity(e: int, n_experts: int = 4, top_k: int = 2, capacity_factor=1.0,
               b: int = 2, steps: int = 3, seed: int = 0, **routing) -> GPTParity:
    """On each rank: the tiny MoE GPT, its MoE layers expert-parallel over groups of e inside
    the d data-parallel ranks, trained on the corpus (each rank b sequences) against the
    one-process model on all d ranks' sequences, in float64: the loss of each step, every
    gradient after the first, every weight (and every layer's balancing bias) after the
    last. ``routing``: ``MoELayer``'s options (e.g. ``DEEPSEEK_V3``)."""
    ctx, dev = ExpertParallelContext.build(e), device.current_device()
    rank, d = dist.get_rank(), dist.get_world_size()
    cfg = corpus_config(seq=8, hidden=16, heads=2, layers=2)
    full = moe_gpt(cfg, n_experts, top_k, capacity_factor, seed, **routing).double().to(dev)
    ep = expert_parallel_gpt(full, ctx.ep.group)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (full, ep)]
    batches, loss_errors, grads = corpus_batches(cfg, b * d, seed), [], None
    for step in range(steps):
        xs, ys = (t.to(dev).chunk(d) for t in batches(step))                    # (b, s) each
        losses, loads = [], []
        for x, y in zip(xs, ys):
            losses.append(lm_loss(full(x), y) + aux_loss(full))
            loads.append([m.stats["routed_per_expert"] for m in moe.moe_layers(full)])
        (sum(losses) / d).backward()
        loss = lm_loss(ep(xs[rank]), ys[rank]) + aux_loss(ep)
        loss.backward()
        sync_gradients(ep, None, expert_parameters(ep), ctx.edp.group, ctx.d)
        loss_errors.append(abs(loss.item() - losses[rank].item()))
        if step == 0:
            grads = _worst(ep, expert_parallel_gpt(grads_as_model(full), ctx.ep.group), "grad")
        for opt in opts:
            opt.step()
            opt.zero_grad(set_to_none=True)
        # the whole batch's load per layer: the sum over the d ranks' sequences
        moe.update_biases(full, [[sum(c) for c in zip(*layer)] for layer in zip(*loads)])
        update_biases(ep)
    report = GPTParity(
        rank, e, d, loss_errors, grads,
        weights_after_steps=_worst(ep, expert_parallel_gpt(full, ctx.ep.group)),
        bias_after_steps=max((abs(a.expert_bias - b.expert_bias).max().item()
                              for a, b in zip(moe.moe_layers(ep), moe.moe_layers(full))
                              if a.expert_bias is not None), default=0.0))
    ctx.destroy()
    return report


def gpt_parity_reports(e: int, recipes=({}, DEEPSEEK_V3), **kwargs) -> list[GPTParity]:
    """``gpt_parity`` for each routing recipe of ``recipes`` in one launch."""
    return [gpt_parity(e, **kwargs, **recipe) for recipe in recipes]


def parity_reports(cases=CASES, **kwargs) -> list[LayerParity]:
    """``rank_parity`` for each (E, e, k, C, shared[, routing]) of ``cases`` in one launch."""
    return [rank_parity(*case, **kwargs) for case in cases]


def check_cases(world_size: int, cases=CASES) -> None:
    """One line per bad setting, before any process starts."""
    for E, e, k, C, *rest in cases:
        check_split(E, e, k, C, **(rest[1] if len(rest) > 1 else {}))
        if world_size % e:
            raise ValueError(f"e={e} must divide the world size {world_size} (expert-parallel "
                             f"groups of e consecutive ranks)")


def run_parity(world_size: int, cases=CASES, timeout: float = 120, **kwargs) -> list:
    """Check the cases here, then launch ``parity_reports`` on ``world_size`` ranks:
    [rank][case] -> report."""
    check_cases(world_size, cases)
    return launcher.launch(parity_reports, world_size, cases, timeout=timeout, **kwargs)


@dataclass
class Traffic:
    """Bytes a rank's all-to-alls sent and received, and of those to or from other ranks."""
    sent: int
    received: int
    sent_off_rank: int | None = None
    received_off_rank: int | None = None


def sent_and_received(events, rank: int) -> Traffic:
    """Bytes this rank's all-to-alls sent and received, in all and to or from other ranks."""
    sends = [ev for ev in events if ev.op == "send"]
    recvs = [ev for ev in events if ev.op == "recv"]
    return Traffic(sum(ev.bytes for ev in sends), sum(ev.bytes for ev in recvs),
                   sum(ev.bytes for ev in sends if ev.peer != rank),
                   sum(ev.bytes for ev in recvs if ev.peer != rank))


def expected_bytes(stats: dict, E: int, h: int, element_size: int = 8, count_size: int = 8,
                   return_element_size: int | None = None, backward: bool = True) -> Traffic:
    """What the routing counts say one step's all-to-alls move for this rank, sent and
    received alike: the counts (E integers), the rows it dispatches (sum of ``sent_rows``,
    in the input's ``element_size``) and the results it returns (sum of ``received_rows``,
    in the experts' output's, ``return_element_size``: smaller under autocast), h elements
    each; the backward retraces both trips, each gradient in its trip's dtype."""
    rows_out, rows_in = sum(stats["sent_rows"]), sum(stats["received_rows"])
    d, r = element_size, return_element_size or element_size
    rows = rows_out * d + rows_in * r + ((rows_out * r + rows_in * d) if backward else 0)
    return Traffic(sent=E * count_size + rows * h, received=E * count_size + rows * h)
