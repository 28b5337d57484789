"""The validator: prove a pipeline schedule runs before any process starts, and play it.

One job: everything the course knows about a schedule without running it, on one schedule
read once. Because a schedule is data, it can be proven right and played before any process
starts. Three steps, each a section of this module, and ``validate``, the one call the
executor makes before running:

1. ``check``, the static rules: every stage's action list is read and rejected, naming the
   stage and the action, for a backward before its forward, a W before its B, a forward
   whose input never arrives, a send nobody receives or a message to the wrong stage.
2. ``simulate`` plays the schedule as a discrete-event simulation: F, B and W take given
   times, a send never waits for its receiver (the message waits in the link, as an isend
   does; it may cost its sender a given time to copy out), a receive waits until its
   message has been sent plus ``latency``. If at some point no stage can move, the schedule
   deadlocks and the error says where each stage is stuck. Otherwise it reports, per stage:

   * ``bubble``: idle share of the step's wall time, (p-1)/(m+p-1) for GPipe and 1F1B with
     balanced stages (GPipe, Huang et al. 2019, §2.3), and ``bubble_ideal``: idle time over
     busy time, Megatron-LM 2021's (p-1)/m (§2.2);
   * ``idle``: the same bubble in time units, e.g. (p-1)(T_F + T_B - T_W) per stage for
     ZB-H1 (Qi et al. 2024, Table 2) against 1F1B's (p-1)(T_F + T_B + T_W);
   * ``peak_stash``: the most (micro-batch, chunk) activations held at once, min(p - s, m)
     for 1F1B and m for GPipe (PipeDream-Flush, Narayanan et al. 2021, §3.2); a micro-batch
     whose backward is split stays held until its W, which needs what B kept.

   ``replay`` plays any schedule on one run's measured times per virtual stage, so that two
   schedules are compared on the same times rather than through two noisy runs.
3. The executor's rounds. NCCL runs one communicator's work in order, and two communicators
   busy at once on a GPU can deadlock (NCCL user guide, "Using multiple NCCL communicators
   concurrently"). So the executor posts its transfers as PyTorch's ``PipelineScheduleMulti``
   does: in rounds. Each round, every stage runs its next compute, then posts one
   ``batch_isend_irecv`` on the pipeline group with the sends of what it computed and the
   receives of what its neighbours computed, and waits for all of it before computing again
   (``lockstep``). One batch per gap between a stage's own computes would not do:
   interleaved 1F1B would deadlock, and ZBV's messages would pair wrongly, because a stage
   lists its receives in another order than its neighbour sends them (``batched`` builds
   that naive grouping, for the tests that show it). ``check_batches`` plays blocking
   batches without processes: a batch ends when every message in it meets its other end in
   the other stage's current batch; if no stage can move, it names where each is stuck.

Laptop:  ``python -m lessonlib.pipeline.validate`` simulates GPipe and 1F1B for p=4, m=8.
GPU box: the same (pure Python).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

from lessonlib.argcheck import positive_int
from lessonlib.instruments.spans import Span
from lessonlib.pipeline.actions import (COMPUTE, KINDS, Action, Kind, place, placement_of,
                                        virtual_stage)


class ScheduleError(ValueError):
    """A schedule that cannot run as written; the message names the stage and action."""


@dataclass(frozen=True)
class Message:
    """Activation ("F") or gradient ("B") of ``microbatch`` leaving virtual stage ``vstage``."""
    direction: str
    microbatch: int
    vstage: int
    src: int
    dst: int


# ---------------------------------------------------------------- 1. the static rules
def where(stage: int, index: int, action: Action) -> str:
    return f"stage {stage}, action {index} ({action})"


def message_of(action: Action, stage: int, p: int, placement: str = "loop") -> Message:
    """The message a SEND puts on a link, or a RECV takes from it."""
    k = virtual_stage(stage, action.chunk, p, placement)
    sender = {"SEND_F": k, "SEND_B": k, "RECV_F": k - 1, "RECV_B": k + 1}[action.kind]
    src, dst = (stage, action.peer) if action.kind.is_send else (action.peer, stage)
    return Message(action.kind.direction, action.microbatch, sender, src, dst)


def _count(name, value) -> None:
    if value is not None:
        try:
            positive_int(name, value, what="or None to read it from the actions")
        except ValueError as exc:
            raise ScheduleError(str(exc)) from None


def _shape(schedule, m, v) -> tuple[int, int, int]:
    _count("m", m)
    _count("v", v)
    if not isinstance(schedule, (list, tuple)) or not schedule:
        raise ScheduleError("a schedule is a non-empty list with one list of actions per stage")
    for s, actions in enumerate(schedule):
        if not isinstance(actions, (list, tuple)):
            raise ScheduleError(f"stage {s}: {actions!r:.40} is not a list of actions")
        for i, a in enumerate(actions):
            if not isinstance(a, Action):
                raise ScheduleError(f"stage {s}, action {i}: {a!r} is not an Action")
            if a.kind not in KINDS:
                raise ScheduleError(f"{where(s, i, a)}: kind {a.kind!r} is not one of {KINDS}")
            if not all(isinstance(x, numbers.Integral) and not isinstance(x, bool)
                       for x in (a.microbatch, a.chunk)) or not (a.peer is None or (
                    isinstance(a.peer, numbers.Integral) and not isinstance(a.peer, bool))):
                raise ScheduleError(f"{where(s, i, a)}: micro-batch, chunk and peer must be "
                                    f"integers")
    found = [a for actions in schedule for a in actions]
    m = m if m is not None else 1 + max((a.microbatch for a in found), default=-1)
    v = v if v is not None else 1 + max((a.chunk for a in found), default=0)
    if m < 1:
        raise ScheduleError("the schedule has no actions at all")
    return len(schedule), m, v


def check(schedule, m: int | None = None, v: int | None = None) -> tuple[int, int, int]:
    """Static checks; returns (p, m, v) or raises ScheduleError naming the first problem.

    m and v are read from the actions unless given (give them to catch a micro-batch or a
    chunk that is missing everywhere)."""
    p, m, v = _shape(schedule, m, v)
    last, placement = p * v - 1, placement_of(schedule)
    sends, recvs = {}, {}
    for s, actions in enumerate(schedule):
        seen: dict[tuple, int] = {}
        for i, a in enumerate(actions):
            if not (0 <= a.microbatch < m and 0 <= a.chunk < v):
                raise ScheduleError(f"{where(s, i, a)}: micro-batch must be in 0..{m - 1} "
                                    f"and chunk in 0..{v - 1}")
            if (a.kind, a.microbatch, a.chunk) in seen:
                raise ScheduleError(f"{where(s, i, a)}: runs twice (also action "
                                    f"{seen[a.kind, a.microbatch, a.chunk]})")
            seen[a.kind, a.microbatch, a.chunk] = i
            _check_slot(s, i, a, actions)
            if a.kind in COMPUTE:
                if a.peer is not None:
                    raise ScheduleError(f"{where(s, i, a)}: F, B and W have no peer")
                continue
            k = virtual_stage(s, a.chunk, p, placement)
            outgoing = a.kind in ("SEND_F", "RECV_B")   # towards virtual stage k + 1
            if (outgoing and k == last) or (not outgoing and k == 0):
                end = "last" if outgoing else "first"
                raise ScheduleError(f"{where(s, i, a)}: virtual stage {k} is the {end} one; it "
                                    f"has no neighbour there to exchange {a.kind.direction} with")
            want = place(k + 1 if outgoing else k - 1, p, placement)[0]
            if a.peer != want or want == s:
                who = "this stage: they hand over in memory" if want == s else f"stage {want}"
                raise ScheduleError(f"{where(s, i, a)}: the neighbour of virtual stage {k} "
                                    f"in that direction is {who}, not {a.peer}")
            (sends if a.kind.is_send else recvs)[message_of(a, s, p, placement)] = (s, i, a)
        for mb in range(m):
            for c in range(v):
                _check_unit(s, p, v, mb, c, seen, actions, placement)
    for book, other, verb in ((sends, recvs, "receives"), (recvs, sends, "sends")):
        for msg, (s, i, a) in book.items():
            if msg not in other:
                who = a.peer
                raise ScheduleError(f"{where(s, i, a)}: stage {who} never {verb} it")
    return p, m, v


def _check_slot(s, i, a, actions) -> None:
    """An action marked ``overlap`` is an F with its B right after it (one F&B slot), and
    that B is not the F's own backward, which cannot start before the F ends."""
    if not isinstance(a.overlap, bool):
        raise ScheduleError(f"{where(s, i, a)}: overlap must be True or False")
    if not a.overlap:
        return
    partner = actions[i + 1] if i + 1 < len(actions) else None
    if a.kind != "F" or partner is None or partner.kind != "B" or partner.overlap:
        raise ScheduleError(f"{where(s, i, a)}: only an F is overlapped, with the B that "
                            f"follows it at once (an F&B slot); here it is followed by "
                            f"{partner or 'nothing'}")
    if (partner.microbatch, partner.chunk) == (a.microbatch, a.chunk):
        raise ScheduleError(f"{where(s, i, a)}: a slot cannot overlap a micro-batch's forward "
                            f"with its own backward, which needs the forward's output")


def _check_unit(s, p, v, mb, c, seen, actions, placement="loop"):
    """Stage s's actions for micro-batch mb of chunk c: present, once, in a possible order."""
    k, last = virtual_stage(s, c, p, placement), p * v - 1
    name = f"micro-batch {mb}" + (f" (chunk {c})" if v > 1 else "")
    at = {kind: seen.get((kind, mb, c)) for kind in KINDS}
    remote_in = k > 0 and place(k - 1, p, placement)[0] != s
    remote_out = k < last and place(k + 1, p, placement)[0] != s
    for kind, needed, what in (("F", True, "forward"), ("B", True, "backward"),
                               ("RECV_F", remote_in, "receive of its input (RECV_F)"),
                               ("SEND_F", remote_out, "send of its output (SEND_F)"),
                               ("RECV_B", remote_out, "receive of its output gradient (RECV_B)"),
                               ("SEND_B", remote_in, "send of its input gradient (SEND_B)")):
        if needed and at[kind] is None:
            raise ScheduleError(f"stage {s} never runs the {what} of {name}")
    for kind, needed in (("RECV_F", remote_in), ("SEND_F", remote_out),
                         ("RECV_B", remote_out), ("SEND_B", remote_in)):
        if at[kind] is not None and not needed:
            i = at[kind]
            raise ScheduleError(f"{where(s, i, actions[i])}: virtual stage {k} has no "
                                f"neighbour on another stage to exchange it with")
    handoffs = []          # a neighbour on this same device: its action must come first
    if k > 0 and not remote_in:
        handoffs.append(("F", place(k - 1, p, placement)[1], "F", "its input"))
    if k < last and not remote_out:
        handoffs.append(("B", place(k + 1, p, placement)[1], "B", "its output gradient"))
    for kind, chunk, mine, what in handoffs:
        first, then = seen.get((kind, mb, chunk)), at[mine]
        if first is not None and then is not None and then < first:
            raise ScheduleError(f"{where(s, then, actions[then])}: {what} comes from chunk "
                                f"{chunk} on this stage, which runs it later (action {first})")
    for before, after, why in (("F", "B", "its backward comes before its forward"),
                               ("B", "W", "its weight gradient (W) comes before its B"),
                               ("RECV_F", "F", "its forward runs before its input arrives"),
                               ("F", "SEND_F", "it sends its output before computing it"),
                               ("RECV_B", "B", "its backward runs before its gradient arrives"),
                               ("B", "SEND_B", "it sends its input gradient before computing it")):
        if at[before] is not None and at[after] is not None and at[after] < at[before]:
            i = at[after]
            raise ScheduleError(f"{where(s, i, actions[i])}: {why} (action {at[before]})")


# ---------------------------------------------------------------- 2. the play in time
@dataclass
class Simulation:
    """A schedule played in time, per stage; from ``validate``, also the executor's rounds."""
    p: int
    m: int
    v: int
    timelines: list[list[Span]]
    makespan: float
    bubble: list[float]         # idle / makespan per stage ("wall" convention)
    bubble_ideal: list[float]   # idle / busy per stage ("ideal" convention)
    idle: list[float]           # makespan - busy per stage (the bubble in time units)
    peak_stash: list[int]       # (micro-batch, chunk) activations held at once per stage
    sends: list[tuple[float, Message]]  # every message with its send time, in send order
    rounds: list[list] = field(default_factory=list)  # per stage, as ``lockstep`` (validate)


def _time(name, value) -> float:
    """A duration: a finite number >= 0, else ScheduleError naming the setting."""
    if (isinstance(value, bool) or not isinstance(value, numbers.Real)
            or not math.isfinite(value) or value < 0):
        raise ScheduleError(f"{name}={value!r} must be a finite time >= 0 (or, for forward, "
                            f"backward, weight and send, a function (stage, action) -> such a "
                            f"time)")
    return float(value)


def _cost(name, cost, stage, action) -> float:
    if callable(cost):
        return _time(f"{name}({stage}, {action})", cost(stage, action))
    return float(cost)


def _finite_makespan(clock, times: dict) -> float:
    """The step's length; ScheduleError if the times add up past the largest float, which
    would make every bubble inf - inf = nan."""
    makespan = max(clock)
    if math.isfinite(makespan):
        return makespan
    said = ", ".join(f"{name}=" + ("a function" if callable(value) else repr(value))
                     for name, value in times.items())
    raise ScheduleError(f"the times ({said}) add up past the largest float (about 1.8e308) "
                        f"in this schedule, so its bubble would be nan; use smaller units "
                        f"(ms instead of s, or every time scaled down by the same factor)")


def simulate(schedule, forward=1.0, backward=2.0, latency=0.0, send=0.0, weight=1.0,
             m: int | None = None, v: int | None = None, whole=None,
             overlapped=None) -> Simulation:
    """Check, then play the schedule; raise ScheduleError if it deadlocks.

    ``forward``/``backward``/``weight``: time of one F/B/W action (one chunk), a number or a
    function (stage, action) -> time; where a W is split off, ``backward`` is the time of
    the input gradient alone, and ``whole`` (default ``backward``) that of a B with no W
    split off, in a schedule that has both (DualPipeV). ``send``: time a send keeps its stage busy (copying the
    message out), the same kind of value; ``latency``: time from the end of a send to the
    matching receive. ``overlapped``: time of an F&B slot (an F marked ``overlap`` and its
    B), a number or a function (stage, F action, B action) -> time; None: the F's time plus
    the B's, the two run one after the other (nothing of either is hidden). Both of a slot's
    spans cover the whole slot; busy time counts it once."""
    costs = {Kind.F: ("forward", forward), Kind.B: ("backward", backward),
             Kind.W: ("weight", weight), "whole": ("whole", backward if whole is None else whole)}
    for name, value in (*costs.values(), ("send", send), ("latency", latency),
                        ("overlapped", overlapped)):
        if (name != "overlapped" or value is not None) and (name == "latency"
                                                            or not callable(value)):
            _time(name, value)
    p, m, v = check(schedule, m, v)
    placement = placement_of(schedule)
    split = {(s, a.microbatch, a.chunk) for s, actions in enumerate(schedule)
             for a in actions if a.kind == Kind.W}

    def price(s, x):                      # a B with no W split off takes ``whole``
        unsplit = x.kind == Kind.B and (s, x.microbatch, x.chunk) not in split
        return _cost(*costs["whole" if unsplit else x.kind], s, x)

    clock, pos = [0.0] * p, [0] * p
    spans: list[list[Span]] = [[] for _ in range(p)]
    held, peak = [0] * p, [0] * p
    sent: dict[Message, float] = {}
    order: list[tuple[float, int, int, Message]] = []
    moved = True
    while moved:
        moved = False
        for s in range(p):
            while pos[s] < len(schedule[s]):
                a = schedule[s][pos[s]]
                start = clock[s]
                if a.kind.is_recv:
                    msg = message_of(a, s, p, placement)
                    if msg not in sent:
                        break
                    end = max(start, sent[msg] + latency)
                elif a.kind.is_send:
                    msg = message_of(a, s, p, placement)
                    sent[msg] = end = start + _cost("send", send, s, a)
                    order.append((start, s, pos[s], msg))
                else:
                    slot = schedule[s][pos[s]:pos[s] + 1 + a.overlap]   # F& and its B
                    end = start + _slot_time(slot, price, overlapped, s)
                    for x in slot:
                        frees = Kind.W if (s, x.microbatch, x.chunk) in split else Kind.B
                        held[s] += 1 if x.kind == Kind.F else -(x.kind == frees)
                        peak[s] = max(peak[s], held[s])
                        spans[s].append(Span(str(x.kind), x.microbatch, x.chunk, start, end))
                    clock[s], pos[s], moved = end, pos[s] + len(slot), True
                    continue
                spans[s].append(Span(str(a.kind), a.microbatch, a.chunk, start, end))
                clock[s], pos[s], moved = end, pos[s] + 1, True
    if any(pos[s] < len(schedule[s]) for s in range(p)):
        stuck = []
        for s in range(p):
            if pos[s] < len(schedule[s]):
                a = schedule[s][pos[s]]
                what = "activation" if a.kind == "RECV_F" else "gradient"
                stuck.append(f"{where(s, pos[s], a)} waits for the {what} of micro-batch "
                             f"{a.microbatch} from stage {a.peer}")
        raise ScheduleError("deadlock: every unfinished stage waits for a message from a stage "
                            "that is itself stuck.\n  " + "\n  ".join(stuck))
    times = {"forward": forward, "backward": backward, "weight": weight, "send": send,
             "latency": latency, "whole": whole, "overlapped": overlapped}
    makespan = _finite_makespan(clock, {k: x for k, x in times.items() if x is not None})
    busy = [busy_time(line) for line in spans]
    return Simulation(p, m, v, spans, makespan,
                      [1 - b / makespan if makespan else 0.0 for b in busy],
                      [(makespan - b) / b if b else 0.0 for b in busy],
                      [makespan - b for b in busy],
                      peak, [(t, msg) for t, _, _, msg in sorted(order)])


def _slot_time(slot, price, overlapped, stage) -> float:
    """One compute alone, or an F&B slot: ``overlapped`` (default: the sum of the two)."""
    if len(slot) == 1 or overlapped is None:
        return sum(price(stage, x) for x in slot)
    return _cost("overlapped", overlapped if not callable(overlapped)
                 else (lambda s, f: overlapped(s, f, slot[1])), stage, slot[0])


def busy_time(line: list[Span]) -> float:
    """Time a stage spends computing: the union of its F, B and W spans (an F&B slot's two
    spans cover the same interval and count once)."""
    total, reach = 0.0, -math.inf
    for x in sorted((x for x in line if x.kind in COMPUTE), key=lambda x: x.start):
        total += max(0.0, x.end - max(x.start, reach))
        reach = max(reach, x.end)
    return total


@dataclass(frozen=True)
class StageTimes:
    """Measured ms per virtual stage, in the model's order, of F, B and W (what ``replay``
    plays; ``schedule_runs.explain_bubble``'s record carries the same three fields)."""
    forward_ms: list
    backward_ms: list
    weight_ms: list


def replay(schedule, stage_ms: StageTimes) -> Simulation:
    """``schedule`` played on one run's measured times, so that schedules compare on the
    same times, without the noise of separate runs. ``stage_ms``: a record with
    ``forward_ms``, ``backward_ms`` and ``weight_ms``, lists by the measured run's virtual
    stage, in the model's order (``StageTimes``, or ``schedule_runs.explain_bubble``'s
    record; one per stage for a run with one chunk per device).

    Each virtual stage of ``schedule`` takes the times of the measured virtual stage that
    holds its layers, shared evenly among the virtual stages cut from it: on a ZB-H1 run's
    two stages, ZBV's virtual stages 0 and 3, both on device 0, take half of stage 0's and
    half of stage 1's times. A schedule without W runs B + W as one backward."""
    p, _, v = check(schedule)
    f, b, w = (list(t) for t in (stage_ms.forward_ms, stage_ms.backward_ms, stage_ms.weight_ms))
    if (p * v) % len(f):
        raise ScheduleError(f"a run measured on {len(f)} virtual stages cannot be cut evenly "
                            f"into this schedule's p*v = {p * v}; replay it on a run whose "
                            f"virtual stages divide p*v")
    cut, placement = p * v // len(f), placement_of(schedule)
    fused = not any(a.kind == Kind.W for actions in schedule for a in actions)

    def share(*times):       # (device, action) -> its virtual stage's share of the times
        return lambda s, a: sum(t[virtual_stage(s, a.chunk, p, placement) // cut]
                                for t in times) / cut

    return simulate(schedule, forward=share(f), backward=share(b, w) if fused else share(b),
                    weight=share(w))


def bubble_of(timelines: list[list[Span]], wall: float | None = None) -> list[float]:
    """Idle share of wall time per stage from timelines that start at 0 (simulated or
    measured): 1 - (time in F and B) / wall, wall = the latest end over all stages
    unless given."""
    if wall is None:
        wall = max((x.end for line in timelines for x in line), default=0.0)
    return [1 - busy_time(line) / wall if wall else 0.0 for line in timelines]


# ---------------------------------------------------------------- 3. the executor's rounds
def batched(actions) -> list:
    """A stage's actions as the executor runs them: each compute alone, and each run of
    consecutive sends and receives between two computes as one list (one batch)."""
    units: list = []
    for a in actions:
        if a.kind in COMPUTE:
            units.append(a)
        elif units and isinstance(units[-1], list):
            units[-1].append(a)
        else:
            units.append([a])
    return units


def _link_order_agrees(schedule, p: int, placement: str) -> None:
    """Each stage sends a neighbour its messages in the order the neighbour receives them
    (NCCL meets the n-th send with the n-th receive, not by name)."""
    order: dict = {}
    for s, actions in enumerate(schedule):
        for a in actions:
            if a.kind.is_send or a.kind.is_recv:
                msg = message_of(a, s, p, placement)
                order.setdefault((msg.src, msg.dst, a.kind.is_send), []).append(msg)
    for (src, dst, is_send), sent in order.items():
        got = order.get((src, dst, False), [])
        if is_send and got != sent:
            first = next(i for i, (x, y) in enumerate(zip(sent + [None], got + [None])) if x != y)
            name = [f"{x.direction}{x.microbatch} of virtual stage {x.vstage}" if x else "nothing"
                    for x in ((sent + [None])[first], (got + [None])[first])]
            raise ScheduleError(
                f"stage {src} sends stage {dst} its messages in another order than stage {dst} "
                f"receives them (message #{first}: {name[0]} sent, {name[1]} expected); NCCL "
                f"pairs messages by order, so each stage must receive in its neighbour's send "
                f"order")


def _plan(actions) -> list[tuple]:
    """(the computes of one slot, the receives they need, the sends that follow them) for
    each slot: one compute, or an F&B slot's two, with no batch between them."""
    plan, needs = [], []
    for a in actions:
        if a.kind in COMPUTE and plan and plan[-1][0][-1].overlap:
            plan[-1][0].append(a)                     # the B beside an overlapped F
        elif a.kind in COMPUTE:
            plan.append(([a], needs, []))
            needs = []
        elif a.kind.is_recv:
            needs.append(a)
        else:
            plan[-1][2].append(a)
    return plan


def lockstep(schedule) -> list[list]:
    """Each stage's actions as the executor runs them: its computes in the schedule's order,
    and between them at most one batch of sends and receives, grouped by rounds as
    PyTorch's ``PipelineScheduleMulti`` does. In each round every stage runs its next
    compute (or F&B slot: its two computes one after the other, as PyTorch's runtime runs
    an OVERLAP_F_B) if the messages it needs arrived in an earlier round, then posts one
    batch: the sends of what it just computed and the receives of what its neighbours just
    computed.
    Both ends of every message are in the batches of one round, in one order, so no batch
    waits on a later one (``check_batches`` plays it)."""
    check(schedule)
    return _rounds(schedule)


def _rounds(schedule) -> list[list]:
    """``lockstep`` of a schedule already checked."""
    p, placement = len(schedule), placement_of(schedule)
    plans = [_plan(actions) for actions in schedule]
    recv_of = {message_of(a, s, p, placement): a for s, actions in enumerate(schedule)
               for a in actions if a.kind.is_recv}
    units: list[list] = [[] for _ in range(p)]
    pos, arrived = [0] * p, [set() for _ in range(p)]
    while any(pos[s] < len(plans[s]) for s in range(p)):
        batch: dict[int, list] = {}
        for s in range(p):
            if pos[s] == len(plans[s]):
                continue
            computes, needs, sends = plans[s][pos[s]]
            if all(message_of(a, s, p, placement) in arrived[s] for a in needs):
                units[s].extend(computes)
                pos[s] += 1
                batch.setdefault(s, []).extend(sends)
        if not batch:
            raise ScheduleError("deadlock: no stage can compute (see simulate)")
        for s, ops in list(batch.items()):
            for a in [a for a in ops if a.kind.is_send]:
                msg = message_of(a, s, p, placement)
                batch.setdefault(msg.dst, []).append(recv_of[msg])
                arrived[msg.dst].add(msg)
        for s, ops in sorted(batch.items()):
            if ops:
                units[s].append(ops)
    return units


def check_batches(schedule, units=None) -> None:
    """Raise ScheduleError if blocking batches would deadlock or pair the wrong messages.

    ``units``: each stage's computes and batches (default: ``lockstep``; ``batched`` is the
    naive grouping). The executor posts each batch as one ``batch_isend_irecv`` and waits on
    all of it before its next compute. Each send or receive completes once its other end
    is posted too (the ops of one batch progress independently), and the batch once all of
    its ops have. This plays that: every stage computes up to its next batch; the ops whose
    other ends are posted complete; the batches left with nothing to wait for end; repeat."""
    p, placement = len(schedule), placement_of(schedule)
    units = lockstep(schedule) if units is None else units
    _link_order_agrees([[a for u in line if isinstance(u, list) for a in u] for line in units],
                       p, placement)
    pos, met, moved = [0] * p, set(), True
    while moved:
        for s in range(p):                      # computes need nothing from the others here
            while pos[s] < len(units[s]) and not isinstance(units[s][pos[s]], list):
                pos[s] += 1
        waiting = {s: {(message_of(a, s, p, placement), a.kind.is_send) for a in units[s][pos[s]]}
                   for s in range(p) if pos[s] < len(units[s])}
        posted = set().union(*waiting.values())
        met |= {(msg, is_send) for msg, is_send in posted if (msg, not is_send) in posted}
        done = [s for s, ops in waiting.items() if ops <= met]
        for s in done:
            pos[s] += 1
        moved = bool(done)
    stuck = [f"stage {s} waits in its batch [{', '.join(map(str, units[s][pos[s]]))}]"
             for s in range(p) if pos[s] < len(units[s])]
    if stuck:
        raise ScheduleError("deadlock with blocking batches: each stage waits for a message "
                            "its peer has not posted.\n  " + "\n  ".join(stuck))


# ---------------------------------------------------------------- the one call before running
def validate(schedule, m: int | None = None, v: int | None = None, **costs) -> Simulation:
    """``check`` + ``simulate`` (a deadlock is an error) + ``check_batches`` (the executor's
    blocking batches do not deadlock either): the one call before running. The simulation
    it returns carries the rounds the executor runs (``lockstep``), so that the schedule
    is read once."""
    sim = simulate(schedule, m=m, v=v, **costs)
    sim.rounds = _rounds(schedule)
    check_batches(schedule, sim.rounds)
    return sim


if __name__ == "__main__":
    from lessonlib.pipeline.schedules import gpipe, one_f_one_b

    for name, fn in (("GPipe", gpipe), ("1F1B", one_f_one_b)):
        sim = simulate(fn(4, 8))
        print(f"{name}: bubble {sim.bubble[0]:.3f} of wall time per stage "
              f"(theory 3/11 = {3 / 11:.3f}), peak stash per stage {sim.peak_stash}")
