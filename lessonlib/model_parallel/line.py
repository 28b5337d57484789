"""The assembly line: a model's layers split over p ranks, one batch in flight.

What it teaches: stage s holds a contiguous run of layers; ``stage_step`` is all a rank does
with a batch: receive the activation from the stage before, forward, send it on; receive the
gradient of its output, backward, send the gradient of its input back. The last stage
computes the loss instead of receiving a gradient. ``assembly_line`` runs that on every rank
for a few SGD steps, handing ``stage_step`` a ``LineRecorder``'s ``record`` so that each phase
is one span of the rank's timeline (see ``lessonlib.model_parallel`` for the lesson).

Laptop:  ``python -c "from lessonlib import model_parallel as mp;
         print(mp.summarize(mp.run_assembly_line(4, model='mlp')))"``
GPU box: the same call runs one stage per GPU over NCCL; under torchrun use ``lessonlib.run``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from lessonlib import comm, device
from lessonlib.argcheck import positive_int
from lessonlib.data import corpus_tokens, lm_batch, regression_batch
from lessonlib.instruments import ledger, placement
from lessonlib.instruments.breadcrumbs import progress
from lessonlib.instruments.spans import no_record
from lessonlib.launcher import launch
from lessonlib.layer_split import split_layers, split_summary
from lessonlib.model_parallel.recorder import LineRecorder
from lessonlib.models import TinyGPT, corpus_config, lm_loss, mlp_stack

MODEL_KINDS = ("gpt", "mlp")


# ---------------------------------------------------------------- the model and its data
def make_model(model: str = "gpt", seed: int = 0, layers: int = 6, hidden: int = 64,
               width: int = 128) -> nn.Module:
    """"gpt": a TinyGPT on the castle corpus (L = ``layers``); "mlp": ``mlp_stack`` of
    ``layers`` Linear+GeLU layers of ``width``. Same seed, same weights, in every process."""
    if model not in MODEL_KINDS:
        raise ValueError(f"model={model!r} must be one of {MODEL_KINDS}")
    if model == "gpt":
        return TinyGPT(corpus_config(seq=32, hidden=hidden, heads=4, layers=layers), seed)
    return mlp_stack(width, layers, seed)


def make_batch(model: str, step: int, batch: int, seed: int = 0, width: int = 128, **_):
    """Batch ``step`` (inputs, targets): the same in every process for the same seed."""
    if model == "gpt":
        tokens, _ = corpus_tokens()
        return lm_batch(tokens, batch, 32, step, seed)                 # (b, s), (b, s)
    return regression_batch(batch, width, step, seed)                   # (b, width) x 2


def loss_of(model: str, out, targets):
    return lm_loss(out, targets) if model == "gpt" else F.mse_loss(out, targets)


def boundary_shape(model: str, batch: int, hidden: int = 64, width: int = 128, **_):
    """Shape of the activation that crosses every stage boundary."""
    return (batch, 32, hidden) if model == "gpt" else (batch, width)   # (b, s, h) or (b, w)


# ---------------------------------------------------------------- the assembly line
def _n_layers(model: str, layers: int = 6, **_) -> int:
    return layers + 2 if model == "gpt" else layers      # a GPT adds embed and head


def check_line(world_size: int, p: int | None = None, model: str = "gpt",
                   steps: int = 3, warmup: int = 1, batch: int = 8, lines: int | None = None,
                   **shape) -> int:
    """Raise ValueError naming the setting before any process starts; return p."""
    if model not in MODEL_KINDS:
        raise ValueError(f"model={model!r} must be one of {MODEL_KINDS}")
    p = world_size if p is None else p
    for name, value in (("p", p), ("steps", steps), ("batch", batch)):
        positive_int(name, value)
    if not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup={warmup!r} must be 0 or a positive integer")
    if lines is not None:
        bad = isinstance(lines, bool) or not isinstance(lines, int)
        if bad or not 1 <= lines * p <= world_size:
            raise ValueError(f"lines={lines!r} lines of p={p} ranks do not fit a world of "
                             f"{world_size} ranks; use p <= {world_size} and lines in "
                             f"1..{max(world_size // p, 1)}")
    elif world_size % p:
        raise ValueError(f"p={p} stages must divide the world size {world_size} (ranks form "
                         f"lines of p consecutive ranks); use p in "
                         f"{[d for d in range(1, world_size + 1) if world_size % d == 0]}")
    n = _n_layers(model, **shape)
    if p > n:
        raise ValueError(f"p={p} stages but the {model} has {n} layers to cut between; every "
                         f"stage needs at least one: use p <= {n} or more layers")
    return p


def run_assembly_line(world_size: int, p: int | None = None, timeout: float = 120, **settings):
    """Check the settings here, then launch ``assembly_line`` on ``world_size`` ranks."""
    check_line(world_size, p, **settings)
    return launch(assembly_line, world_size, p=p, timeout=timeout, **settings)


@dataclass
class LineResult:
    """One rank's ``assembly_line``: its stage (None: a rank outside every line) of p, its
    layers, the timeline and per-op message summary of the timed steps, the losses (the
    last stage's), its parameter and stashed activation bytes, and its final weights by the
    one-process model's names."""
    rank: int
    stage: int | None
    p: int
    layers: list = field(default_factory=list)
    timeline: list = field(default_factory=list)
    losses: list = field(default_factory=list)
    messages: dict = field(default_factory=dict)
    param_bytes: int = 0
    stash_bytes: int = 0
    state: dict = field(default_factory=dict, repr=False)


def assembly_line(model: str = "gpt", p: int | None = None, steps: int = 3, warmup: int = 1,
                  batch: int = 8, lr: float = 0.05, seed: int = 0, lines: int | None = None,
                  **shape) -> LineResult:
    """Train ``make_model(model, seed, **shape)`` split over p ranks for warmup + steps SGD
    steps; return this rank's stage, timeline and messages of the timed steps, memory and
    final weights. Ranks outside the first ``lines`` lines return ``stage`` None."""
    rank = dist.get_rank()
    p = check_line(dist.get_world_size(), p, model, steps, warmup, batch, lines, **shape)
    stage, dev = rank % p, device.current_device()
    if lines is not None and rank >= lines * p:   # sit out, but join the clock's collectives
        LineRecorder(dev).start_aligned()
        return LineResult(rank, None, p)
    full = make_model(model, seed, **shape)
    layer_ids = split_summary(full, p)[stage].layers
    part = split_layers(full, p)[stage].to(dev)   # keep this stage's layers ...
    del full                                      # ... and let the rest go
    opt = torch.optim.SGD(part.parameters(), lr=lr)
    recorder = LineRecorder(dev, part.parameters())
    dtype = next(q.dtype for q in part.parameters() if q.is_floating_point())   # the stage's
    act = torch.empty(boundary_shape(model, batch, **shape), dtype=dtype, device=dev)  # (b, s, h)/(b, w)
    # every rank can make every batch (same seed); made up front so the timeline is all work
    batches = [tuple(z.to(dev) for z in make_batch(model, step, batch, seed, **shape))
               for step in range(warmup + steps)]
    losses, book = [], ledger.Ledger()
    for step, (inputs, targets) in enumerate(batches):
        if step == warmup:                        # line the ranks up, restart the clock
            recorder.start_aligned()
        progress(f"assembly line step {step}, stage {stage}")
        record = recorder.for_step(step)
        with placement.timed(step, warmup):           # the audit off while the clock runs
            with comm.ledger() as messages:
                loss = stage_step(part, (inputs, targets), act, (stage, p), model, record)
            with record("OPT"):
                opt.step()
                opt.zero_grad(set_to_none=True)
        if step >= warmup:
            book.events += messages.events
        if loss is not None:
            losses.append(loss)
    spans, stash_bytes = recorder.read()
    names = {f"{layer_ids[int(n.split('.', 1)[0])]}.{n.split('.', 1)[1]}": t.detach()
             for n, t in part.state_dict().items()}
    return LineResult(rank, stage, p, layer_ids, spans, losses, book.summary(),
                      sum(t.numel() * t.element_size() for t in part.parameters()),
                      stash_bytes, names)


def stage_step(part, batch, act, where, model, record=no_record):
    """One batch through this stage: receive, forward, send on; receive the gradient,
    backward, send it back. The loss on the last stage, else None. Peers are global ranks;
    ``record(phase)`` scopes each phase (records nothing by default)."""
    (inputs, targets), (stage, p) = batch, where
    rank, first, last = dist.get_rank(), stage == 0, stage == p - 1
    if not first:
        with record("RECV_F"):
            comm.recv(act, src=rank - 1)
        inputs = act.clone().requires_grad_()
    with record("F"):
        out = part(inputs)
    loss = loss_of(model, out, targets) if last else None
    if last:
        with record("B"):
            loss.backward()
    else:
        with record("SEND_F"):
            comm.send(_outgoing(out, act, stage), dst=rank + 1)
        grad = torch.empty_like(out)
        with record("RECV_B"):
            comm.recv(grad, src=rank + 1)
        with record("B"):
            out.backward(grad)
    if not first:
        with record("SEND_B"):
            comm.send(inputs.grad, dst=rank - 1)
    return None if loss is None else loss.item()


def _outgoing(out, act, stage: int) -> torch.Tensor:
    """The activation to send on, in the dtype every stage's receive buffer has (NCCL would
    garble another)."""
    if out.dtype != act.dtype:
        raise ValueError(f"stage {stage} sends {out.dtype} but stages exchange {act.dtype}; "
                         f"give every stage the same dtype")
    return out.detach().contiguous()
