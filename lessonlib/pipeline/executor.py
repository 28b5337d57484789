"""Run a pipeline schedule on real ranks with point-to-point messages, and time every step.

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
* SEND_* / RECV_*: ``comm.isend`` / ``comm.irecv``, and every request is waited on.

No deadlock, on gloo or NCCL: sends never block the loop (isend, waited at the end), and
the two ends of each link issue their sends and receives in one order they both derive from
the schedule (``validate.link_orders``). NCCL pairs point-to-point messages by order, so
that agreement is what makes it safe; receives are posted as early as that order allows,
so data usually arrives before it is needed. Under NCCL the first message on a link
creates that link's communicator and blocks until the other end joins, so the executor
opens every link when it is built, in one order all stages share (lowest pair first),
before any receive is posted: interleaved 1F1B's wrap-around link (0, p-1) would
otherwise deadlock at p >= 3 (``lessonlib.nccl_rules``); the opening messages also check
that both ends agree on the dtype and activation shape.

One method per kind of action (``actions.Kind``). Around the loop, not in it: the given
``timeline.Timeline`` times every action (from a barrier that lines the ranks up) and leaves a
breadcrumb each; ``stash.StashMeter`` measures what is kept for backward (count, bytes; to W).
Inside a 3-D grid: ``stage_ranks`` (each stage's global rank), ``group`` and the chunks.

Laptop:  ``python -c "import lessonlib as L; from lessonlib.pipeline import runs;
         print(L.launch(runs.demo, 2))"``
GPU box: the same call runs on NCCL with one GPU per stage.
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from lessonlib import bugs, comm, stash
from lessonlib.argcheck import positive_int
from lessonlib.device import current_device
from lessonlib.pipeline.actions import Kind, place, placement_of, virtual_stage
from lessonlib.pipeline.split_backward import LayerOutputs, input_grad, weight_grad
from lessonlib.pipeline.timeline import Timeline
from lessonlib.pipeline.validate import link_orders, message_of, validate
from lessonlib.spans import Span


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
    """Per-step state: what is posted on each link, received, stashed, in flight."""
    xs: list | None = None                         # the micro-batches (first stage)
    ys: list | None = None                         # their targets (last stage)
    ptr: dict = field(default_factory=dict)        # link -> next op in its order
    posted: dict = field(default_factory=dict)     # Message -> (buffer, work)
    inbox: dict = field(default_factory=dict)      # (kind, mb, chunk) -> received tensor
    stash: dict = field(default_factory=dict)      # (mb, chunk) -> (input, output or loss, layers)
    kept: dict = field(default_factory=dict)       # (mb, chunk) -> what its W needs
    grads: dict = field(default_factory=dict)      # (mb, chunk) -> input gradient to send
    pending: list = field(default_factory=list)    # (work, tensor) of unfinished sends
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
    recorder:          (label, device, on) -> a ``Timeline`` (the default) for each step
    """

    def __init__(self, schedule, stage: int, chunks, loss_fn, activation_shape, *,
                 stage_ranks=None, group=None, dtype=None, device=None, recorder=Timeline):
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
        self.links = {k: ops for k, ops in sorted(link_orders(schedule).items()) if stage in k}
        self.meter = stash.StashMeter(q for c in chunks for q in c.parameters())
        self.last, self.placement = self.p * self.v - 1, placement_of(schedule)
        self.split = {(a.microbatch, a.chunk) for a in self.actions if a.kind == Kind.W}
        self.layers = [LayerOutputs(c) for c in chunks] if self.split else None
        self.run = {Kind.F: self._forward, Kind.B: self._backward, Kind.W: self._weight,
                    Kind.RECV_F: self._receive, Kind.RECV_B: self._receive,
                    Kind.SEND_F: self._send_output, Kind.SEND_B: self._send_output}
        if dist.is_initialized():
            self._open_links()

    # ------------------------------------------------------------ links
    def _open_links(self) -> None:
        """One blocking message each way on every link, lowest pair first on every stage
        (the order is global, so no stage can wait on one that waits on it). Under NCCL
        this creates each link's communicator; each end sends its (dtype, shape) and both
        check that they agree."""
        mine = _meta(self.dtype, self.shape, self.device)
        for a, b in self.links:                       # sorted: (0, 1) < (0, p-1) < (1, 2) ...
            other = self.ranks[b if self.stage == a else a]
            theirs = torch.empty_like(mine)
            for sender in (a, b):
                if sender == self.stage:
                    comm.send(mine, other, group=self.group)
                else:
                    comm.recv(theirs, other, group=self.group)
            if not torch.equal(mine, theirs):
                raise ValueError(
                    f"pipeline stages {a} and {b} disagree on what crosses their link: stage "
                    f"{self.stage} has {_describe(mine)}, stage {a + b - self.stage} has "
                    f"{_describe(theirs)}; give every stage the same activation_shape and dtype")

    # ------------------------------------------------------------ messages
    def _post_receives(self, st: _Step, link) -> None:
        """Post every receive at the head of the link's order, up to our next send."""
        ops, i = self.links[link], st.ptr.get(link, 0)
        while i < len(ops) and ops[i].dst == self.stage:
            buf = torch.empty(self.shape, dtype=self.dtype, device=self.device)
            st.posted[ops[i]] = (buf, comm.irecv(buf, self.ranks[ops[i].src], group=self.group))
            i += 1
        st.ptr[link] = i

    def _send(self, st: _Step, a, tensor: torch.Tensor) -> None:
        msg = message_of(a, self.stage, self.p, self.placement)
        if tuple(tensor.shape) != self.shape or tensor.dtype != self.dtype:
            raise ValueError(f"stage {self.stage} sends a {tensor.dtype} tensor of shape "
                             f"{tuple(tensor.shape)} for {msg.direction}{msg.microbatch}, but "
                             f"the link carries {self.dtype} of activation_shape={self.shape}; "
                             f"every stage boundary must carry that shape and dtype")
        link = (min(msg.src, msg.dst), max(msg.src, msg.dst))
        ops, i = self.links[link], st.ptr.get(link, 0)
        if i >= len(ops) or ops[i] != msg:
            raise RuntimeError(f"stage {self.stage}: link order broken at {msg}")
        tensor = tensor.detach().contiguous()
        st.pending.append((comm.isend(tensor, self.ranks[msg.dst], group=self.group), tensor))
        st.ptr[link] = i + 1
        self._post_receives(st, link)
        while st.pending and st.pending[0][0].is_completed():
            st.pending.pop(0)[0].wait()

    # ------------------------------------------------------------ one method per kind
    def _receive(self, st: _Step, a) -> None:
        buf, work = st.posted.pop(message_of(a, self.stage, self.p, self.placement))
        st.pending.append((work, buf)) if bugs.active("p2p_dropped_request") else work.wait()
        st.inbox[a.kind.direction, a.microbatch, a.chunk] = buf

    def _send_output(self, st: _Step, a) -> None:
        """SEND_F sends the output it stashed; SEND_B the input gradient B left for it."""
        key = (a.microbatch, a.chunk)
        self._send(st, a, st.stash[key][1] if a.kind == Kind.SEND_F else st.grads.pop(key))

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
            out = loss if bugs.active("pipeline_loss_unscaled") else loss / self.m
        elif self._neighbour(k + 1) is not None:
            st.inbox["F", mb, self._neighbour(k + 1)] = out.detach()
        st.stash[mb, chunk] = (x, out, outputs)
        st.peak = max(st.peak, len(st.stash))

    def _backward(self, st: _Step, a) -> None:
        mb, chunk = a.microbatch, a.chunk
        k = virtual_stage(self.stage, chunk, self.p, self.placement)
        x, out, layers = st.stash[mb, chunk]
        grad_out = None if k == self.last else st.inbox.pop(("B", mb, chunk))
        if (mb, chunk) in self.split:         # k = 0: W runs the whole backward from grad_out
            dx, st.kept[mb, chunk] = input_grad(out, grad_out, x, layers) if k else (None, grad_out)
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
        kept, (_, out, _) = st.kept.pop(key), st.stash.pop(key)
        if virtual_stage(self.stage, a.chunk, self.p, self.placement) == 0:
            return torch.autograd.backward(out, kept)      # B left it the output gradient
        weight_grad(kept)

    def _microbatches(self, inputs, targets) -> tuple[list | None, list | None]:
        xs, ys = (t.to(self.device) if t is not None else None for t in (inputs, targets))
        last = place(self.last, self.p, self.placement)[0] == self.stage   # ZBV: stage 0
        return (split_microbatches("inputs", xs, self.m) if self.stage == 0 else None,
                split_microbatches("targets", ys, self.m) if last else None)

    def step(self, inputs=None, targets=None, align: bool = True,
             timeline: bool = True) -> StepResult:
        """One training step over m micro-batches. Stage 0 gets the whole batch's
        ``inputs``, the stage with the last chunk its ``targets``; gradients accumulate in
        ``.grad`` (zero them and step the optimizer outside, as with any model).

        ``align``: start with a barrier of the pipeline's group, so the ranks' timelines
        share a zero. ``timeline``: time every action; False skips it (the spans are then
        empty and ``wall_s`` is 0)."""
        st = _Step(*self._microbatches(inputs, targets))
        if align:
            comm.barrier(self.group)
        clock = self.recorder(f"pipeline stage {self.stage}", self.device, timeline)
        self.meter.reset_peaks()
        clock.start()
        for link in self.links:
            self._post_receives(st, link)
        for a in self.actions:
            with clock.action(a):
                self.run[a.kind](st, a)
        with clock.span("WAIT_SENDS"):
            for work, _ in st.pending:
                work.wait()
        spans, wall = clock.read()
        losses = [float(st.losses[i]) for i in sorted(st.losses)]
        return StepResult(self.stage, losses, spans, wall, st.peak,
                          self.meter.peak_groups, self.meter.peak_bytes)
