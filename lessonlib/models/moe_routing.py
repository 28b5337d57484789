"""Routing for a mixture of experts: which k of E experts each token goes to, with what
weight, which choices an expert keeps, and how the load is balanced.

What it teaches: two recipes, one function (``queue``), each option one line of it.

* GShard and Switch Transformer (Lepikhin et al. 2020; Fedus et al. 2021): a softmax over
  the E experts, each token's k best, an expert *capacity* ceil(C k T / E) past which a
  choice is dropped (the block's residual carries the token on), and the auxiliary loss
  alpha E sum_i f_i P_i (f_i the share of the choices that pick expert i, P_i its mean
  router probability) that pulls the router toward an even load.
* DeepSeek-V3 (DeepSeek-AI 2024, §2.1.2): sigmoid affinities s_i, the weights of the chosen
  k normalised to sum to 1 (``gate="sigmoid"``); no auxiliary loss for balance but a bias
  b_i per expert added to the scores used to *choose* the k (s_i + b_i), never to the
  weights, and moved after each training step by a fixed step gamma, up for an expert whose
  load is below the mean, down for one above (``balance="bias"``; gamma = 0.001 in §4.2);
  node-limited routing (``max_nodes``: a token's k experts come only from its M best nodes,
  a node scored by the sum of its highest k/M scores; M = 4 there); and no token dropped
  (``capacity_factor=None``: every expert takes every token routed to it, as MegaBlocks,
  Gale et al. 2022, Mixtral and Megatron-Core's default do).

Routing is deterministic: ties between experts (and nodes) go to the lower index, and a
token's place in an expert's queue is set by (its choice rank, its position in the batch),
first choices first, as GShard orders them. The same tokens on one process or on any split
of the experts are routed, kept and dropped alike.

Laptop:  ``python -m lessonlib.models.moe`` routes a random batch with each recipe.
GPU box: the same; routing has no device logic and reads nothing back to the host.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from lessonlib import bug_switches
from lessonlib.argcheck import positive_int, positive_number

AUX_ALPHA = 0.01     # Switch Transformer's alpha
BIAS_STEP = 0.001    # DeepSeek-V3's bias update speed gamma (§4.2, the first 14.3 T tokens)
GATES = ("softmax", "sigmoid")
BALANCES = ("aux", "bias", "none")


def check_routing(n_experts: int, top_k: int, capacity_factor, balance: str = "aux",
                  gate: str = "softmax", bias_step: float = BIAS_STEP, max_nodes=None,
                  experts_per_node=None) -> None:
    """The routing settings, checked (one line each, naming the setting)."""
    if capacity_factor is not None:
        positive_number("capacity_factor", capacity_factor, example="1.25 (None: dropless)")
    for name, value, known in (("balance", balance, BALANCES), ("gate", gate, GATES)):
        if value not in known:
            raise ValueError(f"{name}={value!r} must be one of {', '.join(map(repr, known))}")
    if not (isinstance(bias_step, (int, float)) and 0 <= bias_step < math.inf):
        raise ValueError(f"bias_step={bias_step!r} must be a finite number >= 0 (the bias's "
                         f"move per step), e.g. {BIAS_STEP}")
    if max_nodes is None:
        return
    per_node = positive_int("experts_per_node", experts_per_node, most=n_experts,
                            what="experts on one node, dividing E")
    if n_experts % per_node:
        raise ValueError(f"experts_per_node={per_node} must divide n_experts={n_experts}, "
                         f"e.g. {[d for d in range(1, n_experts + 1) if n_experts % d == 0]}")
    positive_int("max_nodes", max_nodes, most=n_experts // per_node,
                 what="nodes a token's experts may come from, of E/experts_per_node")
    if max_nodes * per_node < top_k:
        raise ValueError(f"max_nodes={max_nodes} nodes of experts_per_node={per_node} hold "
                         f"fewer than top_k={top_k} experts; raise max_nodes")


def capacity(tokens: int, n_experts: int, top_k: int, capacity_factor) -> int | None:
    """GShard's expert capacity: ceil(C k T / E) tokens per expert for a batch of T; None
    when dropless (C = None: no limit)."""
    if capacity_factor is None:
        return None
    return math.ceil(capacity_factor * top_k * tokens / n_experts)


def affinities(logits: torch.Tensor, gate: str) -> torch.Tensor:
    """(T, E) router logits -> (T, E) affinities: a softmax over the E experts (GShard,
    Switch) or each expert's own sigmoid (DeepSeek-V3, eq. 15)."""
    return F.softmax(logits, dim=-1) if gate == "softmax" else torch.sigmoid(logits)


def limit_nodes(scores: torch.Tensor, top_k: int, max_nodes: int,
                experts_per_node: int) -> torch.Tensor:
    """Node-limited routing (DeepSeek-V3 §2.1.2; DeepSeek-V2's device-limited routing):
    experts off a token's M best nodes get -inf, so its k come from M nodes at most. A
    node's score is the sum of its ceil(k/M) highest scores ("the sum of the highest K_r/M
    affinity scores of the experts distributed on each node": 8/4 = 2 there); the scores
    are the ones used to choose, bias included, as DeepSeek's released model code does."""
    T, E = scores.shape
    per_node = scores.view(T, E // experts_per_node, experts_per_node)        # (T, N, E/N)
    best = min(-(-top_k // max_nodes), experts_per_node)
    node_score = per_node.topk(best, dim=-1).values.sum(-1)                    # (T, N)
    nodes = torch.sort(node_score, dim=-1, descending=True, stable=True).indices
    allowed = torch.zeros_like(node_score, dtype=torch.bool)
    allowed.scatter_(1, nodes[:, :max_nodes], True)
    return per_node.masked_fill(~allowed.unsqueeze(-1), -math.inf).view(T, E)  # (T, E)


@dataclass
class Routing:
    """Where a batch's tokens go: the kept (token, expert) choices grouped by expert, in
    queue order, with their gate weights; and what the router's stats say."""
    token: torch.Tensor              # (n,) the token of each kept choice
    gate: torch.Tensor               # (n,) its weight in the combine (in the graph)
    tokens_per_expert: torch.Tensor  # (E,) kept choices per expert (sum n)
    routed_per_expert: torch.Tensor  # (E,) choices per expert before the capacity cut
    aux_loss: torch.Tensor           # scalar, in the graph (zero unless balance="aux")
    capacity: int | None             # None: dropless

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
    capacity: int | None
    tokens: int                      # T


def queue(logits: torch.Tensor, top_k: int, capacity_factor, aux_alpha: float = AUX_ALPHA,
          *, balance: str = "aux", gate: str = "softmax", bias: torch.Tensor | None = None,
          max_nodes: int | None = None, experts_per_node: int | None = None) -> Queue:
    """Top-k gating (GShard Algorithm 1; Switch for k = 1; DeepSeek-V3 §2.1.2 with the
    options): (T, E) logits -> every choice and whether it fits in its expert's queue.
    Softmax weights: k = 1 its router probability (Switch), k >= 2 renormalised over its k
    experts (GShard, Mixtral); sigmoid weights: always renormalised over the k. ``bias``
    (E,) moves the choice only."""
    T, E = logits.shape
    affinity = affinities(logits, gate)                                        # (T, E)
    scores = affinity if bias is None else affinity + bias     # what the k are chosen by
    if max_nodes is not None:
        scores = limit_nodes(scores, top_k, max_nodes, experts_per_node)
    # a stable sort breaks ties toward the lower expert index: the same on every process
    top_e = torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :top_k]
    top_p = affinity.gather(1, top_e)                  # (T, k) weights: no bias in them
    if bug_switches.active("moe_bias_in_combine_weights"):
        top_p = scores.gather(1, top_e)                # the bug: the bias leaks into them
    normalise = top_k > 1 or gate == "sigmoid"
    gates = top_p / top_p.sum(-1, keepdim=True) if normalise else top_p
    # queue order: all first choices (in token order), then all second choices, ...
    expert = top_e.t().reshape(-1)                                             # (k T,)
    choice = F.one_hot(expert, E)                                              # (k T, E)
    place = (choice.cumsum(0) * choice).sum(-1) - 1      # place in its expert's queue
    cap = capacity(T, E, top_k, capacity_factor)
    keep = place < cap if cap is not None else torch.ones_like(place, dtype=torch.bool)
    routed = choice.sum(0)
    return Queue(expert, keep, gates.t().reshape(-1), (choice * keep.unsqueeze(1)).sum(0),
                 routed, balance_loss(affinity, routed, top_k, aux_alpha, balance, gate),
                 cap, T)


def balance_loss(affinity: torch.Tensor, routed: torch.Tensor, top_k: int, aux_alpha: float,
                 balance: str, gate: str) -> torch.Tensor:
    """Switch's alpha E sum_i f_i P_i for ``balance="aux"`` (f_i: expert i's share of the
    k T choices; P_i: its mean affinity, sigmoid affinities first normalised over the E as
    DeepSeek-V3's eq. 18 does); zero (no gradient) for "bias" and "none"."""
    if balance != "aux":
        return affinity.new_zeros(())
    T, E = affinity.shape
    probs = affinity if gate == "softmax" else affinity / affinity.sum(-1, keepdim=True)
    f = routed.to(affinity.dtype) / (top_k * T)
    return aux_alpha * E * (f * probs.mean(0)).sum()


def cut(q: Queue, n: int) -> Routing:
    """The ``n`` kept choices (n: the kept counts' sum, read by the caller), grouped by
    expert in queue order: a stable sort that puts the dropped ones last, so that no size
    depending on the data is read from the device here."""
    dropped_last = q.expert + q.tokens_per_expert.numel() * (~q.keep)
    kept = torch.sort(dropped_last, stable=True).indices[:n]
    return Routing(token=kept % q.tokens, gate=q.gates[kept],
                   tokens_per_expert=q.tokens_per_expert, routed_per_expert=q.routed_per_expert,
                   aux_loss=q.aux_loss, capacity=q.capacity)


def route(logits: torch.Tensor, top_k: int, capacity_factor, aux_alpha: float = AUX_ALPHA,
          **options) -> Routing:
    """``queue``, then the capacity ``cut``: (T, E) logits -> ``Routing``."""
    q = queue(logits, top_k, capacity_factor, aux_alpha, **options)
    return cut(q, int(q.tokens_per_expert.sum()))


def bias_update(bias: torch.Tensor, load: torch.Tensor, bias_step: float) -> torch.Tensor:
    """DeepSeek-V3's auxiliary-loss-free balancing, one step: each expert's bias moves by
    ``bias_step`` up if its load (choices routed to it over the whole batch) is below the
    mean load, down if above, not at all if equal: b_i + gamma sign(mean - load_i)."""
    load = torch.as_tensor(load, device=bias.device).to(bias.dtype)           # (E,)
    direction = torch.sign(load.mean() - load)
    if bug_switches.active("moe_bias_update_sign_flipped"):
        direction = -direction          # the bug: the busiest expert is made busier
    return bias + bias_step * direction
