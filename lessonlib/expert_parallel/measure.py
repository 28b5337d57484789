"""What the MoE lesson measures: load, drops, the all-to-all's bytes and time.

What it teaches: an MoE layer's cost is set by its routing. ``balance_study`` trains the
tiny MoE GPT on the course's corpus with no balancing, with the auxiliary loss (GShard,
Switch) or with DeepSeek-V3's bias and no auxiliary loss, and records how many tokens each
expert was sent, step by step (the histogram), the share of choices dropped in training
(none when dropless), and what share of the routing choices a capacity factor of 1.0, 1.25
or 2.0 drops on a held-out batch. ``node_traffic`` groups the ranks into pretend nodes and
measures, with and without the node limit, the all-to-alls' bytes, the share of them that
crosses a node boundary, and how many other nodes each token reaches (what a dispatch that
sends a token once per node, as DeepSeek-V3's does, §3.2.2, sends across). ``time_layer`` times the
e-rank layer's step and the all-to-alls inside it (from the ledger: a batch of sends and
receives is one all-to-all, as long as its slowest part). ``alltoall_sweep`` times bare
all-to-alls of growing size, the points the alpha-beta model is fitted to. Two properties of
DeepSeek-V3's bias, in one process (the bug zoo checks them): a bias shared by every expert
changes no choice, so ``shared_bias_shift`` must find the output unmoved; the bias update
evens the load (``bias_load_ratios``).

Laptop:  ``python labs/ep.py --world-size 4`` (``time_layer``); ``balance_study`` runs in
one process.
GPU box: the same under NCCL; the ledger's times are CUDA events.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from lessonlib import comm, device, launcher
from lessonlib.baseline import corpus_batches, rel_err
from lessonlib.expert_parallel.groups import update_biases
from lessonlib.expert_parallel.layer import expert_parallel
from lessonlib.expert_parallel.layer_runs import Traffic, expected_bytes, sent_and_received
from lessonlib.models import moe
from lessonlib.models import MOE_CONFIG, init_weights_, lm_loss, moe_gpt
from lessonlib.models.moe import MoELayer, aux_loss
from lessonlib.models.moe_routing import bias_update, route

CAPACITY_FACTORS = (1.0, 1.25, 2.0)


@dataclass
class BalanceStudy:
    """``balance_study``'s run: the recipe, E and k; the choices each expert of the first
    layer was sent at every step, the language-model and auxiliary losses, the share of
    choices dropped in training, the held-out batch's dropped share by capacity factor, and
    the busiest expert over the mean (second half of the steps)."""
    balance: object
    gate: str
    E: int
    k: int
    load: list
    losses: list
    aux_losses: list
    train_dropped_share: float
    dropped_share: dict
    imbalance: float


def balance_study(balance="aux", n_experts: int = 8, top_k: int = 2, steps: int = 60,
                  batch: int = 16, seed: int = 0, factors=CAPACITY_FACTORS,
                  gate: str = "softmax", capacity_factor=1.25,
                  bias_step: float = moe.BIAS_STEP) -> BalanceStudy:
    """Train ``moe_gpt`` (AdamW) on the corpus with ``balance`` "aux" (the auxiliary loss in
    the objective; ``True`` says the same), "bias" (no auxiliary loss; every MoE layer's
    bias moved after each optimizer step) or "none" (``False``); return the choices each
    expert of the first layer was sent at every step, the language-model losses, the share
    of choices dropped in training (``capacity_factor`` None: dropless, 0), and the dropped
    share of a held-out batch at each capacity factor, over every MoE layer."""
    recipe = {True: "aux", False: "none"}.get(balance, balance)
    torch.manual_seed(seed)
    model = moe_gpt(MOE_CONFIG, n_experts, top_k, capacity_factor, seed=seed, balance=recipe,
                    gate=gate, bias_step=bias_step)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    batches, load, losses, aux = corpus_batches(MOE_CONFIG, batch, seed), [], [], []
    layers, dropped_in_training = [b.mlp for b in model.blocks], 0
    for step in range(steps):
        x, y = batches(step)
        loss = lm_loss(model(x), y)
        aux.append(aux_loss(model))                  # zero unless balance is "aux"
        (loss + aux[-1]).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        moe.update_biases(model)                     # a no-op unless balance is "bias"
        load.append(layers[0].stats["routed_per_expert"])
        losses.append(loss.item())
        aux[-1] = aux[-1].item()
        dropped_in_training += sum(m.stats["dropped"] for m in layers)
    train_choices = steps * top_k * batch * MOE_CONFIG.seq * len(layers)
    x, _ = batches(10_000)
    dropped = {}
    with torch.no_grad():
        for factor in factors:
            for layer in layers:
                layer.capacity_factor = factor
            model(x)
            choices = top_k * x.numel()
            dropped[factor] = sum(m.stats["dropped"] for m in layers) / (choices * len(layers))
    return BalanceStudy(balance, gate, n_experts, top_k, load, losses, aux,
                        dropped_in_training / train_choices, dropped, imbalance(load[steps // 2:]))


def imbalance(load: list[list[int]]) -> float:
    """The busiest expert's load over the mean load, averaged over steps (1 = even)."""
    return statistics.mean(max(step) * len(step) / sum(step) for step in load)


@dataclass(frozen=True)
class OutputShift:
    """How far a bias shared by every expert moved the layer's output (relative)."""
    moved: float


def shared_bias_shift() -> OutputShift:
    """DeepSeek-V3's routing (sigmoid, bias, node limit, dropless) with a bias of 0 and of
    0.25 for every expert: the same choices, so the output must not move."""
    x = torch.randn(2, 8, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    outs = []
    for shift in (0.0, 0.25):
        layer = init_weights_(MoELayer(8, 8, 2, None, ffn_mult=2, balance="bias", gate="sigmoid",
                                       max_nodes=2, experts_per_node=2), 0).double()
        layer.expert_bias.fill_(shift)
        outs.append(layer(x).detach())
    return OutputShift(moved=rel_err(outs[1], outs[0]))


@dataclass(frozen=True)
class LoadRatios:
    """Busiest / mean expert load at the first bias update and its worst over the last 10."""
    first: float
    last: float


def bias_load_ratios() -> LoadRatios:
    """50 bias updates (gamma 0.01) on a router that favours 2 of 8 experts (top-2,
    sigmoid): busiest / mean load at the first step and its worst over the last 10."""
    logits = torch.randn(64, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    logits[:, :2] += 1.5
    bias, ratios = torch.zeros(8, dtype=torch.float64), []
    for _ in range(50):
        load = route(logits, 2, None, balance="bias", gate="sigmoid", bias=bias).routed_per_expert
        ratios.append(load.max().item() * 8 / load.sum().item())
        bias = bias_update(bias, load, 0.01)
    return LoadRatios(first=ratios[0], last=max(ratios[-10:]))


def node_traffic(limits, ranks_per_node: int, n_experts: int = 8, top_k: int = 2, b: int = 4,
                 s: int = 32, h: int = 16, seed: int = 0, **routing) -> list[dict]:
    """On each rank of the world (e = world size, ranks grouped into pretend nodes of
    ``ranks_per_node``, so a node holds E/e x ranks_per_node experts), for each node limit M
    of ``limits`` (None: none): one forward and backward of the dropless expert-parallel
    layer; what this rank's all-to-alls sent in all and to ranks of other nodes (the
    ledger), and the other nodes its tokens' experts sit on. A one-hop all-to-all sends each
    of a token's k copies; a dispatch that crosses once per node and forwards inside it (as
    DeepSeek-V3's does, §3.2.2) sends one copy per other node, at most M."""
    e, rank = dist.get_world_size(), dist.get_rank()
    per_node, node_of = n_experts // e * ranks_per_node, [r // ranks_per_node for r in range(e)]
    x = torch.randn(b, s, h, generator=torch.Generator().manual_seed(seed + 1 + rank))
    out = []
    for limit in limits:
        nodes = {"max_nodes": limit, "experts_per_node": per_node} if limit else {}
        full = init_weights_(MoELayer(h, n_experts, top_k, None, **nodes, **routing), seed)
        ep = expert_parallel(full)
        with comm.ledger() as book:
            ep(x).square().mean().backward()
        sends = [ev for ev in book.events if ev.op == "send"]
        with torch.no_grad():
            r = moe.route(full.router(x.reshape(-1, h)), top_k, None, **full.routing_options())
        expert = torch.arange(n_experts).repeat_interleave(r.tokens_per_expert)
        reached = {(t, n // per_node) for t, n in zip(r.token.tolist(), expert.tolist())}
        per_token = [sum(1 for t_, _ in reached if t_ == t) for t in range(b * s)]
        out.append({"rank": rank, "max_nodes": limit, "sent": sum(ev.bytes for ev in sends),
                    "sent_off_node": sum(ev.bytes for ev in sends
                                         if node_of[ev.peer] != node_of[rank]),
                    "copies_off_node": sum(1 for _, n in reached if n != node_of[rank]),
                    "most_nodes_per_token": max(per_token), "tokens": b * s,
                    "dropped": ep.stats["dropped"]})
    return out


def node_traffic_study(world_size: int = 4, ranks_per_node: int = 2, limits=(None, 1),
                       **kwargs) -> dict:
    """``node_traffic`` on ``world_size`` ranks (one launch), summed over the ranks:
    {M: {"alltoall_bytes", "off_node_share", "node_copies_per_token", "most_nodes_per_token",
    "dropped"}} (M None: no limit)."""
    ranks = launcher.launch(node_traffic, world_size, list(limits), ranks_per_node, **kwargs)
    out = {}
    for i, limit in enumerate(limits):
        case = [r[i] for r in ranks]
        sent = sum(r["sent"] for r in case)
        out[limit] = {"alltoall_bytes": sent,
                      "off_node_share": sum(r["sent_off_node"] for r in case) / sent,
                      "node_copies_per_token": sum(r["copies_off_node"] for r in case)
                      / sum(r["tokens"] for r in case),
                      "most_nodes_per_token": max(r["most_nodes_per_token"] for r in case),
                      "dropped": sum(r["dropped"] for r in case)}
    return out


def alltoall_seconds(events) -> float:
    """Seconds spent in all-to-alls: each batch of sends and receives counted once, for its
    longest part (every part of a batch is timed from its start to its wait)."""
    batches: dict = {}
    for ev in events:
        if ev.batch is not None:
            batches[ev.batch] = max(batches.get(ev.batch, 0.0), ev.seconds)
    return sum(batches.values())


@dataclass
class LayerTiming:
    """One rank's ``time_layer``: each timed step's seconds and all-to-all seconds, the first
    step's output error, routing stats, this rank's load per expert each step, the first
    step's all-to-all bytes (sent, received, off-rank) against the routing's, and events."""
    rank: int
    e: int
    step_s: list
    alltoall_s: list
    output_max_abs_error: float
    stats: dict
    load: list
    bytes: Traffic
    expected_bytes: Traffic
    events: list


def time_layer(n_experts: int, top_k: int, capacity_factor, b: int, s: int, h: int,
               steps: int, warmup: int, seed: int = 0, **routing) -> LayerTiming:
    """On each rank of the world (e = world size): the expert-parallel layer's forward and
    backward, ``warmup`` + ``steps`` times, each step's time and all-to-all time and this
    rank's load per expert (the bias, with ``balance="bias"``, moved after each step by
    the load all-reduced over the ranks); the first step's output against the one-process
    layer, and its bytes against the routing. ``routing``: ``MoELayer``'s options."""
    dev, rank = device.current_device(), dist.get_rank()
    full = init_weights_(MoELayer(h, n_experts, top_k, capacity_factor, **routing), seed)
    full = full.to(dev)
    ep = expert_parallel(full)
    gen = torch.Generator().manual_seed(seed + 1 + rank)
    x = torch.randn(b, s, h, generator=gen).to(dev).requires_grad_()          # (b, s, h)
    y = torch.randn(b, s, h, generator=gen).to(dev)
    step_s, a2a_s, load = [], [], []
    for i in range(warmup + steps):
        dist.barrier()
        with comm.ledger() as book:
            start = device.timer()
            out = ep(x)
            loss = F.mse_loss(out, y) + ep.aux_loss
            loss.backward()
            elapsed = device.timer() - start
        if i == 0:
            first = {"events": book.events, "stats": dict(ep.stats)}
            with torch.no_grad():
                error = (out - full(x)).abs().max().item()
        if i >= warmup:
            step_s.append(elapsed)
            a2a_s.append(alltoall_seconds(book.events))
        load.append(ep.stats["routed_per_expert"])
        update_biases(ep)                  # a no-op unless balance="bias"
        ep.zero_grad(set_to_none=True)
        x.grad = None
    stats = first["stats"]
    return LayerTiming(rank, dist.get_world_size(), step_s, a2a_s, error, stats, load,
                       sent_and_received(first["events"], rank),
                       expected_bytes(stats, n_experts, h, x.element_size(),
                                      return_element_size=_compute_size(x)),
                       first["events"])


def _compute_size(x: torch.Tensor) -> int:
    """Bytes per element the experts compute in: autocast's dtype when it is on."""
    kind = x.device.type
    if torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind).itemsize
    return x.element_size()


def alltoall_sweep(sizes_bytes=(2**10, 2**14, 2**17, 2**20), repeats: int = 7) -> list:
    """Seconds of one all-to-all of equal slices, for each total size a rank sends:
    [(e, bytes_per_rank, seconds)], the points ``costmodel.alpha_beta.fit_alpha_beta`` takes
    (with the all-to-all's terms, ``costmodel.moe.alltoall_terms``). The fastest of
    ``repeats``: CPU ranks share their cores with whatever else runs, and load only adds."""
    e, dev, points = dist.get_world_size(), device.current_device(), []
    for size in sizes_bytes:
        rows = max(e, size // 4 // e * e)
        send, recv = torch.ones(rows, device=dev), torch.empty(rows, device=dev)
        times = []
        for _ in range(repeats + 1):
            dist.barrier()
            start = device.timer()
            comm.all_to_all_single(recv, send)
            times.append(device.timer() - start)
        points.append((e, rows * 4, min(times[1:])))
    return points
