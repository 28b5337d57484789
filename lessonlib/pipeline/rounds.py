"""The executor's rounds: how a schedule's transfers are posted, and why that cannot hang.

What it teaches: NCCL runs one communicator's work in order, and two communicators busy at
once on a GPU can deadlock (NCCL user guide, "Using multiple NCCL communicators
concurrently"). So the executor posts its transfers as PyTorch's ``PipelineScheduleMulti``
does: in rounds. Each round, every stage runs its next compute, then posts one
``batch_isend_irecv`` on the pipeline group with the sends of what it computed and the
receives of what its neighbours computed, and waits for all of it before computing again
(``lockstep``). One batch per gap between a stage's own computes would not do: interleaved
1F1B would deadlock, and ZBV's messages would pair wrongly, because a stage lists its
receives in another order than its neighbour sends them (``batched`` builds that naive
grouping, for the tests that show it). ``check_batches`` plays blocking batches without
processes: a batch ends when every message in it meets its other end in the other stage's
current batch; if no stage can move, it names where each is stuck.

Laptop:  used by ``validate`` and the executor; nothing to run on its own.
GPU box: the same (pure Python).
"""
from __future__ import annotations

from lessonlib.pipeline.actions import COMPUTE, placement_of
from lessonlib.pipeline.check import ScheduleError, check, message_of


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
