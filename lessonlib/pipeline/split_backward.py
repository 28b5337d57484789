"""The backward in two halves: B, the input gradient now; W, the weight gradients later.

What it teaches: a layer y = x A^T + b has two gradients to compute in its backward,
dx = dy A (the previous stage waits for it) and dA = dy^T x (nobody waits for it). Autograd
can be asked for them separately (the pattern of PyTorch's ``pipelining/_backward.py``):

* ``input_grad`` (B): ``torch.autograd.grad`` of the stage output with respect to the stage
  input *and* to the output y of every layer that owns weights. Autograd runs only what
  those need, so no weight gradient is computed; the graph is kept (``retain_graph``),
  and with it everything each layer saved, which is what W still needs. That kept state is
  what the stash meter keeps counting until W.
* ``weight_grad`` (W): for each such layer, the gradient of its y with respect to its own
  weights only (``torch.autograd.grad(y, its parameters, dy)``): one step of the chain,
  the layer's own, since the rest of the gradient is already in dy. Gradients accumulate in
  ``.grad`` as a whole backward would put them there.

``LayerOutputs`` finds those y: a forward hook on every module that holds parameters of its
own records what it returned while ``recording()`` is open.

Laptop:  ``python -m lessonlib.pipeline.split_backward`` checks B + W against one backward.
GPU box: the same.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn


class LayerOutputs:
    """Records (module, output) of every module of ``model`` that owns parameters."""

    def __init__(self, model: nn.Module):
        self.recorded: list | None = None
        for module in model.modules():
            if any(True for _ in module.parameters(recurse=False)):
                module.register_forward_hook(self._hook)

    def _hook(self, module, args, output):
        if self.recorded is not None and isinstance(output, torch.Tensor) \
                and output.requires_grad:
            self.recorded.append((module, output))

    @contextmanager
    def recording(self):
        self.recorded = []
        try:
            yield self.recorded
        finally:
            self.recorded = None


def input_grad(out, grad_out, x, layers) -> tuple[torch.Tensor | None, list]:
    """B: the gradient of ``out`` (a loss if ``grad_out`` is None) with respect to the stage
    input ``x`` (None if it needs none), and what W needs: (module, y, dy) per layer."""
    inputs = ([x] if x is not None and x.requires_grad else []) + [y for _, y in layers]
    if not inputs:
        return None, []
    grads = torch.autograd.grad(out, inputs, grad_out, retain_graph=True, allow_unused=True)
    dx = grads[0] if x is not None and x.requires_grad else None
    dys = grads[len(inputs) - len(layers):]
    return dx, [(mod, y, dy) for (mod, y), dy in zip(layers, dys) if dy is not None]


def weight_grad(kept: list) -> None:
    """W: each layer's weight gradients from its kept dy, accumulated into ``.grad``."""
    for module, y, dy in kept:
        params = list(module.parameters(recurse=False))
        for q, g in zip(params, torch.autograd.grad(y, params, dy, retain_graph=True)):
            q.grad = g if q.grad is None else q.grad.add_(g)


if __name__ == "__main__":
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    x = torch.randn(5, 8, requires_grad=True)
    net(x).square().sum().backward()
    want = [q.grad.clone() for q in net.parameters()] + [x.grad.clone()]
    net.zero_grad()
    x.grad = None
    outputs = LayerOutputs(net)
    with outputs.recording() as layers:
        out = net(x).square().sum()
    dx, kept = input_grad(out, None, x, layers)
    print("after B, weight grads:", [q.grad for q in net.parameters()])
    weight_grad(kept)
    got = [q.grad for q in net.parameters()] + [dx]
    print("B + W equal one backward:", all(torch.allclose(a, b) for a, b in zip(got, want)))
