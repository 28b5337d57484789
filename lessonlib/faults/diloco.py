"""DiLoCo and Streaming DiLoCo: replicas that talk H times less.

What it teaches: between datacenters the link is slow, so a replica cannot average its
gradients every step. DiLoCo (Douillard et al. 2023, arXiv 2311.08105) lets each replica
take H inner steps with its own AdamW, then averages the *pseudo-gradient* (the weights the
replicas started from minus where each ended) and takes one outer step with Nesterov
momentum from the common start: one average of the weights every H steps instead of one
of the gradients every step. Streaming DiLoCo (Douillard et al. 2025, arXiv 2501.18512)
cuts the model into F fragments and syncs one fragment every H/F steps, in turn, so each
sync sends 1/F of the weights and the rest of the model keeps training.

``StreamingDiLoCo`` is the algorithm in a few lines (F = 1 is plain DiLoCo), called after
each inner optimizer step; ``average`` is the all-reduce mean over the replicas (``comm``,
so the ledger counts its bytes). torchft's ``torchft.local_sgd.DiLoCo`` is the same
algorithm inside a fault-tolerant Manager: ``lessonlib.faults.diloco_runs`` runs both on the
same seeds and compares them.

Laptop:  ``python -c "from lessonlib.faults import diloco_runs as d; print(d.compare_bytes())"``
GPU box: the same.
"""
from __future__ import annotations

import torch
from torch import nn


def fragments(model: nn.Module, count: int) -> list[nn.ModuleList]:
    """The model's parts (``model.parts()``: embedding, blocks, head) in ``count`` contiguous
    fragments, as Streaming DiLoCo cuts a model by layers."""
    parts = model.parts()
    if not 1 <= count <= len(parts):
        raise ValueError(f"fragments={count}: the model has {len(parts)} parts; "
                         f"choose 1..{len(parts)}")
    cuts = [round(i * len(parts) / count) for i in range(count + 1)]
    return [nn.ModuleList(parts[a:b]) for a, b in zip(cuts, cuts[1:])]


def outer_optimizer(module: nn.Module) -> torch.optim.Optimizer:
    """DiLoCo's outer optimizer: SGD with Nesterov momentum (the paper's lr 0.7, momentum 0.9)."""
    return torch.optim.SGD(module.parameters(), lr=0.7, momentum=0.9, nesterov=True)


class StreamingDiLoCo:
    """Call ``step()`` after every inner optimizer step. Every ``sync_every / F`` steps the
    next fragment in turn is synchronized: its pseudo-gradient ``anchor - weights``
    averaged over the replicas, the weights put back to the anchor, one outer step."""

    def __init__(self, parts: list[nn.Module], outer: list[torch.optim.Optimizer],
                 sync_every: int, average):
        if sync_every % len(parts):
            raise ValueError(f"sync_every={sync_every} must be a multiple of the "
                             f"{len(parts)} fragments")
        self.params = [list(part.parameters()) for part in parts]
        self.outer, self.average = outer, average
        self.every = sync_every // len(parts)
        self.anchor = [[p.detach().clone() for p in ps] for ps in self.params]  # where it started
        self.inner_steps = self.syncs = 0

    @torch.no_grad()
    def step(self) -> None:
        self.inner_steps += 1
        if self.inner_steps % self.every:
            return
        f = self.syncs % len(self.params)        # fragments take turns
        self.syncs += 1
        pseudo = [a - p for a, p in zip(self.anchor[f], self.params[f])]
        self.average(pseudo)                     # the only communication: 1/F of the weights
        for p, a, g in zip(self.params[f], self.anchor[f], pseudo):
            p.copy_(a)
            p.grad = g
        self.outer[f].step()                     # Nesterov from the common start
        self.outer[f].zero_grad()
        self.anchor[f] = [p.detach().clone() for p in self.params[f]]
