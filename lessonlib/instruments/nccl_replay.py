"""Replaying a trace under NCCL's rules (``nccl_rules`` states them and cites them).

What it teaches: whether a program hangs on GPUs is a question about order. ``to_ops`` turns
each rank's calls into units on communicators (a collective, an unbatched send or receive,
a whole batch), and three replays follow them: ``creation`` walks every host through the
communicators it creates (rule 1), ``matching`` pairs sends with receives and lines up
collectives (rules 4, 5, 6), ``streams`` runs every communicator's stream in order, with
waits (rules 2, 3, 7). Each returns sentences; none raises on a trace ``nccl_trace`` read.

Laptop:  used through ``nccl_rules.nccl_hazards``; nothing to run on its own.
GPU box: the same.
"""
from __future__ import annotations

from collections import defaultdict, deque

from lessonlib.instruments.nccl_trace import SIZED, Call


def _key(c: Call, mode: str, world: tuple) -> tuple:
    """The communicator a call runs on: ("group", name, members) or ("pair", name,
    members, (a, b)); a group without a recorded name is known by its members. ``world``:
    (its name, its members)."""
    if c.op == "new_group" and mode == "eager":   # ncclCommSplit of the world's communicator
        return ("group", *world)
    if c.p2p and c.batch is None and mode == "lazy":
        return ("pair", c.group, c.ranks, (min(c.rank, c.peer), max(c.rank, c.peer)))
    return ("group", c.group, c.ranks)


def who(key: tuple) -> tuple:
    return key[3] if key[0] == "pair" else key[2]


def describe(key: tuple) -> str:
    name = "" if key[1] in (None, "0") else f" #{key[1]}"
    if key[0] == "pair":
        return (f"the two-rank communicator of ranks {key[3][0]} and {key[3][1]}"
                + (f" (group{name})" if name else ""))
    if key[1] == "0":
        return f"the world's communicator (ranks {list(key[2])})"
    return f"the communicator of group{name} {list(key[2])}"


class Op:
    """One unit on one stream: a collective, an unbatched send/recv, or a whole batch."""

    def __init__(self, rank: int, key: tuple, parts: list):
        self.rank, self.key, self.parts = rank, key, parts
        self.order = min((c.order for c in parts), default=0)

    @property
    def collective(self) -> bool:
        return not self.parts[0].p2p

    def __str__(self) -> str:
        return " + ".join(str(c) for c in self.parts)


def to_ops(calls: list[list[Call]], mode: str) -> list[list[Op]]:
    named = any(c.group is not None for line in calls for c in line)
    world = ("0" if named else None, tuple(range(len(calls))))
    out = []
    for rank, line in enumerate(calls):
        ops, batches = [], {}
        for c in line:
            if c.op == "new_group" and mode == "lazy":
                continue                      # no communication: rule 0 is checked apart
            if c.p2p and c.batch is not None:
                if c.batch not in batches:
                    batches[c.batch] = Op(rank, _key(c, mode, world), [])
                    ops.append(batches[c.batch])
                batches[c.batch].parts.append(c)
            else:
                ops.append(Op(rank, _key(c, mode, world), [c]))
        for op in ops:
            op.order = min(c.order for c in op.parts)
        out.append(ops)
    return out


# ---------------------------------------------------------------- rule 1: creation
def creation(ops: list[list[Op]], mode: str) -> list[str]:
    """Lazy mode: walk every host through its calls; a rank stops at a communicator it has
    not used yet until all members stand at it too. Eager mode makes them all up front."""
    if mode == "eager":
        return []
    n, pos, made, at = len(ops), [0] * len(ops), set(), {}
    while True:
        for r in range(n):
            while pos[r] < len(ops[r]) and (r, ops[r][pos[r]].key) in made:
                pos[r] += 1
        at = {r: ops[r][pos[r]] for r in range(n) if pos[r] < len(ops[r])}
        ready = {op.key for op in at.values()
                 if all(m >= n or (m in at and at[m].key == op.key) for m in who(op.key))}
        if not ready:
            break
        made |= {(m, key) for key in ready for m in who(key)}
    hazards = []
    for r, op in sorted(at.items()):
        others = []
        for m in who(op.key):
            if m == r or m >= n or (m in at and at[m].key == op.key):
                continue
            others.append(f"rank {m} is blocked creating {describe(at[m].key)} (for its "
                          f"{at[m]})" if m in at else f"rank {m} never calls on it")
        hazards.append(f"hang: rank {r} blocks creating {describe(op.key)} (its first call "
                       f"there is a {op}) until every member joins, but " + "; ".join(others))
    return hazards


# ---------------------------------------------------------------- rules 4, 5, 6: matching
def _signature(c: Call) -> tuple:
    """(op, count, dtype, root, the members a new_group makes): what must agree."""
    return (c.op, c.bytes if c.op in SIZED else None, c.dtype, c.root,
            c.ranks if c.op == "new_group" else None)


def matching(ops: list[list[Op]]):
    """(partner of each p2p call, the k-th collective of each op, hazards)."""
    sends, recvs, colls = defaultdict(list), defaultdict(list), defaultdict(dict)
    for r, line in enumerate(ops):
        for op in line:
            if op.collective:
                colls[op.key].setdefault(r, []).append(op)
                continue
            for c in op.parts:
                (sends[op.key, r, c.peer] if c.op == "send" else recvs[op.key, c.peer, r]).append(c)
    partner, hazards = {}, []
    for k in sorted(set(sends) | set(recvs), key=str):
        key, src, dst = k
        a, b = sends.get(k, []), recvs.get(k, [])
        if len(a) != len(b):
            hazards.append(f"hang: on {describe(key)}, rank {src} sends {len(a)} message(s) to "
                           f"rank {dst}, which receives {len(b)} from it")
        for i, (s, t) in enumerate(zip(a, b)):
            partner[id(s)], partner[id(t)] = t, s
            if (s.bytes, s.dtype) != (t.bytes, t.dtype):
                hazards.append(f"mismatch: send #{i} from rank {src} to rank {dst} carries "
                               f"{s.bytes} bytes of {s.dtype} but its receive expects "
                               f"{t.bytes} bytes of {t.dtype}; NCCL needs the same count and "
                               f"datatype on both ends")
    index = {}
    for key, lines in sorted(colls.items(), key=lambda kv: str(kv[0])):
        for line in lines.values():
            for i, op in enumerate(line):
                index[id(op)] = i
        hazards += _lined_up(key, lines, len(ops))
    return partner, index, hazards or _one_order_across_groups(ops, colls, index)


def _lined_up(key: tuple, lines: dict, n: int) -> list[str]:
    """Rule 5 on one communicator: the i-th collective is the same call on every member."""
    missing = [f"hang: rank {m} never calls the collectives of {describe(key)}"
               for m in who(key) if m < n and m not in lines]
    for i in range(max(len(x) for x in lines.values())):
        seen = {r: _signature(lines[r][i].parts[0]) if i < len(lines[r]) else None
                for r in sorted(lines)}
        if len(set(seen.values())) > 1:
            listing = ", ".join(f"rank {r}: {'nothing' if s is None else lines[r][i].parts[0]}"
                                for r, s in seen.items())
            roots = {s[3] for s in seen.values() if s is not None}
            what = ("mismatch: ranks of {} disagree on the root of call #{} there ({}); "
                    "NCCL needs the same root on every rank" if len(roots) > 1 and
                    len({s[:3] + s[4:] for s in seen.values()}) == 1 else
                    "order: ranks of {} reach different collectives as call #{} there ({})")
            return missing + [what.format(describe(key), i, listing)]
    return missing


def _one_order_across_groups(ops, colls, index) -> list[str]:
    """Rule 6: two ranks that share two groups reach their collectives there in one order."""
    members = {key: set(who(key)) for key in colls}
    for r in range(len(ops)):
        for s in range(r + 1, len(ops)):
            shared = {key for key, m in members.items() if r in m and s in m}
            if len(shared) < 2:
                continue
            seq = [[(op.key, index[id(op)]) for op in ops[x] if op.collective and op.key in shared]
                   for x in (r, s)]
            for i, (a, b) in enumerate(zip(*seq)):
                if a != b:
                    first = next(op for op in ops[r] if op.collective and (op.key, index[id(op)]) == a)
                    other = next(op for op in ops[s] if op.collective and (op.key, index[id(op)]) == b)
                    return [f"order: ranks {r} and {s} share {describe(a[0])} and "
                            f"{describe(b[0])} but reach them in opposite orders: rank {r} "
                            f"first calls {first} on the one, rank {s} {other} on the other "
                            f"(torch.distributed docs: collectives across groups must run in "
                            f"one order on every rank)"]
    return []


# ---------------------------------------------------------------- rules 2, 3, 7: streams
def streams(ops: list[list[Op]], partner: dict, index: dict) -> list[str]:
    queue, owner = defaultdict(deque), {}
    for line in ops:
        for op in line:
            queue[op.rank, op.key].append(op)
            for c in op.parts:
                owner[id(c)] = op
    undone = [{id(c): c for op in line for c in op.parts if c.waited is not None} for line in ops]
    done = set()

    def blocked_by(op):        # a waited call that must finish before ``op`` may start
        for c in undone[op.rank].values():
            if c.waited <= op.order and owner[id(c)] is not op:
                return owner[id(c)]
        return None

    def active(op):
        return queue[op.rank, op.key][0] is op and blocked_by(op) is None

    moved = True
    while moved:
        moved = False
        heads = [q[0] for q in queue.values() if q and active(q[0])]
        for op in heads:
            if op.collective:
                peers = [queue[m, op.key][0] if queue[m, op.key] else None
                         for m in who(op.key) if m < len(ops)]
                if all(p is not None and active(p) and index.get(id(p)) == index[id(op)]
                       for p in peers):
                    done.update(id(p) for p in peers)
                continue
            for c in op.parts:
                other = partner.get(id(c))
                if other is not None and active(owner[id(other)]):
                    done.update((id(c), id(other)))
        for op in heads:
            if id(op) in done or all(id(c) in done for c in op.parts):
                queue[op.rank, op.key].popleft()
                for c in op.parts:
                    undone[op.rank].pop(id(c), None)
                moved = True
    stuck = sorted((q[0] for q in queue.values() if q), key=lambda op: (op.rank, op.order))
    hazards = [h for h in (_why_stuck(op, partner, owner, queue, blocked_by, done)
                           for op in stuck if blocked_by(op) is None) if h]
    if stuck and not hazards:
        hazards.append(f"hang: calls never finish, first {stuck[0]} on rank {stuck[0].rank}")
    return hazards


def _why_stuck(op, partner, owner, queue, blocked_by, done) -> str:
    why = []
    for c in op.parts:
        other = partner.get(id(c))
        if other is None or id(c) in done:
            continue
        theirs = owner[id(other)]
        q = queue[theirs.rank, theirs.key]
        if q and q[0] is not theirs:
            why.append(f"its {c} needs rank {theirs.rank}'s {other}, queued behind that "
                       f"rank's {q[0]} on the same stream")
        elif blocked_by(theirs) is not None:
            why.append(f"its {c} needs rank {theirs.rank}'s {other}, which that rank posts "
                       f"after waiting on its {blocked_by(theirs)}")
    if op.collective:
        why.append(f"its {op} waits for every member of the group to reach it")
    return f"hang: rank {op.rank} is stuck on {describe(op.key)}: " + "; ".join(why) if why else ""
