"""The static check of a pipeline schedule: every action possible, every message paired.

What it teaches: because a schedule is data, we can prove it right before any process
starts. ``check`` reads every stage's action list and rejects, naming the stage and the
action, a backward before its forward, a W before its B, a forward whose input never
arrives, a send nobody receives or a message to the wrong stage (``validate.simulate`` runs
it before it plays the schedule).

Laptop:  ``python -c "from lessonlib.pipeline.check import check; from lessonlib.pipeline
         import one_f_one_b; print(check(one_f_one_b(4, 8)))"``
GPU box: the same (pure Python).
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass

from lessonlib.argcheck import positive_int
from lessonlib.pipeline.actions import COMPUTE, KINDS, Action, place, placement_of, virtual_stage


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
