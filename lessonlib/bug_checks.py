"""A bug zoo: switches that bring back real bugs of distributed training, and the checks
that catch them.

What it teaches: every bug here is one that teams building data, tensor and pipeline
parallelism have shipped at some point, and each is caught by one kind of check: parity
with one process (outputs, input gradients, weight gradients), a property the routing must
keep (a bias shared by all experts changes no output; the bias update evens the load),
counting what each rank holds and sends, or, for the three hangs (``hang_*``: ranks that
stop agreeing on their sequence of collectives), the flight records, which name the stuck
call, its group and the ranks missing from it. One bug (a layer left unsharded) passes every
parity test: parity is not enough, the memory and the messages must be checked too.

Each bug is one commented ``if bug_switches.active("<name>"):`` in the real code, off unless the
environment variable ``LESSONLIB_BUGS`` names it (comma-separated). The switches live on the
ground floor (``lessonlib.bug_switches``: ``BUGS``, ``active``, ``enabled``); this module, on
the top floor, holds the checks that catch each bug, and imports the real code they exercise.

One job: check each bug of the zoo, a rank side that measures and a ``Verdict`` that judges
in the caller (``CHECKS``); its length is the zoo's fifteen checks.

Laptop:  ``python -c "from lessonlib import bug_checks as z;
         print(z.check('pipeline_loss_unscaled', True))"``
         or ``LESSONLIB_BUGS=pipeline_loss_unscaled python -m pytest tests/test_pipeline_parity.py``
GPU box: the same; ``check`` launches on NCCL when 2 GPUs are visible.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial

import torch
import torch.distributed as dist
import torch.nn.functional as F

from lessonlib import comm
from lessonlib.baseline import rel_err
from lessonlib.bug_switches import BUGS, active, known, switched, switched_on
from lessonlib.context_parallel import method_runs as cp_runs
from lessonlib.data import regression_batch, shard
from lessonlib.data_parallel.ddp import DataParallel
from lessonlib.device import current_device
from lessonlib.expert_parallel import measure as ep_measure
from lessonlib.expert_parallel import layer_runs as ep_runs
from lessonlib.faults import hangs
from lessonlib.faults.hang_analysis import Finding, analyze
from lessonlib.launcher import LaunchTimeout, RankError, launch
from lessonlib.models import Block, GPTConfig, init_weights_, mlp_stack
from lessonlib.pipeline.executor import PipelineExecutor
from lessonlib.pipeline.schedules import make
from lessonlib.pipeline.stages import stage_modules, stage_parameters
from lessonlib.tensor_parallel import layer_runs as tp_runs
from lessonlib.tensor_parallel import sequence_runs as sp_runs
from lessonlib.tensor_parallel.parallelize import parallelize_block, param_bytes
from lessonlib.tensor_parallel.reports import Parity

__all__ = ["CHECKS", "Check", "CheckPlan", "Verdict", "check"]


# ---------------------------------------------------------------- the rank side of the checks
@dataclass(frozen=True)
class Sharding:
    """A split layer's weight bytes on a rank against 1/t, all-reduces per forward, output."""
    param_bytes: int
    expected: int
    all_reduces: int
    h: int
    t: int
    output: float


@dataclass(frozen=True)
class Accumulation:
    """Accumulated gradients against one process (relative), all-reduces per micro-batch."""
    grads: float
    all_reduces_per_microbatch: list


@dataclass(frozen=True)
class PipelineGrads:
    """Pipeline gradients vs one process: relative error, ratio of norms, micro-batches."""
    grads: float
    ratio: float
    m: int


@dataclass(frozen=True)
class ExpertParity:
    """Expert-parallel layer vs one process: output, worst gradient, bias after the steps."""
    output: float
    grads: float
    bias: float


def rank_tp_gradient() -> Parity:
    """A tensor-parallel MLP over the world (t=2) vs the dense MLP, one step."""
    return tp_runs.layer_report(2, b=2, s=4, h=16, heads=2, steps=1, kinds=("mlp",)).mlp


def rank_tp_sharding() -> Sharding:
    """A transformer layer split by parallelize_block: bytes held, all-reduces, output."""
    h, t, dev = 16, 2, current_device()
    dense = init_weights_(Block(GPTConfig(seq=4, hidden=h, heads=2)), 0, std=0.02).to(dev)
    tp = parallelize_block(dense)
    x = torch.randn(2, 4, h, generator=torch.Generator().manual_seed(1)).to(dev)  # (b, s, h)
    with comm.ledger() as book:
        out = tp(x)
    return Sharding(param_bytes=param_bytes(tp), expected=((12 * h * h + 7 * h) // t + 6 * h) * 4,
                    all_reduces=book.count("all_reduce"), h=h, t=t,
                    output=rel_err(out.detach(), dense(x).detach()))


def rank_ddp_accumulation(micro: int = 2) -> Accumulation:
    """DataParallel with ``micro`` accumulated micro-batches (no_sync on all but the last)
    vs one process on the whole batch; the all-reduces each micro-batch sent."""
    rank, n, dev = dist.get_rank(), dist.get_world_size(), current_device()
    x, y = (t.double().to(dev) for t in regression_batch(4 * n * micro, 8, 0))   # (b, 8)
    ddp = DataParallel(mlp_stack(8, 2, seed=0).double().to(dev))
    sent = []
    pieces = zip(shard(x, rank, n).chunk(micro), shard(y, rank, n).chunk(micro))
    for i, (xm, ym) in enumerate(pieces):
        with comm.ledger() as book, ddp.no_sync() if i < micro - 1 else nullcontext():
            (F.mse_loss(ddp(xm), ym) / micro).backward()
        sent.append(book.count("all_reduce"))
    ref = mlp_stack(8, 2, seed=0).double().to(dev)
    F.mse_loss(ref(x), y).backward()
    grads = max(rel_err(p.grad, q.grad) for p, q in zip(ddp.parameters(), ref.parameters()))
    return Accumulation(grads=grads, all_reduces_per_microbatch=sent)


def rank_pipeline(m: int = 4) -> PipelineGrads:
    """One 1F1B step of a 2-stage pipeline (m micro-batches) vs one process."""
    p, stage, dev = dist.get_world_size(), dist.get_rank(), current_device()
    chunks = [c.to(dev) for c in stage_modules(mlp_stack(16, 4, seed=0), p, 1, stage)]
    x, y = (t.to(dev) for t in regression_batch(2 * m, 16, 0))              # (m * b, 16)
    PipelineExecutor(make("1f1b", p, m), stage, chunks, F.mse_loss, (2, 16)).step(x, y)
    ref = mlp_stack(16, 4, seed=0).to(dev)
    F.mse_loss(ref(x), y).backward()
    got = torch.cat([q.grad.reshape(-1) for c in chunks for q in c.parameters()])
    want = torch.cat([q.grad.reshape(-1) for q in stage_parameters(ref, p, 1, stage)])
    ratio = (got.norm() / want.norm()).item()
    return PipelineGrads(grads=rel_err(got, want), m=m,
                         ratio=ratio if math.isfinite(ratio) else math.inf)


def rank_ep_gradient() -> ExpertParity:
    """4 experts over e = 2 ranks (top-2, drops), one step vs the one-process MoE layer."""
    r = ep_runs.rank_parity(4, 2, 2, 1.0, steps=1)
    return ExpertParity(output=r.output, grads=r.grads, bias=r.bias_after_steps)


def rank_ep_bias() -> ExpertParity:
    """4 experts over e = 2 ranks, dropless, sigmoid, the bias (0.05 a step), 2 steps vs the
    one-process layer trained on both ranks' batches."""
    r = ep_runs.rank_parity(4, 2, 2, None, routing={"balance": "bias", "gate": "sigmoid",
                                               "bias_step": 0.05}, steps=2)
    return ExpertParity(output=r.output, grads=r.grads, bias=r.bias_after_steps)


def rank_sp_layernorm() -> Parity:
    """A TP+SP transformer layer (t=2) vs the dense layer, one step."""
    return sp_runs.parity_report(2, steps=1, modes=("tp+sp",), models=()).vs_dense["tp+sp"]


def rank_cp_method(method: str) -> cp_runs.MethodReport:
    """One context-parallel method over the world (c = 2; 4 query heads, GQA and a document
    mask where it takes them) vs one-process attention: errors of the output and gradients."""
    return cp_runs.method_report(None, 2, method, gqa=method != "ring", docs=cp_runs.DOCS,
                                 heads=4)


# ---------------------------------------------------------------- the caller side
@dataclass(frozen=True)
class Verdict:
    """What a check compared, its largest difference, the tolerance it allows, a sentence."""
    what: str
    max_diff: float
    tolerance: float
    message: str


def _tp_gradient(r):
    err, out = max(x.input_grad for x in r), max(x.output for x in r)
    return Verdict("input gradient vs the dense MLP (relative)", err, 1e-5, (
        f"input gradient off by {err:.2g} of its largest value (tolerance 1e-05); the "
        f"output is off by only {out:.2g}: a check of the forward pass sees nothing"))


def _tp_sharding(r):
    held, want = max(x.param_bytes for x in r), r[0].expected
    ar, out = max(x.all_reduces for x in r), max(x.output for x in r)
    diff = max(abs(held - want) / want, abs(ar - 2) / 2)
    return Verdict("weight bytes per rank vs 1/t of the layer (relative)", diff, 0.0, (
        f"each rank holds {held} bytes of the layer, expected {want} (1/t of the split "
        f"matrices plus the replicated parts); {ar} all-reduce(s) per forward, expected 2; "
        f"the output is off by only {out:.2g}, so parity tests pass"))


def _ddp(r):
    err, sent = max(x.grads for x in r), r[0].all_reduces_per_microbatch
    return Verdict("accumulated gradients vs one process (relative)", err, 1e-10, (
        f"gradients off by {err:.2g} (tolerance 1e-10); all-reduces per micro-batch: {sent} "
        f"(only the last micro-batch should send)"))


def _pipeline(r):
    err, ratio = max(x.grads for x in r), max(x.ratio for x in r)
    return Verdict("pipeline gradients vs one process (relative)", err, 1e-5, (
        f"gradients off by {err:.2g} (tolerance 1e-05); their norm is {ratio:.3g} times "
        f"the one-process norm (m = {r[0].m} micro-batches)"))


def _p2p(r):
    err = max(x.grads for x in r)
    return Verdict("pipeline gradients vs one process (relative)", err, 1e-5, (
        f"gradients off by {err:.2g} (tolerance 1e-05): a buffer read before its receive "
        f"completes holds whatever the memory held (inf: huge values or NaN)"))


def _ep(r):
    err, out = max(x.grads for x in r), max(x.output for x in r)
    return Verdict("expert-parallel gradients vs one process (relative)", err, 1e-10, (
        f"gradients off by {err:.2g} of their largest value (tolerance 1e-10); the output "
        f"is off by only {out:.2g}: each rank's experts got the other rank's gradients too"))


def _moe_bias_weights(r):
    moved = max(x.moved for x in r)
    return Verdict("output with a bias shared by all experts vs none (relative)", moved, 0.0, (
        f"a bias of 0.25 on every expert, which changes no choice, moved the output by "
        f"{moved:.2g} of its largest value: the bias is in the combine weights"))


def _moe_bias_update(r):
    first, last = r[0].first, r[0].last
    return Verdict("busiest / mean load after 50 bias updates, over the first step's",
                   last / first, 0.6, (f"busiest / mean load went from {first:.2f} to "
                                       f"{last:.2f} in 50 bias updates (an even load is 1.00)"))


def _ep_bias(r):
    err, out = max(x.bias for x in r), max(x.output for x in r)
    return Verdict("the balancing bias after 2 steps vs one process (absolute)", err, 1e-12, (
        f"the bias is off by {err:.2g} after 2 steps; the first step's output is off by only "
        f"{out:.2g}: each replica moved its bias by its own batch's load"))


def _sp_layernorm(r):
    err, forward = max(x.grads for x in r), max(max(x.output, x.input_grad) for x in r)
    what = "weight gradients of a TP+SP layer vs the dense layer (relative)"
    return Verdict(what, err, 1e-10, (
        f"gradients off by {err:.2g}, the worst at {r[0].worst_grad}; the output and the input "
        f"gradient are off by only {forward:.2g}"))


def _cp(method):
    def summary(r):
        worst = {"output": max(x.output for x in r), "dq": max(x.dq for x in r),
                 "dk": max(x.dk for x in r), "dv": max(x.dv for x in r)}
        err, tol = max(worst.values()), 1e-12
        off = ", ".join(w for w, e in worst.items() if e > tol) or "nothing"
        right = ", ".join(w for w, e in worst.items() if e <= tol) or "nothing"
        what = f"{method} attention vs one-process attention (largest error)"
        return Verdict(what, err, tol, (
            f"{method} attention: {off} off by up to {err:.2g} (tolerance 1e-12); "
            f"{right} right"))
    return summary


def _finished(r):
    return Verdict("the loop finishes (a hang: the stuck call, named from the flight records)",
                   0.0, 0.0, f"all {len(r)} ranks finished the loop; no collective left waiting")


@dataclass(frozen=True)
class CheckPlan:
    """How one bug is checked: ``rank`` runs on each rank of the launch (2 unless
    ``LAUNCHES`` says otherwise); ``verdict`` reads their records in the caller and returns a
    ``Verdict``."""
    rank: Callable
    verdict: Callable[[list], Verdict]


CHECKS = {
    "tp_missing_backward_all_reduce": CheckPlan(rank_tp_gradient, _tp_gradient),
    "ddp_sync_on_wrong_microbatch": CheckPlan(rank_ddp_accumulation, _ddp),
    "p2p_dropped_request": CheckPlan(rank_pipeline, _p2p),
    "pipeline_loss_unscaled": CheckPlan(rank_pipeline, _pipeline),
    "tp_layer_left_unsharded": CheckPlan(rank_tp_sharding, _tp_sharding),
    "ep_expert_grads_wrong_group": CheckPlan(rank_ep_gradient, _ep),
    "sp_layernorm_grad_not_summed": CheckPlan(rank_sp_layernorm, _sp_layernorm),
    "cp_allgather_grads_not_reduced": CheckPlan(partial(rank_cp_method, "allgather"),
                                                _cp("all-gather")),
    "ulysses_head_groups_swapped": CheckPlan(partial(rank_cp_method, "ulysses"), _cp("Ulysses")),
    "moe_bias_in_combine_weights": CheckPlan(ep_measure.shared_bias_shift, _moe_bias_weights),
    "moe_bias_update_sign_flipped": CheckPlan(ep_measure.bias_load_ratios, _moe_bias_update),
    "ep_bias_load_not_all_reduced": CheckPlan(rank_ep_bias, _ep_bias),
    **{bug: CheckPlan(hangs.rank_steps, _finished) for bug in hangs.HANGS.values()},
}
# how each check launches, where not on 2 ranks for at most 60 s: a hang is seen only at the
# timeout, so the hangs' loop (under a second) waits a few seconds, on gloo (on NCCL a size
# mismatch may read garbage instead of hanging)
LAUNCHES = {bug: {"world_size": hangs.WORLD, "timeout": hangs.TIMEOUT_S, "backend": "gloo"}
            for bug in hangs.HANGS.values()}


@dataclass(frozen=True)
class Check:
    """One check of one bug: whether it passed, what it compared, its largest difference
    against its tolerance, a sentence, ``ranks``: each rank's record of what it measured, and
    ``finding``: where the check hung, the stuck call named from the flight records."""
    bug: str
    bug_on: bool
    passed: bool
    what: str
    max_diff: float
    tolerance: float
    message: str
    ranks: list
    finding: Finding | None = None


def check(name: str, bug_on: bool | None = None, timeout: float | None = None) -> Check:
    """Run the check that catches bug ``name`` on 2 ranks (one launch; ``LAUNCHES`` says
    where not), with the bug on or off (default: as the switch is now). A hang ends at
    ``timeout`` (default 60 s, or the check's own) and, like a crashed rank, is reported as
    a failed check; the message names the stuck call when the flight records show one."""
    known([name])
    on = active(name) if bug_on is None else bool(bug_on)
    names = [n for n in switched_on() if n != name] + ([name] if on else [])
    plan = CHECKS[name]
    how = {"world_size": 2, "timeout": 60.0, "backend": "auto"} | LAUNCHES.get(name, {})
    finding = None
    with switched(names):
        try:
            ranks = launch(plan.rank, how["world_size"], backend=how["backend"],
                           timeout=timeout or how["timeout"])
            verdict = plan.verdict(ranks)
            passed = verdict.max_diff <= verdict.tolerance
            message = f"{'passed' if passed else 'FAILED'}: {verdict.message}"
        except (LaunchTimeout, RankError) as exc:
            ranks = []
            verdict = Verdict(BUGS[name].check, math.inf, 0.0, "")
            finding = analyze(exc.flight) if isinstance(exc, LaunchTimeout) else None
            message = (f"FAILED: hung; the flight records name the stuck call: {finding}"
                       if finding else
                       f"FAILED: the check did not finish: {str(exc).splitlines()[0]}")
    return Check(bug=name, bug_on=on, passed=verdict.max_diff <= verdict.tolerance,
                 what=verdict.what, max_diff=verdict.max_diff, tolerance=verdict.tolerance,
                 message=message, ranks=ranks, finding=finding)
