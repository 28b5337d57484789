"""Run a pipeline schedule on real ranks with point-to-point messages, and time every step.

One job: one stage of a validated schedule, run on its rank; its length is one method per
kind of action and the checks that the stages agree before the first message.

What it teaches: once a schedule is data, running it is a small loop. Each rank is one
pipeline stage (device) and walks its own action list:

* F: run the chunk on the micro-batch (the first stage reads the batch, the others the
  activation they received); the last stage also computes the loss, scaled by 1/m so that
  the gradients summed over m micro-batches equal the gradient of the whole batch's mean
  loss, i.e. exactly what one process computes;
* B: backpropagate the received output gradient (or the loss); gradients accumulate in
  ``.grad`` across micro-batches and the input's gradient goes back upstream. With a W for
  the same micro-batch, B computes only the input gradient, keeping what W needs for the
  weight gradients (``split_backward``); on the first virtual stage, whose input gradient
  nobody needs, W runs the whole backward in one pass and B nothing, as PyTorch does;
* SEND_* / RECV_*: posted in batches, one ``comm.batch_isend_irecv`` on the pipeline's group
  between two computes, every request waited on before the next compute.

The batches are grouped in rounds (``validate.lockstep``), as PyTorch's pipelining
schedules do: in each round every stage runs its next compute, then posts the sends of
what it computed with the receives of what its neighbours computed in the same round. What
is guaranteed, on gloo and on NCCL: no deadlock among the batches (``validate.check_batches``
plays them for every schedule, run by ``validate``), every send and receive meets its
partner in order (NCCL pairs point-to-point messages by order), and this rank never has
NCCL work in flight on two communicators at once. NCCL promises nothing for that case (its
user guide, "Using multiple NCCL communicators concurrently"; NVIDIA/nccl#783), and the
executor used to create it: each link its own two-rank communicator, receives posted ahead
and left outstanding while the stage computed and ran its tensor-parallel all-reduces. A
batch runs on the group's one communicator in either mode (lazy or ``device_id``), and
nothing else is in flight while it does (``lessonlib.instruments.nccl_inflight``).

What batching costs: a receive is no longer posted ahead of the compute it feeds, so the
transfer is no longer hidden behind that compute, and a stage's batch waits until its
neighbour has finished its own compute of the round and posts the other end. The
frameworks (PyTorch's pipelining, Megatron-LM) accept that because a hang on the first
real cluster costs more than a few exposed transfers, and because at scale the transfers
of one boundary activation are small next to a stage's compute. The group's communicator
is made once, when the executor is built, by one all-gather of every stage's (dtype,
activation shape) on the group, which also checks that the stages agree.

One method per kind of action (``actions.Kind``). Around the loop, not in it: the recorder
the executor is handed (``recorder.no_record`` by default; a ``recorder.StageRecorder`` lines the
ranks up with a barrier, times every unit and leaves a breadcrumb each) gives the loop its
units; ``activations.ActivationMeter`` measures what is kept for backward (count, bytes; to W).
Inside a 3-D grid: ``stage_ranks`` (each stage's global rank), ``group`` and the chunks.

Laptop:  ``python -c "import lessonlib as L; from lessonlib.pipeline import schedule_runs;
         print(L.launch(schedule_runs.demo, 2))"``
GPU box: the same call runs on NCCL with one GPU per stage.
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from lessonlib import bug_switches, comm
from lessonlib.argcheck import positive_int
from lessonlib.device import current_device
from lessonlib.instruments import activations
from lessonlib.instruments.spans import Span
from lessonlib.pipeline.actions import Kind, place, placement_of, virtual_stage
from lessonlib.pipeline.split_backward import LayerOutputs, input_grad, weight_grad
from lessonlib.pipeline.recorder import no_record
from lessonlib.pipeline.validate import message_of, validate


@dataclass
class StepResult:
    """What one rank saw during one pipeline step."""
    stage: int
    losses: list[float]          # per micro-batch, unscaled (last stage only)
    spans: list[Span]            # seconds since the aligned start of the step
    wall_s: float                # this rank's time from the aligned start to its last wait
    peak_stash: int              # (micro-batch, chunk) activations held at once (executor)
    peak_stash_measured: int     # the same, counted from what autograd saved
    peak_stash_bytes: int        # bytes autograd saved for backward, at the peak


@dataclass
class _Step:
    """Per-step state: what is received, stashed, left unwaited (only under a bug switch)."""
    xs: list | None = None                         # the micro-batches (first stage)
    ys: list | None = None                         # their targets (last stage)
    inbox: dict = field(default_factory=dict)      # (kind, mb, chunk) -> received tensor
    stash: dict = field(default_factory=dict)      # (mb, chunk) -> (input, output or loss, layers)
    kept: dict = field(default_factory=dict)       # (mb, chunk) -> what its W needs
    grads: dict = field(default_factory=dict)      # (mb, chunk) -> input gradient to send
    late: list = field(default_factory=list)       # receives' handles parked by the bug switch
    losses: dict = field(default_factory=dict)
    peak: int = 0


def split_microbatches(name: str, batch: torch.Tensor, m: int) -> list[torch.Tensor]:
    """m equal micro-batches along dim 0. Uneven splits are rejected: a receiver must know
    a message's shape before it arrives, so every micro-batch has the same shape."""
    if batch is None:
        raise ValueError(f"this stage needs {name}= (the whole batch; it is cut into m={m} "
                         f"micro-batches here)")
    if batch.shape[0] % m:
        raise ValueError(f"{name} has {batch.shape[0]} rows, which m={m} micro-batches cannot "
                         f"split evenly; use a batch that is a multiple of {m}")
    return list(batch.chunk(m))


_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def _meta(dtype, shape, device) -> torch.Tensor:
    """(dtype code, rank of the shape, the shape padded to 8 dims) as one int64 message."""
    code = _DTYPES.index(dtype) if dtype in _DTYPES else len(_DTYPES)
    return torch.tensor([code, len(shape), *shape, *[0] * (8 - len(shape))],
                        dtype=torch.int64, device=device)


def _describe(meta: torch.Tensor) -> str:
    code, dims, *shape = meta.tolist()
    dtype = _DTYPES[code] if code < len(_DTYPES) else "another dtype"
    return f"{dtype} of shape {tuple(shape[:dims])}"


class PipelineExecutor:
    """Runs ``schedule`` (all stages' action lists) as stage ``stage`` of the pipeline.

    chunks:            this stage's modules, one per chunk (v of them; v=1: one stage)
    loss_fn:           (output, target) -> mean loss of one micro-batch (last stage)
    activation_shape:  shape of one micro-batch's tensor at every stage boundary, e.g.
                       (b, s, h); gradients have the same shape
    stage_ranks:       global rank of each stage (default: stage s is rank s)
    group:             the process group the pipeline's messages use (default: world)
    dtype:             of the activations and gradients that cross stages (default: the
                       dtype of this stage's first floating-point parameter)
    recorder:          units -> the units to run, in order, recording what it measures;
                       ``read()`` -> (spans, wall seconds) of the last step (default
                       ``recorder.no_record``: no barrier, no spans, wall time 0)
    """

    def __init__(self, schedule, stage: int, chunks, loss_fn, activation_shape, *,
                 stage_ranks=None, group=None, dtype=None, device=None, recorder=no_record):
        sim = validate(schedule)
        self.p, self.m, self.v = sim.p, sim.m, sim.v
        if not (isinstance(stage, int) and 0 <= stage < self.p):
            raise ValueError(f"stage must be in 0..{self.p - 1} for this {self.p}-stage "
                             f"schedule; got {stage!r}")
        chunks = list(chunks) if isinstance(chunks, (list, tuple)) else [chunks]
        if len(chunks) != self.v:
            raise ValueError(f"the schedule runs v={self.v} chunk(s) per stage but "
                             f"{len(chunks)} module(s) were given")
        for n in activation_shape:
            positive_int("each entry of activation_shape", n, what=f"{activation_shape!r}")
        ranks = list(stage_ranks) if stage_ranks is not None else list(range(self.p))
        if len(ranks) != self.p:
            raise ValueError(f"stage_ranks={ranks} must name one global rank per stage "
                             f"({self.p} of them)")
        if dist.is_initialized() and ranks[stage] != dist.get_rank():
            raise ValueError(f"stage_ranks[{stage}]={ranks[stage]} but this is rank "
                             f"{dist.get_rank()}: a rank can only run its own stage")
        self.schedule, self.stage, self.chunks = schedule, stage, chunks
        self.actions = schedule[stage]
        self.dtype = dtype or next((q.dtype for c in chunks for q in c.parameters()
                                    if q.is_floating_point()), torch.float32)
        self.loss_fn, self.shape = loss_fn, tuple(activation_shape)
        self.ranks, self.group, self.recorder = ranks, group, recorder
        self.device = device or current_device()
        self.units = sim.rounds[stage]       # computes, and the batches between them
        self.meter = activations.ActivationMeter(q for c in chunks for q in c.parameters())
        self.last, self.placement = self.p * self.v - 1, placement_of(schedule)
        self.split = {(a.microbatch, a.chunk) for a in self.actions if a.kind == Kind.W}
        self.layers = [LayerOutputs(c) for c in chunks] if self.split else None
        self.run = {Kind.F: self._forward, Kind.B: self._backward, Kind.W: self._weight}
        if dist.is_initialized() and self.p > 1:
            self._agree()

    # ------------------------------------------------------------ messages
    def _agree(self) -> None:
        """One all-gather of every stage's (dtype, shape) on the pipeline's group: it makes
        the group's communicator with every stage present, before any batch, and each stage
        checks that all the others carry what it does."""
        mine = _meta(self.dtype, self.shape, self.device)
        everyone = [torch.empty_like(mine) for _ in range(self.p)]
        comm.all_gather(everyone, mine, group=self.group)
        for rank, theirs in zip(sorted(self.ranks), everyone):   # the group's rank order
            other = self.ranks.index(rank)
            if not torch.equal(mine, theirs):
                raise ValueError(
                    f"pipeline stages {min(self.stage, other)} and {max(self.stage, other)} "
                    f"disagree on what crosses their links: stage {self.stage} has "
                    f"{_describe(mine)}, stage {other} has {_describe(theirs)}; give every "
                    f"stage the same activation_shape and dtype")

    def _outgoing(self, st: _Step, a) -> torch.Tensor:
        """SEND_F sends the output it stashed; SEND_B the input gradient B left for it."""
        key = (a.microbatch, a.chunk)
        tensor = st.stash[key][1] if a.kind == Kind.SEND_F else st.grads.pop(key)
        if tuple(tensor.shape) != self.shape or tensor.dtype != self.dtype:
            msg = message_of(a, self.stage, self.p, self.placement)
            raise ValueError(f"stage {self.stage} sends a {tensor.dtype} tensor of shape "
                             f"{tuple(tensor.shape)} for {msg.direction}{msg.microbatch}, but "
                             f"the link carries {self.dtype} of activation_shape={self.shape}; "
                             f"every stage boundary must carry that shape and dtype")
        return tensor.detach().contiguous()

    def _exchange(self, st: _Step, batch) -> None:
        """Post a batch's sends and receives as one batch_isend_irecv on the pipeline's
        group, and wait on every one of them before the next compute."""
        ops, arrivals = [], []
        for a in batch:
            if a.kind.is_send:
                ops.append(comm.send_op(self._outgoing(st, a), self.ranks[a.peer], self.group))
            else:
                buf = torch.empty(self.shape, dtype=self.dtype, device=self.device)
                ops.append(comm.recv_op(buf, self.ranks[a.peer], self.group))
                arrivals.append((a, buf))
        works = comm.batch_isend_irecv(ops)
        per_op = len(works) == len(ops)          # gloo: one handle per op; NCCL: one in all
        for work, op in zip(works, ops):
            receive = per_op and op.op is dist.irecv
            if receive and bug_switches.active("p2p_dropped_request"):
                st.late.append(work)
            else:
                work.wait()
        for a, buf in arrivals:
            st.inbox[a.kind.direction, a.microbatch, a.chunk] = buf

    # ------------------------------------------------------------ one method per kind
    def _neighbour(self, k: int) -> int | None:
        """The chunk that runs virtual stage k if it is on this stage (hand over in memory)."""
        device, chunk = place(k, self.p, self.placement)
        return chunk if 0 <= k <= self.last and device == self.stage else None

    def _forward(self, st: _Step, a) -> None:
        mb, chunk = a.microbatch, a.chunk
        k = virtual_stage(self.stage, chunk, self.p, self.placement)
        x = st.xs[mb] if k == 0 else st.inbox.pop(("F", mb, chunk)).requires_grad_(True)
        layers = self.layers[chunk].recording() if (mb, chunk) in self.split else nullcontext([])
        with self.meter.forward(), layers as outputs:
            out = self.chunks[chunk](x)
        if k == self.last:
            loss = self.loss_fn(out, st.ys[mb])
            st.losses[mb] = loss.detach()
            # sum of m scaled losses = the batch's mean loss
            out = loss if bug_switches.active("pipeline_loss_unscaled") else loss / self.m
        elif self._neighbour(k + 1) is not None:
            st.inbox["F", mb, self._neighbour(k + 1)] = out.detach()
        st.stash[mb, chunk] = (x, out, outputs)
        st.peak = max(st.peak, len(st.stash))

    def _backward(self, st: _Step, a) -> None:
        mb, chunk = a.microbatch, a.chunk
        k = virtual_stage(self.stage, chunk, self.p, self.placement)
        x, out, layers = st.stash[mb, chunk]
        grad_out = None if k == self.last else st.inbox.pop(("B", mb, chunk))
        if (mb, chunk) in self.split and k == 0:
            # The first virtual stage sends no input gradient: nobody waits for its B, so
            # B computes nothing and W runs the whole backward in one pass (as PyTorch's
            # stage does), instead of one pass for B and one per layer for W.
            dx, st.kept[mb, chunk] = None, grad_out
        elif (mb, chunk) in self.split:
            dx, st.kept[mb, chunk] = input_grad(out, grad_out, x, layers)
        else:
            del st.stash[mb, chunk]
            torch.autograd.backward(out, grad_out)
            dx = x.grad
        if k > 0 and self._neighbour(k - 1) is not None:
            st.inbox["B", mb, self._neighbour(k - 1)] = dx
        elif k > 0:
            st.grads[mb, chunk] = dx

    def _weight(self, st: _Step, a) -> None:
        key = (a.microbatch, a.chunk)
        kept = st.kept.pop(key)
        _, out, _ = st.stash.pop(key)
        if virtual_stage(self.stage, a.chunk, self.p, self.placement) == 0:
            torch.autograd.backward(out, kept)             # B left it the output gradient
        else:
            weight_grad(kept)

    def _microbatches(self, inputs, targets) -> tuple[list | None, list | None]:
        xs, ys = (t.to(self.device) if t is not None else None for t in (inputs, targets))
        last = place(self.last, self.p, self.placement)[0] == self.stage   # ZBV: stage 0
        return (split_microbatches("inputs", xs, self.m) if self.stage == 0 else None,
                split_microbatches("targets", ys, self.m) if last else None)

    def step(self, inputs=None, targets=None) -> StepResult:
        """One training step over m micro-batches. Stage 0 gets the whole batch's
        ``inputs``, the stage with the last chunk its ``targets``; gradients accumulate in
        ``.grad`` (zero them and step the optimizer outside, as with any model). The
        recorder hands out the units (it may line the ranks up and time each one)."""
        st = _Step(*self._microbatches(inputs, targets))
        for unit in self.recorder(self.units):
            if isinstance(unit, list):
                self._exchange(st, unit)
            else:
                self.run[unit.kind](st, unit)
        for work in st.late:
            work.wait()
        return self._result(st)

    def _result(self, st: _Step) -> StepResult:
        """The step's losses, the recorder's spans and wall time, the stash's peaks (then
        reset, for the next step)."""
        spans, wall = self.recorder.read()
        losses = [float(st.losses[i]) for i in sorted(st.losses)]
        result = StepResult(self.stage, losses, spans, wall, st.peak,
                            self.meter.peak_groups, self.meter.peak_bytes)
        self.meter.reset()
        return result
