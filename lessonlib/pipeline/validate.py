"""Check a pipeline schedule without running it, and simulate it: bubble, stash, deadlocks.

What it teaches: because a schedule is data, it can be played before any process starts.
``simulate`` first runs ``check`` (``pipeline.check``: every action possible, every message
paired), then plays the schedule as a discrete-event simulation: F, B and W take given
times, a send never waits for its receiver (the message waits in the link, as an isend
does; it may cost its sender a given time to copy out), a receive waits until its message
has been sent plus ``latency``. If at some point no stage can move, the schedule deadlocks
and the error says where each stage is stuck. Otherwise it reports, per stage:

* ``bubble``: idle share of the step's wall time, (p-1)/(m+p-1) for GPipe and 1F1B with
  balanced stages (GPipe, Huang et al. 2019, §2.3), and ``bubble_ideal``: idle time over busy
  time, Megatron-LM 2021's (p-1)/m (§2.2);
* ``idle``: the same bubble in time units, e.g. (p-1)(T_F + T_B - T_W) per stage for ZB-H1
  (Qi et al. 2024, Table 2) against 1F1B's (p-1)(T_F + T_B + T_W);
* ``peak_stash``: the most (micro-batch, chunk) activations held at once, min(p - s, m) for
  1F1B and m for GPipe (PipeDream-Flush, Narayanan et al. 2021, §3.2); a micro-batch whose
  backward is split stays held until its W, which needs what B kept.

``replay`` plays any schedule on one run's measured times per virtual stage, so that two
schedules are compared on the same times rather than through two noisy runs.

Laptop:  ``python -m lessonlib.pipeline.validate`` simulates GPipe and 1F1B for p=4, m=8.
GPU box: the same (pure Python).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from lessonlib.instruments.spans import Span
from lessonlib.pipeline.actions import COMPUTE, Kind, placement_of, virtual_stage
from lessonlib.pipeline.check import Message, ScheduleError, check, message_of, where
from lessonlib.pipeline.rounds import check_batches, lockstep


@dataclass
class Simulation:
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


def validate(schedule, m: int | None = None, v: int | None = None, **costs) -> Simulation:
    """``check`` + ``simulate`` (a deadlock is an error) + ``check_batches`` (the executor's
    blocking batches do not deadlock either): the one call before running."""
    sim = simulate(schedule, m=m, v=v, **costs)
    check_batches(schedule, lockstep(schedule))
    return sim


@dataclass(frozen=True)
class StageTimes:
    """Measured ms per virtual stage, in the model's order, of F, B and W (what ``replay``
    plays; ``runs.explain_bubble``'s record carries the same three fields)."""
    forward_ms: list
    backward_ms: list
    weight_ms: list


def replay(schedule, stage_ms: StageTimes) -> Simulation:
    """``schedule`` played on one run's measured times, so that schedules compare on the
    same times, without the noise of separate runs. ``stage_ms``: a record with
    ``forward_ms``, ``backward_ms`` and ``weight_ms``, lists by the measured run's virtual
    stage, in the model's order (``StageTimes``, or ``runs.explain_bubble``'s record; one
    per stage for a run with one chunk per device).

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


if __name__ == "__main__":
    from lessonlib.pipeline.schedules import gpipe, one_f_one_b

    for name, fn in (("GPipe", gpipe), ("1F1B", one_f_one_b)):
        sim = simulate(fn(4, 8))
        print(f"{name}: bubble {sim.bubble[0]:.3f} of wall time per stage "
              f"(theory 3/11 = {3 / 11:.3f}), peak stash per stage {sim.peak_stash}")
