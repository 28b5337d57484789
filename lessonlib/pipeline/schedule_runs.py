"""The pipeline lesson's real runs: the functions the notebook, the lab and the tests launch.

What it teaches: the measurements behind the lesson's claims, each one function that runs on every
rank (stage s = rank s), plus the parent-side code that turns the ranks' results into one table:

* ``rank_parity`` (on every rank): a tiny GPT trained a few steps with GPipe, 1F1B,
  interleaved 1F1B (lessonlib) and ScheduleGPipe / Schedule1F1B (PyTorch);
  ``compare_parity`` (in the caller) compares every case with the same model in one process (losses, gradients, weights after the steps);
* ``measure``: balanced stages that do a fixed amount of matmul work (an ``mlp_stack``, equal
  Linear layers per stage), timed step by step with lessonlib's executor and with PyTorch's
  schedules taking turns; ``summarize`` reports the median step time, the bubble per stage
  (idle share of the step's wall time) and the peak stash per stage, next to the theory.

Each case's runner (lessonlib's executor or PyTorch's schedule on the same chunks) comes from
``runner.make_runner``. Each result is a record with named fields (``StageRun``,
``ParityRow``, ``ScheduleRow``, ``BubbleExplanation``).

One job: the pipeline lesson's runs and the tables made of them; its length is their records.

Laptop:  ``python -c "import lessonlib as L; from lessonlib.pipeline import schedule_runs;
         print(schedule_runs.summarize(L.launch(schedule_runs.measure, 2, ms=(4,), steps=2)))"``
GPU box: the same with one GPU per stage (NCCL).
"""
from __future__ import annotations

import os
import statistics
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from lessonlib import comm
from lessonlib.baseline import corpus_batches, flat, train_one_process
from lessonlib.costmodel import bubble_fraction, stashed_microbatches
from lessonlib.data import regression_batch
from lessonlib.instruments import placement
from lessonlib.models import PARITY_CONFIG, GPTConfig, TinyGPT, lm_loss, mlp_stack
from lessonlib.pipeline.actions import COMPUTE, place, placement_of, virtual_stage
from lessonlib.pipeline.runner import InputLeaf, make_runner, mse
from lessonlib.pipeline.schedules import make
from lessonlib.pipeline.stages import stage_parameters
from lessonlib.pipeline.torch_ref import torch_can_run
from lessonlib.pipeline.validate import simulate


# ---------------------------------------------------------------- parity
@dataclass
class StageRun:
    """One case on one stage (``parity``, rank side): each step's per-micro-batch losses
    (the last virtual stage's are the model's), the first step's gradients, the weights
    after the steps, the peak stash, and the first step's sends and receives (as counted by
    ``comm.ledger``; PyTorch's schedules go around it: 0)."""
    losses: list
    grads: list
    params: list
    stash: int
    sends: int
    recvs: int


@dataclass
class ParityRow:
    """One case against one process (``parity_report``): its largest differences and the
    peak stash per stage."""
    engine: str
    schedule: str
    m: int
    v: int
    max_grads_diff: float
    max_weights_diff: float
    max_losses_diff: float
    peak_stash: list


def parity_cases(p: int) -> list[tuple]:
    """(engine, schedule, m, v): m in {1, p, 2p+1}; interleaved (v=2) needs m a multiple of
    p, so it runs m = p and 2p; PyTorch's schedules run m = 2p+1 (warm-up, steady state and
    cool-down all present; its Schedule1F1B refuses m < p)."""
    ms = sorted({1, p, 2 * p + 1})
    cases = [("lessonlib", s, m, 1) for s in ("gpipe", "1f1b") for m in ms]
    cases += [("lessonlib", "interleaved", m, 2) for m in (p, 2 * p)]
    cases += [("torch", s, 2 * p + 1, 1) for s in ("gpipe", "1f1b")]
    return cases


def zero_bubble_cases(p: int, torch: bool = False) -> list[tuple]:
    """(engine, schedule, m, v): ZB-H1 and ZBV at m = 1, p and 2p+1 (not a multiple of p);
    ``torch``: also PyTorch's ScheduleInterleavedZeroBubble (m = p: it needs a multiple of
    p) and ScheduleZBVZeroBubble (m = 2p+1) on the same stages."""
    cases = [("lessonlib", s, m, v) for s, v in (("zb-h1", 1), ("zbv", 2))
             for m in sorted({1, p, 2 * p + 1})]
    return cases + ([("torch", "zb-h1", p, 1), ("torch", "zbv", 2 * p + 1, 2)] if torch else [])


def rank_parity(cases, steps: int = 2, micro: int = 2, lr: float = 0.1, seed: int = 0,
           cfg: GPTConfig = PARITY_CONFIG, dtype: torch.dtype = torch.float32) -> dict:
    """Rank side: train each case ``steps`` SGD steps (the model in ``dtype``); return
    {case: StageRun} for this stage."""
    p, stage = dist.get_world_size(), dist.get_rank()
    out = {}
    for case in cases:
        engine, schedule, m, v = case
        chunks, runner = make_runner(engine, schedule, TinyGPT(cfg, seed).to(dtype), p, m, v,
                                     stage, lm_loss, (micro, cfg.seq, cfg.hidden))
        params = [q for c in chunks for q in c.parameters()]
        opt = torch.optim.SGD(params, lr=lr)
        losses, grads, stash, counts = [], None, 0, None
        for step in range(steps):
            x, y = corpus_batches(cfg, micro * m, seed)(step)
            opt.zero_grad()
            with comm.ledger() as book:
                result = runner.step(x, y)
            counts = counts or (book.count("send"), book.count("recv"))
            grads = grads or [q.grad.detach().clone() for q in params]
            losses.append(result.losses)
            stash = max(stash, result.peak_stash)
            opt.step()
        out[case] = StageRun(losses, grads, [q.detach().clone() for q in params], stash,
                             *counts)
    return out


def reference(m: int, steps: int = 2, micro: int = 2, lr: float = 0.1, seed: int = 0,
              cfg: GPTConfig = PARITY_CONFIG, dtype: torch.dtype = torch.float32):
    """One process, whole batch: (model after the steps, {param: first-step grad},
    per-step losses of each micro-batch)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)        # tiny tensors: more threads only add waiting
    try:
        model = TinyGPT(cfg, seed).to(dtype)
        run = train_one_process(model, corpus_batches(cfg, micro * m, seed), steps, lr=lr,
                                microbatches=m)
    finally:
        torch.set_num_threads(threads)
    losses = run["microbatch_losses"] if m > 1 else [[loss] for loss in run["losses"]]
    return model, run["first_grads"], losses


def compare_parity(per_rank: list[dict], steps: int = 2, micro: int = 2, lr: float = 0.1,
                  seed: int = 0, cfg: GPTConfig = PARITY_CONFIG,
                  dtype: torch.dtype = torch.float32) -> list[ParityRow]:
    """Parent side: each case's largest difference from one process (raises
    AssertionError, naming the case, if any tensor differs beyond ``dtype``'s rounding)."""
    tol = dict(rtol=1e-4, atol=1e-5) if dtype != torch.float64 else dict(rtol=1e-9, atol=1e-11)
    p, rows, refs = len(per_rank), [], {}
    for case in per_rank[0]:
        engine, schedule, m, v = case
        if m not in refs:
            refs[m] = reference(m, steps, micro, lr, seed, cfg, dtype)
        model, grads, losses = refs[m]
        diff = {"grads": 0.0, "weights": 0.0, "losses": 0.0}
        placement = placement_of(make(schedule, p, m, v))
        for d, result in enumerate(per_rank):
            names = stage_parameters(model, p, v, d, placement=placement)
            for what, got, want in (
                    ("grads", result[case].grads, [grads[q] for q in names]),
                    ("weights", result[case].params, [q.detach() for q in names])):
                if len(got) != len(want):
                    raise AssertionError(f"{case}, stage {d}: {len(got)} {what}, "
                                         f"expected {len(want)}")
                a, b = flat(got), flat(want)
                torch.testing.assert_close(a, b, **tol,
                                           msg=lambda s: f"{case}, stage {d}, {what}: {s}")
                diff[what] = max(diff[what], (a - b).abs().max().item())
        got = torch.tensor(per_rank[place(p * v - 1, p, placement)[0]][case].losses,
                           dtype=torch.float64)
        want = torch.tensor(losses, dtype=torch.float64)
        torch.testing.assert_close(got, want, **tol, msg=lambda s: f"{case}, losses: {s}")
        diff["losses"] = (got - want).abs().max().item()
        rows.append(ParityRow(engine, schedule, m, v, diff["grads"], diff["weights"],
                              diff["losses"], [r[case].stash for r in per_rank]))
    return rows


# ---------------------------------------------------------------- measurements
def measure(ms=(2, 4, 8), schedules=("gpipe", "1f1b"), engines=("lessonlib", "torch"),
            width: int = 1024, layers_per_stage: int = 8, micro: int = 128, v: int = 2,
            steps: int = 5, warmup: int = 2, threads: int | None = 1, pin: bool = False,
            input_grad: bool = True, seed: int = 0) -> dict:
    """Rank side: for each m, every schedule and engine take turns step by step (ABBA) on
    the same balanced matmul stages, so a load that comes and goes hits them alike;
    returns {(engine, schedule, m, v): [StepResult per step]}.

    PyTorch runs what its schedules accept (``torch_ref.torch_can_run``); 'interleaved' uses
    ``v`` chunks per device. ``threads``: compute threads per rank; ``pin``: bind rank r to
    CPU core r, so two ranks never share a core (on a machine with enough cores);
    ``input_grad``: stage 0 also computes its input's gradient, as every later stage must,
    so that all stages do the same backward work (the bubble formula assumes equal stages;
    without it stage 0's backward is one matmul in 2 * layers_per_stage shorter)."""
    if threads:
        torch.set_num_threads(threads)
    p, stage = dist.get_world_size(), dist.get_rank()
    if pin and hasattr(os, "sched_setaffinity") and p <= (os.cpu_count() or 1):
        os.sched_setaffinity(0, {stage})
    model = mlp_stack(width, p * layers_per_stage, seed)
    if input_grad:
        model = nn.Sequential(InputLeaf(), *model)
    out = {}
    for m in ms:
        x, y = regression_batch(micro * m, width, 0, seed)
        cases = [(e, s, m, {"interleaved": v, "zbv": 2}.get(s, 1)) for s in schedules
                 for e in engines if e == "lessonlib" or torch_can_run(s, p, m)]
        runners = [(case, *make_runner(*case[:2], model, p, m, case[3], stage, mse,
                                       (micro, width))) for case in cases]
        for i in range(warmup + steps):          # every case of this m in turn, ABBA
            for case, chunks, runner in (runners if i % 2 == 0 else runners[::-1]):
                for c in chunks:
                    c.zero_grad()
                with placement.timed(i, warmup):
                    result = runner.step(x, y)
                if i >= warmup:
                    out.setdefault(case, []).append(result)
    return out


@dataclass
class ScheduleRow:
    """One measured case (``summarize``): the median step time; the bubble per stage and its
    mean beside the theory's two conventions; the peak stash per stage (micro-batches,
    bytes) beside the formula's."""
    engine: str
    schedule: str
    p: int
    m: int
    v: int
    step_time_s: float
    bubble_per_stage: list
    bubble_mean: float
    bubble_theory_wall: float
    bubble_theory_ideal: float
    peak_stash_per_stage: list
    peak_stash_theory: list
    peak_stash_bytes_per_stage: list


def summarize(per_rank: list[dict]) -> list[ScheduleRow]:
    """Parent side: one row per case with the median step time, the bubble per stage
    (median over steps of 1 - busy / wall, wall = the slowest rank's step) and the peak
    stash per stage, beside the theory (bubble: "wall" convention, GPipe §2.3, and
    "ideal", Megatron-LM 2021 §2.2; stash: PipeDream-Flush / GPipe)."""
    p, rows = len(per_rank), []
    for case in per_rank[0]:
        engine, schedule, m, v = case
        steps = list(zip(*(r[case] for r in per_rank)))
        walls = [max(r.wall_s for r in step) for step in steps]
        bubbles = [[1 - sum(x.end - x.start for x in r.spans if x.kind in COMPUTE) / w
                    for r in step] for step, w in zip(steps, walls)]
        sim = simulate(make(schedule, p, m, v))
        formula = ([stashed_microbatches(schedule, p, m, s) for s in range(p)]
                   if schedule in ("gpipe", "1f1b") else sim.peak_stash)
        bubble = [statistics.median(b[s] for b in bubbles) for s in range(p)]
        rows.append(ScheduleRow(
            engine, schedule, p, m, v, step_time_s=statistics.median(walls),
            bubble_per_stage=bubble, bubble_mean=statistics.fmean(bubble),
            bubble_theory_wall=theory(schedule, p, m, v, "wall"),
            bubble_theory_ideal=theory(schedule, p, m, v, "ideal"),
            peak_stash_per_stage=[max(r.peak_stash_measured for r in col)
                                  for col in zip(*steps)],
            peak_stash_theory=formula,
            peak_stash_bytes_per_stage=[max(r.peak_stash_bytes for r in col)
                                        for col in zip(*steps)]))
    return rows


def theory(schedule: str, p: int, m: int, v: int, convention: str) -> float:
    """The cost model's bubble (zero-bubble schedules at T_F = T_B = T_W)."""
    if schedule in ("zb-h1", "zbv"):
        return bubble_fraction(p, m, 1, convention, schedule)
    return bubble_fraction(p, m, v, convention)


def median_step(per_rank: list[dict], case) -> list:
    """The StepResults (one per stage) of the step with the median wall time."""
    steps = list(zip(*(r[case] for r in per_rank)))
    walls = [max(r.wall_s for r in step) for step in steps]
    return list(steps[sorted(range(len(steps)), key=walls.__getitem__)[len(steps) // 2]])


@dataclass
class BubbleExplanation:
    """``explain_bubble``'s answer: the median step's F, B and W ms by virtual stage, send ms
    by stage; the bubble by the theory, by the simulation with the measured compute (then
    with the sends too) and as measured per stage; the measured and simulated step ms."""
    forward_ms: list
    backward_ms: list
    weight_ms: list
    send_ms: list
    theory: float
    simulated_with_measured_compute: list
    simulated_with_measured_compute_and_sends: list
    measured: list
    step_ms: float
    simulated_step_ms: float


def explain_bubble(per_rank: list[dict], case) -> BubbleExplanation:
    """Why a measured bubble differs from (p-1)/(m+p-1): the median step's F, B and W times
    per virtual stage (ZBV's device 0 runs the first and the last) and send times per stage,
    replayed by the schedule simulation with compute only (stages of different speeds), then
    with the sends (copying each message out is on a pipeline's critical path too). F, B and
    W ms are by virtual stage in model order, "send_ms" by stage."""
    engine, schedule, m, v = case
    p, step = len(per_rank), median_step(per_rank, case)
    sched = make(schedule, p, m, v)
    at = placement_of(sched)

    def took(spans):
        return statistics.median([x.end - x.start for x in spans] or [0.0])

    cost = {k: [took([x for x in step[d].spans if (x.kind, x.chunk) == (k, c)])
                for d, c in (place(vs, p, at) for vs in range(p * v))] for k in ("F", "B", "W")}
    sends = [took([x for x in r.spans if x.kind.startswith("SEND")]) for r in step]
    times = {name: (lambda s, a, k=k: cost[k][virtual_stage(s, a.chunk, p, at)])
             for name, k in (("forward", "F"), ("backward", "B"), ("weight", "W"))}
    compute_only = simulate(sched, **times)
    with_sends = simulate(sched, **times, send=lambda s, a: sends[s])
    wall = max(r.wall_s for r in step)
    busy = [sum(x.end - x.start for x in r.spans if x.kind in COMPUTE) for r in step]
    return BubbleExplanation(
        *([1e3 * t for t in cost[k]] for k in "FBW"), [1e3 * t for t in sends],
        theory=theory(schedule, p, m, v, "wall"),
        simulated_with_measured_compute=compute_only.bubble,
        simulated_with_measured_compute_and_sends=with_sends.bubble,
        measured=[1 - bz / wall for bz in busy],
        step_ms=1e3 * wall, simulated_step_ms=1e3 * with_sends.makespan)


def demo(schedule: str = "1f1b", m: int = 4, engine: str = "lessonlib") -> dict:
    """A small pipeline step on every rank: what this stage ran and held."""
    p, stage = dist.get_world_size(), dist.get_rank()
    _, runner = make_runner(engine, schedule, mlp_stack(32, 2 * p), p, m, 1, stage, mse, (4, 32))
    x, y = regression_batch(4 * m, 32, 0)
    result = runner.step(x, y)
    return {"stage": stage, "order": " ".join(f"{s.kind}{s.microbatch}" for s in result.spans
                                              if s.kind in ("F", "B")),
            "peak_stash": result.peak_stash_measured, "losses": result.losses}
