"""Naive model parallelism: a model's layers split over p ranks, run as an assembly line.

What it teaches: when a model does not fit on one device, the simplest split gives each of
p ranks a contiguous run of layers (a *stage*, a room of the castle). The forward pass is an
assembly line: stage 0 runs its layers and sends the activation to stage 1, which waits for
it, runs, sends on; the last stage computes the loss and the backward pass runs the line in
reverse, each stage sending the gradient of its input back upstream. Memory per rank drops
to about 1/p of the parameters, but only one rank works at a time: with balanced stages each
rank idles (p-1)/p of the step. Pipeline parallelism (GPipe, Huang et al. 2019) fixes that
by cutting the batch into micro-batches; this module is the m = 1 case it starts from.

``assembly_line`` runs on the ranks and records, per rank, a timeline of ``Span`` s (forward
F, backward B, waiting for a message RECV_F / RECV_B, sending SEND_F / SEND_B, optimizer OPT)
in seconds from a barrier that lines the ranks up, the bytes of parameters it holds, and the
bytes of activations autograd kept for its backward pass. All ranks measure from one origin
on the wall clock (the earliest rank's time after the barrier), so on one machine their
timelines line up exactly; across machines, as well as their clocks agree.
``single_process`` trains the same model on the same batches in one process; ``parity``
compares the two.

Every message goes through ``lessonlib.comm`` (p2p ``dst``/``src`` are global ranks). With a
world of n ranks and p dividing n, ranks form n/p independent lines of p consecutive ranks;
``lines=k`` runs only the first k lines (k x p <= n) and the other ranks sit the run out, so
one launch can measure every p from 1 to n without idle lines competing for the cores.
``line_record`` turns one line's results into the numbers ``labs/mp.py`` stores.

Laptop:  ``python -c "from lessonlib import model_parallel as mp;
         print(mp.summarize(mp.run_assembly_line(4, model='mlp')))"``
GPU box: the same call runs one stage per GPU over NCCL; under torchrun use ``lessonlib.run``.
"""
from __future__ import annotations

import statistics
from contextlib import contextmanager, nullcontext
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from lessonlib import comm, device
from lessonlib.instruments import ledger, placement
from lessonlib.argcheck import positive_int
from lessonlib.baseline import train_one_process
from lessonlib.instruments.breadcrumbs import progress
from lessonlib.costmodel import bubble_fraction
from lessonlib.data import corpus_tokens, lm_batch, regression_batch
from lessonlib.launcher import launch
from lessonlib.layer_split import layers_of, split_layers, split_summary
from lessonlib.models import TinyGPT, corpus_config, lm_loss, mlp_stack
from lessonlib.instruments.spans import Span, Timeline, no_record
from lessonlib.instruments.stash import StashMeter

MODEL_KINDS = ("gpt", "mlp")
BUSY = ("F", "B", "OPT")


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
def _start_aligned(timeline: Timeline, dev) -> None:
    """Start ``timeline`` on a clock all ranks share: after a barrier, the earliest rank's
    wall-clock reading is everyone's zero (on one machine the ranks' spans line up exactly;
    across machines, as well as their clocks agree)."""
    comm.barrier()
    device.synchronize(dev)
    wall = time.time()
    timeline.start()
    earliest = torch.tensor([wall], dtype=torch.float64, device=dev)
    comm.all_reduce(earliest, op=dist.ReduceOp.MIN)
    timeline.origin = wall - earliest.item()


def _recorder(timeline: Timeline, meter: StashMeter, step: int):
    """The assembly line's recorder for one step: each phase one span of ``timeline`` (the
    spans tile the step), and what the forward saves for backward counted by ``meter``."""
    @contextmanager
    def record(phase: str):
        with timeline.span(phase, 0, 0, step), meter.forward() if phase == "F" else nullcontext():
            yield
    return record


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


def assembly_line(model: str = "gpt", p: int | None = None, steps: int = 3, warmup: int = 1,
                  batch: int = 8, lr: float = 0.05, seed: int = 0, lines: int | None = None,
                  **shape) -> dict:
    """Train ``make_model(model, seed, **shape)`` split over p ranks for warmup + steps SGD
    steps; return this rank's stage, timeline and messages of the timed steps, memory and
    final weights. Ranks outside the first ``lines`` lines return ``stage`` None."""
    rank = dist.get_rank()
    p = check_line(dist.get_world_size(), p, model, steps, warmup, batch, lines, **shape)
    stage, dev = rank % p, device.current_device()
    timeline = Timeline(dev, contiguous=True)
    if lines is not None and rank >= lines * p:   # sit out, but join the clock's collectives
        _start_aligned(timeline, dev)
        return {"rank": rank, "stage": None, "p": p}
    full = make_model(model, seed, **shape)
    layer_ids = split_summary(full, p)[stage]["layers"]
    part = split_layers(full, p)[stage].to(dev)   # keep this stage's layers ...
    del full                                      # ... and let the rest go
    opt = torch.optim.SGD(part.parameters(), lr=lr)
    meter = StashMeter(part.parameters())
    dtype = next(q.dtype for q in part.parameters() if q.is_floating_point())   # the stage's
    act = torch.empty(boundary_shape(model, batch, **shape), dtype=dtype, device=dev)  # (b, s, h)/(b, w)
    # every rank can make every batch (same seed); made up front so the timeline is all work
    batches = [tuple(z.to(dev) for z in make_batch(model, step, batch, seed, **shape))
               for step in range(warmup + steps)]
    losses, book = [], ledger.Ledger()
    for step, (inputs, targets) in enumerate(batches):
        if step == warmup:                        # line the ranks up, restart the clock
            _start_aligned(timeline, dev)
        progress(f"assembly line step {step}, stage {stage}")
        timeline.mark()
        record = _recorder(timeline, meter, step)
        with placement.timed(step, warmup):           # the audit off while the clock runs
            with comm.ledger() as messages:
                loss = _step(part, (inputs, targets), act, (stage, p), model, record)
            with record("OPT"):
                opt.step()
                opt.zero_grad(set_to_none=True)
        if step >= warmup:
            book.events += messages.events
        if loss is not None:
            losses.append(loss)
    names = {f"{layer_ids[int(n.split('.', 1)[0])]}.{n.split('.', 1)[1]}": t.detach()
             for n, t in part.state_dict().items()}
    return {"rank": rank, "stage": stage, "p": p, "layers": layer_ids,
            "timeline": timeline.read()[0], "losses": losses, "messages": book.summary(),
            "param_bytes": sum(t.numel() * t.element_size() for t in part.parameters()),
            "stash_bytes": meter.peak_bytes, "state": names}


def _step(part, batch, act, where, model, record=no_record):
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


# ---------------------------------------------------------------- one process, and the checks
def single_process(model: str = "gpt", steps: int = 3, warmup: int = 1, batch: int = 8,
                   lr: float = 0.05, seed: int = 0, **shape) -> dict:
    """The same training on one process: the reference for ``parity``."""
    net = nn.Sequential(*layers_of(make_model(model, seed, **shape)))
    run = train_one_process(net, lambda step: make_batch(model, step, batch, seed, **shape),
                            warmup + steps, lambda out, y: loss_of(model, out, y), lr=lr)
    return {"losses": run["losses"], "state": {n: t.detach() for n, t in net.state_dict().items()},
            "param_bytes": sum(t.numel() * t.element_size() for t in net.parameters())}


def parity(results: list[dict], reference: dict) -> dict:
    """Largest differences between one assembly line (``results[0]``'s) and one process:
    the losses, and every weight after the last step."""
    line = _line(results)
    state = {n: t for r in line for n, t in r["state"].items()}
    ref = reference["state"]
    if set(state) != set(ref):
        raise ValueError(f"the stages hold {sorted(state)} but one process holds {sorted(ref)}")
    weights = max((state[n] - ref[n]).abs().max().item() for n in ref)
    ours = line[-1]["losses"]
    loss = max(abs(a - b) for a, b in zip(ours, reference["losses"]))
    return {"loss_max_abs_diff": loss, "weights_max_abs_diff": weights}


def _line(results: list[dict]) -> list[dict]:
    """The results of the line that ``results[0]`` belongs to, in stage order."""
    p, base = results[0]["p"], results[0]["rank"] // results[0]["p"]
    return sorted((r for r in results if r["rank"] // p == base), key=lambda r: r["stage"])


def idle_fraction(timeline: list[Span], wall: float) -> float:
    """Share of ``wall`` seconds in which this rank did no work (no F, B or OPT)."""
    busy = sum(x.end - x.start for x in timeline if x.kind in BUSY)
    return 1.0 - busy / wall if wall > 0 else 0.0


def summarize(results: list[dict]) -> list[dict]:
    """One row per rank of ``results[0]``'s line: stage, layers, parameter and activation bytes,
    busy seconds, and idle share of the wall time, measured and predicted ((p-1)/p)."""
    line = _line(results)
    wall = max(x.end for r in line for x in r["timeline"])
    p = len(line)
    return [{"stage": r["stage"], "layers": r["layers"], "param_bytes": r["param_bytes"],
             "stash_bytes": r["stash_bytes"],
             "busy_s": sum(x.end - x.start for x in r["timeline"] if x.kind in BUSY),
             "idle_measured": idle_fraction(r["timeline"], wall),
             "idle_predicted": (p - 1) / p} for r in line]


def line_record(results: list[dict]) -> dict:
    """``results[0]``'s line as one row: idle share per rank and its mean next to the
    predicted (p-1)/p, the median step time (first span of a step to its last, over the
    line), and parameter, activation and busy figures per rank in stage order."""
    rows, line = summarize(results), _line(results)
    p, steps = len(line), sorted({s.step for r in line for s in r["timeline"]})
    spans = [[s for r in line for s in r["timeline"] if s.step == k] for k in steps]
    times = [max(s.end for s in x) - min(s.start for s in x) for x in spans]
    idle = [r["idle_measured"] for r in rows]
    return {"p": p, "idle_per_rank": idle, "idle_mean": sum(idle) / p,
            "idle_predicted": bubble_fraction(p, 1), "step_time_s": statistics.median(times),
            "step_times_s": times, "busy_s_per_rank": [r["busy_s"] for r in rows],
            "param_bytes_per_rank": [r["param_bytes"] for r in rows],
            "stash_bytes_per_rank": [r["stash_bytes"] for r in rows]}
