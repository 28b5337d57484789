"""A bug zoo: switches that bring back real bugs of distributed training, and the checks
that catch them.

What it teaches: every bug here is one that teams building data, tensor and pipeline
parallelism have shipped at some point, and each is caught by one kind of check: parity
with one process (outputs, input gradients, weight gradients), or counting what each rank
holds and sends. One bug (a layer left unsharded) passes every parity test: parity is not
enough, the memory and the messages must be checked too.

Each bug is one commented ``if bugzoo.active("<name>"):`` in the real code, off
unless the environment variable ``LESSONLIB_BUGS`` names it (comma-separated). ``active``
reads the variable when the code runs, so ranks started by ``lessonlib.launch`` (spawn
copies the environment at start) see the switch their caller set. ``BUGS`` says, per bug,
what it is, where its line lives, the symptom, the check and the test that catches it.

Laptop:  ``python -c "from lessonlib import bugzoo as z;
         print(z.check('pipeline_loss_unscaled', True))"``
         or ``LESSONLIB_BUGS=pipeline_loss_unscaled python -m pytest tests/test_pipeline_parity.py``
GPU box: the same; ``check`` launches on NCCL when 2 GPUs are visible.
"""
from __future__ import annotations

import math
import os
from contextlib import contextmanager
from dataclasses import dataclass

ENV = "LESSONLIB_BUGS"


@dataclass(frozen=True)
class Bug:
    name: str
    what: str       # the bug, in the field's words
    where: str      # module.function holding its one-line switch
    symptom: str
    check: str      # the check that catches it
    test: str       # the pytest node that fails with the switch on


BUGS = {b.name: b for b in (
    Bug("tp_missing_backward_all_reduce",
        "Megatron's f operator (identity forward) skips its backward all-reduce: a missing "
        "g in backward, since the all-reduce the backward pass needs is g's conjugate, f's "
        "backward. Each rank keeps its own partial sum as the input gradient of the "
        "column-parallel layer.",
        "lessonlib.tp_ops._CopyToTP.backward",
        "forward outputs still match the dense model (that is what makes it sneaky); the "
        "input gradient, and so every gradient upstream, is wrong",
        "input gradient of a tensor-parallel MLP vs the dense MLP",
        "tests/test_tensor_parallel.py::test_parity_with_the_dense_model[mlp-2]"),
    Bug("ddp_sync_on_wrong_microbatch",
        "Under gradient accumulation, no_sync is inverted: the gradient all-reduce fires "
        "on the micro-batches inside no_sync and not on the last one, after it.",
        "lessonlib.data_parallel.DataParallel.no_sync",
        "the last micro-batch's gradient is never averaged: replicas hold different "
        "gradients and drift apart; the ledger shows the all-reduce on the wrong micro-batch",
        "accumulated gradients vs one process on the whole batch, all-reduces per micro-batch",
        "tests/test_data_parallel.py::test_no_sync_accumulation_equals_one_large_batch[2]"),
    Bug("p2p_dropped_request",
        "A pipeline stage drops the request handle of a receive (irecv) instead of waiting "
        "on it, and reads the buffer at once. The switch parks the handle with the sends "
        "(waited at the end of the step); truly discarding it is worse on gloo: freeing an "
        "unfinished request cancels the receive and the peer's send then waits forever.",
        "lessonlib.pipeline.executor.PipelineExecutor.step",
        "activations and gradients read before the data lands: whatever the buffer held "
        "(huge values, NaN); no error, no hang",
        "pipeline gradients vs one process (a hang would end as a LaunchTimeout)",
        "tests/test_pipeline_parity.py::test_every_schedule_matches_one_process[2]"),
    Bug("pipeline_loss_unscaled",
        "The last pipeline stage backpropagates each micro-batch's loss without dividing "
        "it by the number of micro-batches m.",
        "lessonlib.pipeline.executor.PipelineExecutor._forward",
        "losses look right; gradients are m times the one-process gradients (with SGD, "
        "as if the learning rate were m times larger)",
        "pipeline gradients vs one process",
        "tests/test_pipeline_parity.py::test_every_schedule_matches_one_process[2]"),
    Bug("tp_layer_left_unsharded",
        "parallelize_block leaves the MLP dense: every rank holds and computes all of it.",
        "lessonlib.tensor_parallel.parallelize_block",
        "outputs and gradients equal the dense model, so every parity test passes; each "
        "rank holds more weight bytes than 1/t of the matrices, and sends one all-reduce "
        "fewer per layer",
        "weight bytes per rank vs 1/t of the layer, all-reduces per forward",
        "tests/test_tensor_parallel.py::test_each_rank_holds_one_t_th_of_the_weight_matrices[2]"),
)}


# ---------------------------------------------------------------- the switch
def _known(names) -> list[str]:
    unknown = [n for n in names if n not in BUGS]
    if unknown:
        raise ValueError(f"unknown bug name(s) {unknown} (in {ENV} or an argument); the bug "
                         f"zoo has: {', '.join(BUGS)}")
    return list(names)


def _switched_on() -> list[str]:
    raw = os.environ.get(ENV, "")
    return _known([n.strip() for n in raw.split(",") if n.strip()]) if raw else []


def active(name: str) -> bool:
    """Is bug ``name`` switched on? Read from the environment at each call; a dictionary
    lookup and one environment read when off."""
    if name not in BUGS:
        _known([name])
    return bool(os.environ.get(ENV)) and name in _switched_on()


def hook_line(name: str) -> tuple[str, str]:
    """(file:line, the code) of bug ``name``'s switch: its ``if`` and the lines under it,
    read from the source now, so it is never stale."""
    import importlib
    import inspect
    import textwrap
    from pathlib import Path
    _known([name])
    parts = BUGS[name].where.split(".")
    obj = importlib.import_module(parts[0])
    for i, attr in enumerate(parts[1:], 2):     # a submodule not imported yet: import it
        obj = getattr(obj, attr, None) or importlib.import_module(".".join(parts[:i]))
    obj = inspect.unwrap(obj)                   # no_sync is wrapped by @contextmanager
    lines, start = inspect.getsourcelines(obj)
    i = next(i for i, line in enumerate(lines) if f'bugzoo.active("{name}")' in line)
    indent = len(lines[i]) - len(lines[i].lstrip())
    block = [lines[i]]
    for line in lines[i + 1:]:
        if line.strip() and len(line) - len(line.lstrip()) <= indent and \
                not line.lstrip().startswith("else"):
            break
        block.append(line)
    path = Path(inspect.getsourcefile(obj)).relative_to(Path(__file__).parent.parent)
    return f"{path.as_posix()}:{start + i}", textwrap.dedent("".join(block)).rstrip()


@contextmanager
def _set(names: list[str]):
    before = os.environ.get(ENV)
    os.environ[ENV] = ",".join(names)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ENV)
        else:
            os.environ[ENV] = before


@contextmanager
def enabled(*names: str):
    """Switch bugs on in this process, and in the ranks it launches, inside the block."""
    _known(names)
    with _set(list(dict.fromkeys(_switched_on() + list(names)))):
        yield


# ---------------------------------------------------------------- the rank side of the checks
def _rel(a, b) -> float:
    err = ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()
    return err if math.isfinite(err) else math.inf


def rank_tp_gradient() -> dict:
    """A tensor-parallel MLP over the world (t=2) vs the dense MLP, one step."""
    from lessonlib import tp_runs
    r = tp_runs.layer_report(2, b=2, s=4, h=16, heads=2, steps=1, kinds=("mlp",))["mlp"]
    return {"input_grad": r["input_grad"], "output": r["output"]}


def rank_tp_sharding() -> dict:
    """A transformer layer split by parallelize_block: bytes held, all-reduces, output."""
    import torch
    from lessonlib import comm
    from lessonlib.models import Block, GPTConfig, init_weights_
    from lessonlib.tensor_parallel import param_bytes, parallelize_block
    h, t = 16, 2
    dense = init_weights_(Block(GPTConfig(seq=4, hidden=h, heads=2)), 0, std=0.02)
    tp = parallelize_block(dense)
    x = torch.randn(2, 4, h, generator=torch.Generator().manual_seed(1))   # (b, s, h)
    with comm.ledger() as book:
        out = tp(x)
    return {"param_bytes": param_bytes(tp), "expected": ((12 * h * h + 7 * h) // t + 6 * h) * 4,
            "all_reduces": book.count("all_reduce"), "h": h, "t": t,
            "output": _rel(out.detach(), dense(x).detach())}


def rank_ddp_accumulation(micro: int = 2) -> dict:
    """DataParallel with ``micro`` accumulated micro-batches (no_sync on all but the last)
    vs one process on the whole batch; the all-reduces each micro-batch sent."""
    from contextlib import nullcontext
    import torch.distributed as dist
    import torch.nn.functional as F
    from lessonlib import comm
    from lessonlib.data import regression_batch, shard
    from lessonlib.data_parallel import DataParallel
    from lessonlib.models import mlp_stack
    rank, n = dist.get_rank(), dist.get_world_size()
    x, y = (t.double() for t in regression_batch(4 * n * micro, 8, 0))      # (b, 8)
    ddp = DataParallel(mlp_stack(8, 2, seed=0).double())
    sent = []
    pieces = zip(shard(x, rank, n).chunk(micro), shard(y, rank, n).chunk(micro))
    for i, (xm, ym) in enumerate(pieces):
        with comm.ledger() as book, ddp.no_sync() if i < micro - 1 else nullcontext():
            (F.mse_loss(ddp(xm), ym) / micro).backward()
        sent.append(book.count("all_reduce"))
    ref = mlp_stack(8, 2, seed=0).double()
    F.mse_loss(ref(x), y).backward()
    return {"grads": max(_rel(p.grad, q.grad) for p, q in zip(ddp.parameters(), ref.parameters())),
            "all_reduces_per_microbatch": sent}


def rank_pipeline(m: int = 4) -> dict:
    """One 1F1B step of a 2-stage pipeline (m micro-batches) vs one process."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from lessonlib.data import regression_batch
    from lessonlib.models import mlp_stack
    from lessonlib.pipeline.executor import PipelineExecutor
    from lessonlib.pipeline.schedules import make
    from lessonlib.pipeline.stages import stage_modules, stage_parameters
    p, stage = dist.get_world_size(), dist.get_rank()
    chunks = stage_modules(mlp_stack(16, 4, seed=0), p, 1, stage)
    x, y = regression_batch(2 * m, 16, 0)                                   # (m * b, 16)
    PipelineExecutor(make("1f1b", p, m), stage, chunks, F.mse_loss, (2, 16)).step(x, y)
    ref = mlp_stack(16, 4, seed=0)
    F.mse_loss(ref(x), y).backward()
    got = torch.cat([q.grad.reshape(-1) for c in chunks for q in c.parameters()])
    want = torch.cat([q.grad.reshape(-1) for q in stage_parameters(ref, p, 1, stage)])
    ratio = (got.norm() / want.norm()).item()
    return {"grads": _rel(got, want), "ratio": ratio if math.isfinite(ratio) else math.inf, "m": m}


# ---------------------------------------------------------------- the caller side
def _tp_gradient(r):
    err, out = max(x["input_grad"] for x in r), max(x["output"] for x in r)
    return "input gradient vs the dense MLP (relative)", err, 1e-5, (
        f"input gradient off by {err:.2g} of its largest value (tolerance 1e-05); the "
        f"output is off by only {out:.2g}: a check of the forward pass sees nothing")


def _tp_sharding(r):
    held, want = max(x["param_bytes"] for x in r), r[0]["expected"]
    ar, out = max(x["all_reduces"] for x in r), max(x["output"] for x in r)
    diff = max(abs(held - want) / want, abs(ar - 2) / 2)
    return "weight bytes per rank vs 1/t of the layer (relative)", diff, 0.0, (
        f"each rank holds {held} bytes of the layer, expected {want} (1/t of the split "
        f"matrices plus the replicated parts); {ar} all-reduce(s) per forward, expected 2; "
        f"the output is off by only {out:.2g}, so parity tests pass")


def _ddp(r):
    err, sent = max(x["grads"] for x in r), r[0]["all_reduces_per_microbatch"]
    return "accumulated gradients vs one process (relative)", err, 1e-10, (
        f"gradients off by {err:.2g} (tolerance 1e-10); all-reduces per micro-batch: {sent} "
        f"(only the last micro-batch should send)")


def _pipeline(r):
    err, ratio = max(x["grads"] for x in r), max(x["ratio"] for x in r)
    return "pipeline gradients vs one process (relative)", err, 1e-5, (
        f"gradients off by {err:.2g} (tolerance 1e-05); their norm is {ratio:.3g} times "
        f"the one-process norm (m = {r[0]['m']} micro-batches)")


def _p2p(r):
    err = max(x["grads"] for x in r)
    return "pipeline gradients vs one process (relative)", err, 1e-5, (
        f"gradients off by {err:.2g} (tolerance 1e-05): a buffer read before its receive "
        f"completes holds whatever the memory held (inf: huge values or NaN)")


CHECKS = {  # bug: (rank function, parent summary -> (what, max_diff, tolerance, message))
    "tp_missing_backward_all_reduce": (rank_tp_gradient, _tp_gradient),
    "ddp_sync_on_wrong_microbatch": (rank_ddp_accumulation, _ddp),
    "p2p_dropped_request": (rank_pipeline, _p2p),
    "pipeline_loss_unscaled": (rank_pipeline, _pipeline),
    "tp_layer_left_unsharded": (rank_tp_sharding, _tp_sharding),
}


def check(name: str, bug_on: bool | None = None, timeout: float = 60.0) -> dict:
    """Run the check that catches bug ``name`` on 2 ranks (one launch), with the bug on or
    off (default: as the switch is now). Returns plain numbers and words: {"bug", "bug_on",
    "passed", "what", "max_diff", "tolerance", "message", "ranks"} ("ranks": what each rank
    measured). A hang ends at ``timeout`` and, like a crashed rank, is reported as a failed
    check."""
    from lessonlib.launcher import LaunchTimeout, RankError, launch
    _known([name])
    on = active(name) if bug_on is None else bool(bug_on)
    names = [n for n in _switched_on() if n != name] + ([name] if on else [])
    rank_fn, summary = CHECKS[name]
    with _set(names):
        try:
            ranks = launch(rank_fn, 2, timeout=timeout)
            what, diff, tol, message = summary(ranks)
            message = f"{'passed' if diff <= tol else 'FAILED'}: {message}"
        except (LaunchTimeout, RankError) as exc:
            what, diff, tol, ranks = BUGS[name].check, math.inf, 0.0, []
            message = f"FAILED: the check did not finish: {str(exc).splitlines()[0]}"
    return {"bug": name, "bug_on": on, "passed": diff <= tol, "what": what,
            "max_diff": diff, "tolerance": tol, "message": message, "ranks": ranks}
