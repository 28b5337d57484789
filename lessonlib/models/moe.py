"""A mixture-of-experts feed-forward layer: a router sends each token to k of E expert MLPs.

What it teaches: an MoE layer holds E times the MLP's parameters but spends only k MLPs of
compute per token. A linear router scores the E experts for each token and
``lessonlib.models.moe_routing`` picks its k (GShard's and Switch's softmax, capacity and auxiliary
loss; or DeepSeek-V3's sigmoid affinities, bias balancing, node limit and no capacity).

The layer is written as GShard's three steps so that the expert-parallel version
(``lessonlib.expert_parallel``) differs in one place only, the exchange between ranks:

    route -> dispatch (gather each expert's tokens) -> experts -> combine (weighted sum)

With ``balance="bias"`` the layer holds the per-expert bias as a buffer (not a parameter:
no gradient moves it); the trainer calls ``update_bias(load)`` after each optimizer step
with that step's load per expert, summed over every replica's batch.

Laptop:  ``python -m lessonlib.models.moe`` routes a random batch with each recipe, prints the stats.
GPU box: the same; the layer has no device logic of its own.
"""
from __future__ import annotations

import torch
from torch import nn

from lessonlib.argcheck import positive_int
from lessonlib.models.moe_routing import (AUX_ALPHA, BIAS_STEP, Routing, bias_update, check_routing,
                                          route)


def check_moe(n_experts: int, top_k: int, capacity_factor, **routing) -> tuple:
    """The MoE settings, checked (one line each): E >= 1, 1 <= k <= E, C > 0 or None
    (dropless), and the routing options (``moe_routing.check_routing``)."""
    n_experts = positive_int("n_experts", n_experts, what="experts E")
    top_k = positive_int("top_k", top_k, most=n_experts,
                         what="experts each token is sent to, k <= E")
    check_routing(n_experts, top_k, capacity_factor, **routing)
    return n_experts, top_k, capacity_factor


def expert_mlp(hidden: int, ffn_mult: int = 4) -> nn.Sequential:
    """One expert: the transformer's MLP, Linear(h, ffn_mult h) -> GeLU -> Linear back."""
    return nn.Sequential(nn.Linear(hidden, ffn_mult * hidden), nn.GELU(),
                         nn.Linear(ffn_mult * hidden, hidden))


def run_experts(experts, routed: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """Each expert on its own consecutive rows of ``routed`` (n, h): rows grouped by expert,
    ``counts[j]`` of them for ``experts[j]``."""
    chunks = routed.split(counts)
    return torch.cat([expert(chunk) for expert, chunk in zip(experts, chunks)])   # (n, h)


def combine(expert_out: torch.Tensor, routing: Routing, tokens: int) -> torch.Tensor:
    """Sum each token's gated expert outputs: (n, h) -> (T, h); a token whose every choice
    was dropped gets zeros (its residual carries it)."""
    weighted = routing.gate.unsqueeze(-1).to(expert_out.dtype) * expert_out
    out = expert_out.new_zeros(tokens, expert_out.shape[-1])
    return out.index_add(0, routing.token, weighted)                            # (T, h)


ROUTING = ("n_experts", "top_k", "capacity_factor", "aux_alpha", "balance", "gate",
           "bias_step", "max_nodes", "experts_per_node")   # what a layer routes with


class Routed(nn.Module):
    """A layer with a router. Its last forward leaves ``aux_loss`` (a tensor in that
    forward's graph, to add to the training loss) and the routing it counts ``stats`` from
    when asked (the counts read to the host then, never inside the forward); a copy
    (``copy.deepcopy``, pickling) starts with neither. It routes with the settings named in
    ``ROUTING`` and holds ``expert_bias`` (E,), a buffer, when ``balance == "bias"``."""

    aux_loss = None              # the last forward's; None before any
    _routed = None               # what ``stats`` counts from: the last forward's routing

    def __getstate__(self):
        return {**super().__getstate__(), "aux_loss": None, "_routed": None}

    @property
    def stats(self) -> dict:
        """The last forward's counters ({} before any): ``dropped``, ``capacity``,
        ``tokens_per_expert``, ``routed_per_expert`` (and an expert-parallel layer's rows)."""
        return {} if self._routed is None else self._count(self._routed)

    @staticmethod
    def _count(routing) -> dict:
        return {k: v for k, v in routing.stats().items() if k != "aux_loss"}

    def routing_options(self) -> dict:
        """The options of ``moe_routing.queue`` this layer routes with, its bias included."""
        return {"balance": self.balance, "gate": self.gate, "bias": self.expert_bias,
                "max_nodes": self.max_nodes, "experts_per_node": self.experts_per_node}

    @torch.no_grad()
    def update_bias(self, load) -> None:
        """After the optimizer step: DeepSeek-V3's bias update with that step's load (E,),
        the choices routed to each expert summed over every replica's batch (a data-parallel
        run all-reduces it first, so every replica moves the same bias); a no-op unless
        ``balance == "bias"``."""
        if self.expert_bias is not None:
            self.expert_bias.copy_(bias_update(self.expert_bias, load, self.bias_step))


class MoELayer(Routed):
    """E expert MLPs behind a linear router: (b, s, h) -> (b, s, h). After each forward,
    ``aux_loss`` is a tensor to add to the training loss (zero unless ``balance="aux"``), and
    ``stats``, asked for, counts ``dropped`` (choices over capacity; 0 when
    ``capacity_factor`` is None, dropless), ``tokens_per_expert`` (kept) and
    ``routed_per_expert`` (the load the bias update takes). The routing options are ``moe_routing.queue``'s."""

    def __init__(self, hidden: int, n_experts: int, top_k: int = 1,
                 capacity_factor: float | None = 1.25, ffn_mult: int = 4,
                 shared_expert: bool = False, aux_alpha: float = AUX_ALPHA,
                 balance: str = "aux", gate: str = "softmax", bias_step: float = BIAS_STEP,
                 max_nodes: int | None = None, experts_per_node: int | None = None):
        super().__init__()
        hidden = positive_int("hidden", hidden, what="the layer width h")
        ffn_mult = positive_int("ffn_mult", ffn_mult, what="an expert's inner size / h")
        self.n_experts, self.top_k, self.capacity_factor = check_moe(
            n_experts, top_k, capacity_factor, balance=balance, gate=gate, bias_step=bias_step,
            max_nodes=max_nodes, experts_per_node=experts_per_node)
        self.aux_alpha, self.balance, self.gate = aux_alpha, balance, gate
        self.bias_step = bias_step
        self.max_nodes, self.experts_per_node = max_nodes, experts_per_node
        self.register_buffer("expert_bias", torch.zeros(n_experts) if balance == "bias" else None)
        self.router = nn.Linear(hidden, self.n_experts, bias=False)
        self.experts = nn.ModuleList(expert_mlp(hidden, ffn_mult) for _ in range(n_experts))
        self.shared = expert_mlp(hidden, ffn_mult) if shared_expert else None

    def forward(self, x):
        b, s, h = x.shape
        tokens = x.reshape(b * s, h)                                            # (T, h)
        routing = route(self.router(tokens), self.top_k, self.capacity_factor, self.aux_alpha,
                        **self.routing_options())
        routed = tokens[routing.token]                          # (n, h), grouped by expert
        expert_out = run_experts(self.experts, routed, routing.tokens_per_expert.tolist())
        out = combine(expert_out, routing, b * s)                               # (T, h)
        if self.shared is not None:
            out = out + self.shared(tokens)
        self.aux_loss, self._routed = routing.aux_loss, routing
        return out.view(b, s, h)                                                # (b, s, h)


def moe_layers(model: nn.Module) -> list:
    """Every MoE layer of ``model`` (a ``MoELayer`` or its expert-parallel copy)."""
    return [m for m in model.modules() if isinstance(m, Routed)]


def aux_loss(model: nn.Module) -> torch.Tensor:
    """The sum of the auxiliary losses of ``model``'s MoE layers in its last forward."""
    return sum((m.aux_loss for m in moe_layers(model)), torch.zeros(()))


def update_biases(model: nn.Module, loads=None) -> None:
    """After the optimizer step, every MoE layer's ``update_bias``: with ``loads`` (one (E,)
    per layer, in ``moe_layers`` order) or, in one process, each layer's last forward's."""
    layers = moe_layers(model)
    loads = [m.stats["routed_per_expert"] for m in layers] if loads is None else loads
    for layer, load in zip(layers, loads):
        layer.update_bias(load)


if __name__ == "__main__":
    x = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(0))
    for recipe in ({"capacity_factor": 1.0}, {"capacity_factor": None, "gate": "sigmoid",
                   "balance": "bias", "max_nodes": 1, "experts_per_node": 2}):
        layer = MoELayer(16, 4, top_k=2, **recipe)
        layer(x)
        print(recipe, f"aux_loss {layer.aux_loss.item():.4f}", layer.stats)
