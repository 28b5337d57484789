"""What a rank leaves in flight: rules 8 to 10 of ``nccl_rules``, checked on one rank at a time.

What it teaches: an asynchronous call is a promise that runs on its own until it is waited
on, and NCCL asks three things of what is in flight on a rank:

8. One communicator busy at a time. Work outstanding on two communicators at once (an
   asynchronous call on communicator A posted and not yet waited on when a call on
   communicator B is posted) can deadlock: each communicator runs on its own CUDA stream,
   and CUDA does not promise that two streams progress independently, so A's kernel may
   wait for a peer that is itself stuck behind B's (NCCL user guide, "Using multiple NCCL
   communicators concurrently"; NVIDIA/nccl issue 783). Three 2-rank groups (0-1, 1-2,
   2-0), each given an asynchronous all-reduce and then all waited, form such a cycle.
   A ``batch_isend_irecv`` is one call on one communicator; a synchronous call is waited on
   at once (the ledger notes when), so it never overlaps.
9. Every receive is waited on: before the wait, its buffer may not hold the data yet (on
   NCCL the kernel may not have run; a read sees whatever was there).
10. A send's buffer is left alone until the send is waited on: NCCL reads it while the
   kernel runs, so a write before then can send the new values. ``comm`` notes a send whose
   tensor was written in place (its version counter moved) between posting and waiting,
   for a send that covers its whole storage (the counter is the storage's: a slice's
   neighbours share it); a send never waited on is flagged too, since nothing then says
   when its buffer is free.

Each rule reports at most one sentence per rank (the first place it is broken).

Laptop:  used through ``nccl_rules.nccl_hazards``; nothing to run on its own.
GPU box: the same.
"""
from __future__ import annotations

from lessonlib.instruments.nccl_replay import Op, describe

GUIDE = ("NCCL user guide, \"Using multiple NCCL communicators concurrently\"; NVIDIA/nccl "
         "issue 783: CUDA does not promise that two streams progress independently")


def _end(op: Op) -> float:
    """The ``order`` of the first call posted after every part of ``op`` was waited on."""
    waits = [c.waited for c in op.parts]
    return float("inf") if None in waits else max(waits)


def two_communicators(line: list[Op]) -> list[str]:
    """Rule 8 on one rank's units: a call posted on one communicator while an earlier call
    on another is still unwaited."""
    open_ops: list[Op] = []
    for op in line:
        open_ops = [x for x in open_ops if _end(x) > op.order]
        other = next((x for x in open_ops if x.key != op.key), None)
        if other is not None:
            return [f"hang: rank {op.rank} posts its {op} on {describe(op.key)} while its {other} "
                    f"on {describe(other.key)} is not yet waited on; work outstanding on two "
                    f"communicators at once can deadlock ({GUIDE}); wait on the first before "
                    f"posting the second, or post both as one batch_isend_irecv on one group"]
        open_ops.append(op)
    return []


def unwaited(line: list[Op]) -> list[str]:
    """Rules 9 and 10 on one rank's units: a receive never waited on, a send's buffer written
    before its wait (or never waited on)."""
    for op in line:
        for c in op.parts:
            if c.op == "recv" and c.waited is None:
                return [f"race: rank {op.rank}'s {c} (call #{c.order}) is never waited on: its "
                        f"buffer may be read before the data lands (on NCCL, before the kernel "
                        f"ran); wait on every receive before reading it"]
            if c.op == "send" and (c.waited is None or getattr(c, "written", False)):
                how = ("is never waited on, so nothing says when its buffer may be reused"
                       if c.waited is None else "has its buffer written before it was waited on")
                return [f"race: rank {op.rank}'s {c} (call #{c.order}) {how}; NCCL reads a "
                        f"send's buffer until the send completes, so a write before then can "
                        f"send the new values: wait on every send before touching its tensor"]
    return []


def in_flight(ops: list[list[Op]]) -> list[str]:
    """Rules 8-10 on every rank (``ops`` as ``nccl_replay.to_ops`` made them)."""
    return [h for line in ops for h in unwaited(line) + two_communicators(line)]
