"""Check a pipeline schedule without running it, and simulate it: bubble, stash, deadlocks.

What it teaches: because a schedule is data, we can prove it right before any process
starts. ``check`` reads every stage's action list and rejects, naming the stage and the
action, a backward before its forward, a forward whose input never arrives, a send nobody
receives or a message to the wrong stage. ``simulate`` then plays the schedule as a
discrete-event simulation: F and B take given times, a send never waits for its receiver
(the message waits in the link, as an isend does; it may cost its sender a given time to
copy out), a receive waits until its message has been sent plus ``latency``. If at some
point no stage can move, the schedule deadlocks and the error says
where each stage is stuck. Otherwise it reports, per stage:

* ``bubble``: idle share of the step's wall time, (p-1)/(m+p-1) for GPipe and 1F1B with
  balanced stages (GPipe, Huang et al. 2019, §2.3), and ``bubble_ideal``: idle time over busy
  time, Megatron-LM 2021's (p-1)/m (§2.2);
* ``peak_stash``: the most (micro-batch, chunk) activations held at once, min(p - s, m) for
  1F1B and m for GPipe (PipeDream-Flush, Narayanan et al. 2021, §3.2).

Laptop:  ``python -m lessonlib.pipeline.validate`` simulates GPipe and 1F1B for p=4, m=8.
GPU box: the same (pure Python).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from lessonlib.pipeline.schedules import COMPUTE, KINDS, Action, place, virtual_stage


class ScheduleError(ValueError):
    """A schedule that cannot run as written; the message names the stage and action."""


@dataclass(frozen=True)
class Span:
    """One interval on one stage's timeline (simulated cost units, or measured seconds).
    The assembly line of ``lessonlib.model_parallel`` records its spans with it too (one
    batch per step: micro-batch 0, and the training ``step`` it belongs to)."""
    kind: str          # F, B, OPT, RECV_F/RECV_B (waiting for data), SEND_F/SEND_B, WAIT_SENDS
    microbatch: int
    chunk: int
    start: float
    end: float
    step: int = 0


@dataclass(frozen=True)
class Message:
    """Activation ("F") or gradient ("B") of ``microbatch`` leaving virtual stage ``vstage``."""
    direction: str
    microbatch: int
    vstage: int
    src: int
    dst: int


@dataclass
class Simulation:
    p: int
    m: int
    v: int
    timelines: list[list[Span]]
    makespan: float
    bubble: list[float]         # idle / makespan per stage ("wall" convention)
    bubble_ideal: list[float]   # idle / busy per stage ("ideal" convention)
    peak_stash: list[int]       # (micro-batch, chunk) activations held at once per stage
    sends: list[tuple[float, Message]]  # every message with its send time, in send order


def _where(stage: int, index: int, action: Action) -> str:
    return f"stage {stage}, action {index} ({action})"


def message_of(action: Action, stage: int, p: int) -> Message:
    """The message a SEND puts on a link, or a RECV takes from it."""
    k = virtual_stage(stage, action.chunk, p)
    sender = {"SEND_F": k, "SEND_B": k, "RECV_F": k - 1, "RECV_B": k + 1}[action.kind]
    src, dst = (stage, action.peer) if action.kind.startswith("SEND") else (action.peer, stage)
    return Message(action.kind[-1], action.microbatch, sender, src, dst)


def _count(name, value) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or value < 1):
        raise ScheduleError(f"{name}={value!r} must be a positive integer (or None to read it "
                            f"from the actions)")


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
                raise ScheduleError(f"{_where(s, i, a)}: kind {a.kind!r} is not one of {KINDS}")
            if not all(isinstance(x, numbers.Integral) and not isinstance(x, bool)
                       for x in (a.microbatch, a.chunk)) or not (a.peer is None or (
                    isinstance(a.peer, numbers.Integral) and not isinstance(a.peer, bool))):
                raise ScheduleError(f"{_where(s, i, a)}: micro-batch, chunk and peer must be "
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
    last = p * v - 1
    sends, recvs = {}, {}
    for s, actions in enumerate(schedule):
        seen: dict[tuple, int] = {}
        for i, a in enumerate(actions):
            if not (0 <= a.microbatch < m and 0 <= a.chunk < v):
                raise ScheduleError(f"{_where(s, i, a)}: micro-batch must be in 0..{m - 1} "
                                    f"and chunk in 0..{v - 1}")
            if (a.kind, a.microbatch, a.chunk) in seen:
                raise ScheduleError(f"{_where(s, i, a)}: runs twice (also action "
                                    f"{seen[a.kind, a.microbatch, a.chunk]})")
            seen[a.kind, a.microbatch, a.chunk] = i
            if a.kind in COMPUTE:
                if a.peer is not None:
                    raise ScheduleError(f"{_where(s, i, a)}: F and B have no peer")
                continue
            k = virtual_stage(s, a.chunk, p)
            outgoing = a.kind in ("SEND_F", "RECV_B")   # towards virtual stage k + 1
            if (outgoing and k == last) or (not outgoing and k == 0):
                end = "last" if outgoing else "first"
                raise ScheduleError(f"{_where(s, i, a)}: virtual stage {k} is the {end} one; "
                                    f"it has no neighbour there to exchange {a.kind[-1]} with")
            want = place(k + 1 if outgoing else k - 1, p)[0]
            if a.peer != want:
                raise ScheduleError(f"{_where(s, i, a)}: the neighbour of virtual stage {k} "
                                    f"in that direction is stage {want}, not {a.peer}")
            (sends if a.kind.startswith("SEND") else recvs)[message_of(a, s, p)] = (s, i, a)
        for mb in range(m):
            for c in range(v):
                _check_unit(s, p, v, mb, c, seen, actions)
    for book, other, verb in ((sends, recvs, "receives"), (recvs, sends, "sends")):
        for msg, (s, i, a) in book.items():
            if msg not in other:
                who = a.peer
                raise ScheduleError(f"{_where(s, i, a)}: stage {who} never {verb} it")
    return p, m, v


def _check_unit(s, p, v, mb, c, seen, actions):
    """Stage s's actions for micro-batch mb of chunk c: present, once, in a possible order."""
    k, last = virtual_stage(s, c, p), p * v - 1
    name = f"micro-batch {mb}" + (f" (chunk {c})" if v > 1 else "")
    at = {kind: seen.get((kind, mb, c)) for kind in KINDS}
    for kind, needed, what in (("F", True, "forward"), ("B", True, "backward"),
                               ("RECV_F", k > 0, "receive of its input (RECV_F)"),
                               ("SEND_F", k < last, "send of its output (SEND_F)"),
                               ("RECV_B", k < last, "receive of its output gradient (RECV_B)"),
                               ("SEND_B", k > 0, "send of its input gradient (SEND_B)")):
        if needed and at[kind] is None:
            raise ScheduleError(f"stage {s} never runs the {what} of {name}")
    for before, after, why in (("F", "B", "its backward comes before its forward"),
                               ("RECV_F", "F", "its forward runs before its input arrives"),
                               ("F", "SEND_F", "it sends its output before computing it"),
                               ("RECV_B", "B", "its backward runs before its gradient arrives"),
                               ("B", "SEND_B", "it sends its input gradient before computing it")):
        if at[before] is not None and at[after] is not None and at[after] < at[before]:
            i = at[after]
            raise ScheduleError(f"{_where(s, i, actions[i])}: {why} (action {at[before]})")


def _time(name, value) -> float:
    """A duration: a finite number >= 0, else ScheduleError naming the setting."""
    if (isinstance(value, bool) or not isinstance(value, numbers.Real)
            or not math.isfinite(value) or value < 0):
        raise ScheduleError(f"{name}={value!r} must be a finite time >= 0 (or, for forward, "
                            f"backward and send, a function (stage, action) -> such a time)")
    return float(value)


def _cost(name, cost, stage, action) -> float:
    if callable(cost):
        return _time(f"{name}({stage}, {action})", cost(stage, action))
    return float(cost)


def simulate(schedule, forward=1.0, backward=2.0, latency=0.0, send=0.0,
             m: int | None = None, v: int | None = None) -> Simulation:
    """Check, then play the schedule; raise ScheduleError if it deadlocks.

    ``forward``/``backward``: time of one F/B action (one chunk), a number or a function
    (stage, action) -> time; ``send``: time a send keeps its stage busy (copying the
    message out), the same kind of value; ``latency``: time from the end of a send to the
    matching receive."""
    for name, value in (("forward", forward), ("backward", backward), ("send", send),
                        ("latency", latency)):
        if name == "latency" or not callable(value):
            _time(name, value)
    p, m, v = check(schedule, m, v)
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
                if a.kind.startswith("RECV"):
                    msg = message_of(a, s, p)
                    if msg not in sent:
                        break
                    end = max(start, sent[msg] + latency)
                elif a.kind.startswith("SEND"):
                    msg = message_of(a, s, p)
                    sent[msg] = end = start + _cost("send", send, s, a)
                    order.append((start, s, pos[s], msg))
                else:
                    name = "forward" if a.kind == "F" else "backward"
                    end = start + _cost(name, forward if a.kind == "F" else backward, s, a)
                    held[s] += 1 if a.kind == "F" else -1
                    peak[s] = max(peak[s], held[s])
                spans[s].append(Span(a.kind, a.microbatch, a.chunk, start, end))
                clock[s], pos[s], moved = end, pos[s] + 1, True
    if any(pos[s] < len(schedule[s]) for s in range(p)):
        stuck = []
        for s in range(p):
            if pos[s] < len(schedule[s]):
                a = schedule[s][pos[s]]
                what = "activation" if a.kind == "RECV_F" else "gradient"
                stuck.append(f"{_where(s, pos[s], a)} waits for the {what} of micro-batch "
                             f"{a.microbatch} from stage {a.peer}")
        raise ScheduleError("deadlock: every unfinished stage waits for a message from a stage "
                            "that is itself stuck.\n  " + "\n  ".join(stuck))
    makespan = max(clock)
    busy = [sum(x.end - x.start for x in line if x.kind in COMPUTE) for line in spans]
    return Simulation(p, m, v, spans, makespan,
                      [1 - b / makespan if makespan else 0.0 for b in busy],
                      [(makespan - b) / b if b else 0.0 for b in busy],
                      peak, [(t, msg) for t, _, _, msg in sorted(order)])


def validate(schedule, m: int | None = None, v: int | None = None, **costs) -> Simulation:
    """``check`` + ``simulate`` (a deadlock is an error): the one call before running."""
    return simulate(schedule, m=m, v=v, **costs)


def link_orders(schedule) -> dict[tuple[int, int], list[Message]]:
    """For each pair of neighbouring stages (a < b), every message between them, both
    directions, in one order both ends agree on.

    The executor issues a link's sends and receives in exactly this order, so the n-th
    operation at one end always meets the n-th at the other (NCCL matches point-to-point
    messages by order, not by tag). The order is the send order of a simulation with a
    small latency, which never asks a stage to send something it has not computed yet."""
    links: dict[tuple[int, int], list[Message]] = {}
    for _, msg in simulate(schedule, latency=1e-3).sends:
        links.setdefault((min(msg.src, msg.dst), max(msg.src, msg.dst)), []).append(msg)
    return links


def bubble_of(timelines: list[list[Span]], wall: float | None = None) -> list[float]:
    """Idle share of wall time per stage from timelines that start at 0 (simulated or
    measured): 1 - (time in F and B) / wall, wall = the latest end over all stages
    unless given."""
    if wall is None:
        wall = max((x.end for line in timelines for x in line), default=0.0)
    return [1 - sum(x.end - x.start for x in line if x.kind in COMPUTE) / wall if wall else 0.0
            for line in timelines]


if __name__ == "__main__":
    from lessonlib.pipeline.schedules import gpipe, one_f_one_b

    for name, fn in (("GPipe", gpipe), ("1F1B", one_f_one_b)):
        sim = simulate(fn(4, 8))
        print(f"{name}: bubble {sim.bubble[0]:.3f} of wall time per stage "
              f"(theory 3/11 = {3 / 11:.3f}), peak stash per stage {sim.peak_stash}")
