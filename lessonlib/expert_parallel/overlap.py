"""DualPipe's overlap in the MoE GPT: one micro-batch's all-to-alls behind the other's compute.

What it teaches: DeepSeek-V3's DualPipe (§3.2.1) runs the forward chunk of one micro-batch
beside the backward chunk of another, each cut into attention, all-to-all dispatch, MLP and
all-to-all combine, and orders the pieces so that the all-to-alls of one are in flight
while the other computes. Here one block of the MoE GPT (``lessonlib.models.moe_gpt``, its
MoE layer made expert-parallel by ``expert_parallel``) is cut at its two all-to-alls:

    attention: x -> x + attn(ln1(x)); route ln2 of it, exchange the counts, gather the rows
    experts:   the rows that arrived -> this rank's E/e experts
    combine:   the rows that came back -> gated sum + shared expert + residual, the loss

Each piece runs on detached inputs, so its backward runs on its own with the gradient
the next piece sent back (as a pipeline stage's does). ``forward_backward`` runs the
forward of micro-batch A beside the backward of micro-batch B in DeepSeek's order (its
Figure 4, with the attention and MLP backward left whole, not split into input and weight
gradients):

    combine backward(B)    post B's combine-backward all-to-all
    attention(A)           behind it; post A's dispatch
    experts backward(B)    behind A's dispatch; post B's dispatch-backward
    experts(A)             behind B's dispatch-backward; post A's combine
    attention backward(B)  behind A's combine
    combine(A)

The backward of an all-to-all is the all-to-all with the splits swapped (``dispatch``).
With ``overlap=False`` every all-to-all is waited for as soon as it is posted: the same
arithmetic in the same order, so both are equal to the bit, only the waits move. On CPU
ranks gloo runs an asynchronous collective on its own thread, so a transfer does go on
while the rank computes. Not hidden: the counts exchange (a small blocking all-to-all in
attention, the forward's one read to the host), and whatever a transfer takes beyond the
compute beside it. Every all-to-all goes on the one expert-parallel group, in an order
fixed by the schedule, the same on every rank: one communicator, which NCCL allows
several collectives in flight on (``nccl_rules.nccl_hazards`` checks the trace).

Laptop:  ``python -c "import lessonlib.expert_parallel.overlap_runs as o; print(o.run_overlap())"``
GPU box: the same call; under NCCL a wait orders the streams, and the exposed time is read
from CUDA events (``lessonlib.instruments.ledger``).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from lessonlib.expert_parallel.dispatch import Splits, exchange_counts, post_all_to_all
from lessonlib.expert_parallel.layer import run_local_experts
from lessonlib.models.moe import combine as gated_sum
from lessonlib.models.moe_routing import Routing, cut, queue


@dataclass
class Trip:
    """One micro-batch's way through the block: each piece's input (a leaf) and outputs,
    kept for that piece's backward."""
    x: torch.Tensor                    # (b, s, h) the block's input
    splits: Splits
    routing: Routing
    routed: torch.Tensor               # (n, h) the rows to dispatch, in attention's graph
    carried: list                      # what combine takes from attention: mid, gate, shared
    received: torch.Tensor = None      # (m, h) the rows that arrived
    expert_out: torch.Tensor = None    # (m, h)
    returned: torch.Tensor = None      # (n, h) the rows that came back
    leaves: list = None                # ``carried``, detached, as combine's inputs
    out: torch.Tensor = None           # (b, s, h)
    loss: torch.Tensor = None


def _leaf(t):
    return None if t is None else t.detach().requires_grad_(t.requires_grad)


def attention(block, x: torch.Tensor) -> Trip:
    """Attention and routing: the block's input to the rows its experts' ranks need."""
    moe, (b, s, h) = block.mlp, x.shape
    x = x.detach().requires_grad_()
    mid = x + block.attn(block.ln1(x))                                          # (b, s, h)
    tokens = block.ln2(mid).reshape(b * s, h)                                   # (T, h)
    choices = queue(moe.router(tokens), moe.top_k, moe.capacity_factor, moe.aux_alpha,
                    **moe.routing_options())
    splits = exchange_counts(choices.tokens_per_expert, choices.routed_per_expert, moe.group)
    routing = cut(choices, sum(splits.send))
    shared = moe.shared(tokens) if moe.shared is not None else None            # (T, h)
    return Trip(x, splits, routing, tokens[routing.token], [mid, routing.gate, shared])


def experts(block, trip: Trip, received: torch.Tensor) -> None:
    trip.received = received.requires_grad_()                                   # (m, h)
    trip.expert_out = run_local_experts(block.mlp.experts, trip.received, trip.splits)


def combine(trip: Trip, returned: torch.Tensor, y: torch.Tensor) -> None:
    """The rows back in place, the residual, and the loss: mean squared error to ``y``
    plus the auxiliary loss (added in attention's backward, where its graph is)."""
    trip.returned, trip.leaves = returned.requires_grad_(), [_leaf(t) for t in trip.carried]
    mid, gate, shared = trip.leaves
    tokens = mid.shape[0] * mid.shape[1]
    out = gated_sum(trip.returned, dataclasses.replace(trip.routing, gate=gate), tokens)  # (T, h)
    if shared is not None:
        out = out + shared
    trip.out = mid + out.view(mid.shape)                                        # (b, s, h)
    trip.loss = F.mse_loss(trip.out, y)


def combine_backward(trip: Trip) -> torch.Tensor:
    trip.loss.backward()
    return trip.returned.grad                                                   # (n, h)


def experts_backward(trip: Trip, grad: torch.Tensor) -> torch.Tensor:
    trip.expert_out.backward(grad)
    return trip.received.grad                                                   # (m, h)


def attention_backward(trip: Trip, grad_routed: torch.Tensor) -> None:
    aux = trip.routing.aux_loss
    pairs = [(trip.routed, grad_routed), (aux, torch.ones_like(aux))] + [
        (out, leaf.grad) for out, leaf in zip(trip.carried, trip.leaves) if leaf is not None]
    pairs = [(out, g) for out, g in pairs if out.requires_grad and g is not None]
    torch.autograd.backward([out for out, _ in pairs], [g for _, g in pairs])


def _post(x, recv, send, group, overlap: bool):
    """Post an all-to-all; a function that waits for it and returns what arrived. Without
    ``overlap`` it is waited for here, before anything else runs."""
    out, work = post_all_to_all(x, recv, send, group)
    if not overlap:
        work.wait()
        return lambda: out
    return lambda: (work.wait(), out)[1]


def forward(block, x, y) -> Trip:
    """Micro-batch (x, y) through the block alone, each all-to-all waited for at once."""
    trip, group = attention(block, x), block.mlp.group
    experts(block, trip, _post(trip.routed.detach(), trip.splits.recv, trip.splits.send,
                               group, False)())
    combine(trip, _post(trip.expert_out.detach(), trip.splits.send, trip.splits.recv,
                        group, False)(), y)
    return trip


def backward(block, trip: Trip) -> None:
    """``trip``'s backward alone: its gradients into the block's ``.grad`` and ``trip.x``."""
    sp, group = trip.splits, block.mlp.group
    grad = _post(combine_backward(trip), sp.recv, sp.send, group, False)()
    attention_backward(trip, _post(experts_backward(trip, grad), sp.send, sp.recv, group,
                                   False)())


def forward_backward(block, x, y, trip: Trip, overlap: bool = True) -> Trip:
    """DualPipe's F&B slot on one MoE block: the forward of micro-batch (x, y) beside the
    backward of the earlier ``trip``, each all-to-all of one behind a piece of the other's
    compute (see the module docstring); returns the forward's ``Trip``."""
    sp, group = trip.splits, block.mlp.group
    back_combine = _post(combine_backward(trip), sp.recv, sp.send, group, overlap)
    a = attention(block, x)
    dispatch = _post(a.routed.detach(), a.splits.recv, a.splits.send, group, overlap)
    back_dispatch = _post(experts_backward(trip, back_combine()), sp.send, sp.recv, group,
                          overlap)
    experts(block, a, dispatch())
    returned = _post(a.expert_out.detach(), a.splits.send, a.splits.recv, group, overlap)
    attention_backward(trip, back_dispatch())
    combine(a, returned(), y)
    return a
