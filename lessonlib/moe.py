"""A mixture-of-experts feed-forward layer: a router sends each token to k of E expert MLPs.

What it teaches: an MoE layer holds E times the MLP's parameters but spends only k MLPs of
compute per token. A linear router scores the E experts for each token; the token goes to
its k best (top-k gating, softmax weights); each expert takes at most its *capacity*,
ceil(C k T / E) of a batch of T tokens (C the capacity factor), and what comes over it is
dropped: that choice adds nothing and the block's residual carries the token on (GShard,
Lepikhin et al. 2020; Switch Transformer, Fedus et al. 2021). The auxiliary loss
alpha E sum_i f_i P_i (f_i the share of the routing choices that pick expert i, P_i its mean
router probability) is smallest when the load is even, and pulls the router toward it.

The layer is written as GShard's three steps so that the expert-parallel version
(``lessonlib.expert_parallel``) differs in one place only, the exchange between ranks:

    route -> dispatch (gather each expert's tokens) -> experts -> combine (weighted sum)

Routing is deterministic: ties between experts go to the lower index, and a token's place
in an expert's queue is set by (its choice rank, its position in the batch), first choices
first, as GShard orders them. The same tokens on one process or on any split of the
experts are routed, kept and dropped alike.

Laptop:  ``python -m lessonlib.moe`` routes a random batch and prints the layer's stats.
GPU box: the same; the layer has no device logic of its own.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from lessonlib.argcheck import positive_int, positive_number

AUX_ALPHA = 0.01   # Switch Transformer's alpha


def check_moe(n_experts: int, top_k: int, capacity_factor: float) -> tuple[int, int, float]:
    """The MoE settings, checked (one line each): E >= 1, 1 <= k <= E, C > 0."""
    n_experts = positive_int("n_experts", n_experts, what="experts E")
    top_k = positive_int("top_k", top_k, most=n_experts,
                         what="experts each token is sent to, k <= E")
    return n_experts, top_k, positive_number("capacity_factor", capacity_factor, example="1.25")


def capacity(tokens: int, n_experts: int, top_k: int, capacity_factor: float) -> int:
    """GShard's expert capacity: ceil(C k T / E) tokens per expert for a batch of T."""
    return math.ceil(capacity_factor * top_k * tokens / n_experts)


def expert_mlp(hidden: int, ffn_mult: int = 4) -> nn.Sequential:
    """One expert: the transformer's MLP, Linear(h, ffn_mult h) -> GeLU -> Linear back."""
    return nn.Sequential(nn.Linear(hidden, ffn_mult * hidden), nn.GELU(),
                         nn.Linear(ffn_mult * hidden, hidden))


@dataclass
class Routing:
    """Where a batch's tokens go: the kept (token, expert) choices grouped by expert, in
    queue order, with their gate weights; and what the router's stats say."""
    token: torch.Tensor              # (n,) the token of each kept choice
    gate: torch.Tensor               # (n,) its weight in the combine (in the graph)
    tokens_per_expert: torch.Tensor  # (E,) kept choices per expert (sum n)
    routed_per_expert: torch.Tensor  # (E,) choices per expert before the capacity cut
    aux_loss: torch.Tensor           # scalar, in the graph
    capacity: int

    def stats(self, kept: list[int] | None = None, routed: list[int] | None = None) -> dict:
        """aux_loss, dropped, capacity and the counts per expert; ``kept`` and ``routed``:
        the two counts already read to the host (else they are read here)."""
        kept = self.tokens_per_expert.tolist() if kept is None else kept
        routed = self.routed_per_expert.tolist() if routed is None else routed
        return {"aux_loss": self.aux_loss, "dropped": sum(routed) - sum(kept),
                "capacity": self.capacity, "tokens_per_expert": kept, "routed_per_expert": routed}


@dataclass
class Queue:
    """``route`` before the capacity cut: every (token, expert) choice in queue order and
    whether it is kept, and the counts, all on the device (nothing read back yet)."""
    expert: torch.Tensor             # (k T,) the expert of each choice
    keep: torch.Tensor               # (k T,) bool: within its expert's capacity
    gates: torch.Tensor              # (k T,) weights, in the graph
    tokens_per_expert: torch.Tensor  # (E,) kept choices per expert
    routed_per_expert: torch.Tensor  # (E,) choices per expert
    aux_loss: torch.Tensor
    capacity: int
    tokens: int                      # T


def queue(logits: torch.Tensor, top_k: int, capacity_factor: float,
          aux_alpha: float = AUX_ALPHA) -> Queue:
    """Top-k gating with capacity (GShard Algorithm 1; Switch for k = 1): (T, E) logits ->
    every choice and whether it fits in its expert's queue. k = 1 weighs a token's expert
    output by its router probability (Switch); k >= 2 by the probabilities renormalized
    over its k experts (GShard, Mixtral)."""
    T, E = logits.shape
    probs = F.softmax(logits, dim=-1)                                          # (T, E)
    # a stable sort breaks ties toward the lower expert index: the same on every process
    top_p, top_e = torch.sort(probs, dim=-1, descending=True, stable=True)
    top_p, top_e = top_p[:, :top_k], top_e[:, :top_k]                          # (T, k)
    gates = top_p if top_k == 1 else top_p / top_p.sum(-1, keepdim=True)
    # queue order: all first choices (in token order), then all second choices, ...
    expert = top_e.t().reshape(-1)                                             # (k T,)
    choice = F.one_hot(expert, E)                                              # (k T, E)
    place = (choice.cumsum(0) * choice).sum(-1) - 1      # place in its expert's queue
    cap = capacity(T, E, top_k, capacity_factor)
    keep = place < cap
    routed = choice.sum(0)
    f = routed.to(probs.dtype) / (top_k * T)               # share of the choices per expert
    aux = aux_alpha * E * (f * probs.mean(0)).sum()
    return Queue(expert, keep, gates.t().reshape(-1), (choice * keep.unsqueeze(1)).sum(0),
                 routed, aux, cap, T)


def cut(q: Queue, n: int) -> Routing:
    """The ``n`` kept choices (n: the kept counts' sum, read by the caller), grouped by
    expert in queue order: a stable sort that puts the dropped ones last, so that no size
    depending on the data is read from the device here."""
    dropped_last = q.expert + q.tokens_per_expert.numel() * (~q.keep)
    kept = torch.sort(dropped_last, stable=True).indices[:n]
    return Routing(token=kept % q.tokens, gate=q.gates[kept],
                   tokens_per_expert=q.tokens_per_expert, routed_per_expert=q.routed_per_expert,
                   aux_loss=q.aux_loss, capacity=q.capacity)


def route(logits: torch.Tensor, top_k: int, capacity_factor: float,
          aux_alpha: float = AUX_ALPHA) -> Routing:
    """``queue``, then the capacity ``cut``: (T, E) logits -> ``Routing``."""
    q = queue(logits, top_k, capacity_factor, aux_alpha)
    return cut(q, int(q.tokens_per_expert.sum()))


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


class Routed(nn.Module):
    """A layer with a router whose last forward left ``stats``: a copy (``copy.deepcopy``,
    pickling) starts with none, since ``stats["aux_loss"]`` belongs to that forward's graph."""

    def __getstate__(self):
        return {**super().__getstate__(), "stats": {}}


class MoELayer(Routed):
    """E expert MLPs behind a linear router: (b, s, h) -> (b, s, h). After each forward,
    ``stats`` holds ``aux_loss`` (a tensor to add to the training loss), ``dropped``
    (choices over capacity), ``tokens_per_expert`` (kept) and ``routed_per_expert``."""

    def __init__(self, hidden: int, n_experts: int, top_k: int = 1,
                 capacity_factor: float = 1.25, ffn_mult: int = 4,
                 shared_expert: bool = False, aux_alpha: float = AUX_ALPHA):
        super().__init__()
        hidden = positive_int("hidden", hidden, what="the layer width h")
        ffn_mult = positive_int("ffn_mult", ffn_mult, what="an expert's inner size / h")
        self.n_experts, self.top_k, self.capacity_factor = check_moe(n_experts, top_k,
                                                                     capacity_factor)
        self.aux_alpha = aux_alpha
        self.router = nn.Linear(hidden, self.n_experts, bias=False)
        self.experts = nn.ModuleList(expert_mlp(hidden, ffn_mult) for _ in range(n_experts))
        self.shared = expert_mlp(hidden, ffn_mult) if shared_expert else None
        self.stats: dict = {}

    def forward(self, x):
        b, s, h = x.shape
        tokens = x.reshape(b * s, h)                                            # (T, h)
        routing = route(self.router(tokens), self.top_k, self.capacity_factor, self.aux_alpha)
        routed = tokens[routing.token]                          # (n, h), grouped by expert
        expert_out = run_experts(self.experts, routed, routing.tokens_per_expert.tolist())
        out = combine(expert_out, routing, b * s)                               # (T, h)
        if self.shared is not None:
            out = out + self.shared(tokens)
        self.stats = routing.stats()
        return out.view(b, s, h)                                                # (b, s, h)


def moe_layers(model: nn.Module) -> list:
    """Every MoE layer of ``model`` (a ``MoELayer`` or its expert-parallel copy)."""
    return [m for m in model.modules() if isinstance(m, Routed)]


def aux_loss(model: nn.Module) -> torch.Tensor:
    """The sum of the auxiliary losses of ``model``'s MoE layers in its last forward."""
    return sum((m.stats["aux_loss"] for m in moe_layers(model)), torch.zeros(()))


if __name__ == "__main__":
    layer = MoELayer(16, 4, top_k=2, capacity_factor=1.0)
    layer(torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(0)))
    print({k: (round(v.item(), 4) if torch.is_tensor(v) else v) for k, v in layer.stats.items()})
