"""NCCL's rules, checked on recorded traces: would this run hang on GPUs?

What it teaches: a program that runs on CPU ranks (gloo) can still hang on its first GPU
run, because NCCL plays by stricter rules. ``nccl_hazards(ledgers)`` takes one
``comm.Ledger`` per rank (or a list of its events) and replays the calls under the rules
below, as NCCL and PyTorch document them; it returns, in plain words, every place where a
rank would wait forever, and every send whose receive does not fit. An empty list means
none of the modelled hazards is present (not a proof that nothing else can go wrong).

The rules modelled:

1. A communicator is created on first use, and creating one blocks the host until every
   member has arrived (NCCL API, ``ncclCommInitRank``: it "implicitly synchronizes with
   other ranks"). PyTorch's ProcessGroupNCCL creates them lazily: a collective, or a
   ``batch_isend_irecv``, uses the group's communicator (torch.distributed docs,
   ``batch_isend_irecv``: if it is the first call on the group, all ranks of the group must
   take part); an unbatched ``isend``/``irecv``/``send``/``recv`` to a new peer creates a
   two-rank communicator for that pair (unless ``init_process_group`` was given a
   ``device_id``, which lessonlib does not pass).
2. Each communicator has one CUDA stream per rank, and work on a stream runs in order
   (NCCL user guide, "CUDA Stream Semantics"). A receive holds its stream until its send
   arrives; a send may hold it until its receive is posted, since NCCL promises no
   buffering (the check assumes it never buffers, as MPI's definition of a "safe" program
   does). Two ranks that each queue ``irecv`` before ``isend`` to each other therefore
   wait on each other (NVIDIA/nccl issues 479 and 783; pytorch/pytorch issue 109401).
3. Calls fused in one group (``batch_isend_irecv``) progress independently and never
   block each other (NCCL user guide, "Point-to-point communication"; "Group Calls").
4. A send meets the receive posted in the same order at the other end, and both must have
   the same count and datatype (NCCL user guide, "Point-to-point communication").
5. Every member of a group calls the same collectives in the same order (NCCL user guide,
   "Creating a Communicator": collective calls on a communicator must match on all ranks).
6. ``work.wait()`` makes the current stream wait for that call, so a call posted after the
   wait starts only when the waited call is done (torch.distributed docs, ``Work.wait``).

Laptop:  ``python -m lessonlib.nccl_rules`` (two rings of 3 ranks: irecv-first, batched)
GPU box: nothing to run: the point is to find such hangs before a GPU is at hand.
"""
from __future__ import annotations

from collections import defaultdict, deque

INF = float("inf")


def _events(ledger) -> list:
    return list(getattr(ledger, "events", ledger))


def _p2p(e) -> bool:
    return e.op in ("send", "recv")


def _key(rank: int, e, world: tuple[int, ...]) -> tuple:
    """The communicator a call runs on: ("group", members) or ("pair", members, (a, b))."""
    members = tuple(e.ranks) or world
    if _p2p(e) and e.batch is None:
        return ("pair", members, (min(rank, e.peer), max(rank, e.peer)))
    return ("group", members)


def _who(key: tuple) -> tuple[int, ...]:
    return key[2] if key[0] == "pair" else key[1]


def _comm(key: tuple) -> str:
    if key[0] == "pair":
        return f"the two-rank communicator of ranks {key[2][0]} and {key[2][1]}"
    return f"the communicator of group {list(key[1])}"


def _call(e) -> str:
    dtype = (e.dtype or "?").replace("torch.", "")
    if _p2p(e):
        where = "to" if e.op == "send" else "from"
        kind = f"{'batched ' if e.batch is not None else ''}{e.op}"
        return f"{kind} {where} rank {e.peer} ({e.bytes} bytes of {dtype})"
    return f"{e.op} ({e.bytes} bytes of {dtype})"


class _Op:
    """One unit on one stream: a collective, an unbatched send/recv, or a whole batch."""

    def __init__(self, rank: int, key: tuple, parts: list):
        self.rank, self.key, self.parts = rank, key, parts
        self.order = min((e.order for e in parts), default=0)

    def __str__(self) -> str:
        return " + ".join(_call(e) for e in self.parts)


def _ops(ledgers) -> list[list[_Op]]:
    world = tuple(range(len(ledgers)))
    out = []
    for rank, ledger in enumerate(ledgers):
        ops, batches = [], {}
        for e in sorted(_events(ledger), key=lambda e: e.order):
            if _p2p(e) and e.batch is not None:
                if e.batch not in batches:
                    batches[e.batch] = _Op(rank, _key(rank, e, world), [])
                    ops.append(batches[e.batch])
                batches[e.batch].parts.append(e)
            else:
                ops.append(_Op(rank, _key(rank, e, world), [e]))
        for op in ops:
            op.order = min(e.order for e in op.parts)
        out.append(ops)
    return out


# ---------------------------------------------------------------- rule 1: creation
def _creation(ops: list[list[_Op]]) -> list[str]:
    """Walk every host through its calls; a rank stops at a communicator it has not used
    yet until all members stand at it too."""
    n, pos, made = len(ops), [0] * len(ops), set()
    while True:
        for r in range(n):
            while pos[r] < len(ops[r]) and (r, ops[r][pos[r]].key) in made:
                pos[r] += 1
        at = {r: ops[r][pos[r]] for r in range(n) if pos[r] < len(ops[r])}
        ready = {op.key for op in at.values()
                 if all(m >= n or (m in at and at[m].key == op.key) for m in _who(op.key))}
        if not ready:
            break
        made |= {(m, key) for key in ready for m in _who(key)}
    hazards = []
    for r, op in sorted(at.items()):
        others = []
        for m in _who(op.key):
            if m == r or m >= n or (m in at and at[m].key == op.key):
                continue
            others.append(f"rank {m} is blocked creating {_comm(at[m].key)} (for its "
                          f"{at[m]})" if m in at else f"rank {m} never calls on it")
        hazards.append(f"hang: rank {r} blocks creating {_comm(op.key)} (its first call "
                       f"there is a {op}) until every member joins, but " + "; ".join(others))
    return hazards


# ---------------------------------------------------------------- rules 4 and 5: matching
def _matching(ops: list[list[_Op]]):
    """(partner of each p2p event, the k-th collective of each op, hazards)."""
    sends, recvs, colls = defaultdict(list), defaultdict(list), defaultdict(dict)
    for r, line in enumerate(ops):
        for op in line:
            for e in op.parts:
                if e.op == "send":
                    sends[op.key, r, e.peer].append(e)
                elif e.op == "recv":
                    recvs[op.key, e.peer, r].append(e)
                else:
                    colls[op.key].setdefault(r, []).append(op)
    partner, hazards = {}, []
    for k in sorted(set(sends) | set(recvs), key=str):
        key, src, dst = k
        a, b = sends.get(k, []), recvs.get(k, [])
        if len(a) != len(b):
            hazards.append(f"hang: on {_comm(key)}, rank {src} sends {len(a)} message(s) to "
                           f"rank {dst}, which receives {len(b)} from it")
        for i, (s, t) in enumerate(zip(a, b)):
            partner[id(s)], partner[id(t)] = t, s
            if (s.bytes, s.dtype) != (t.bytes, t.dtype):
                hazards.append(f"mismatch: send #{i} from rank {src} to rank {dst} carries "
                               f"{s.bytes} bytes of {s.dtype} but its receive expects "
                               f"{t.bytes} bytes of {t.dtype}; NCCL needs the same count and "
                               f"datatype on both ends")
    index = {}
    for key, lines in colls.items():
        for r, line in lines.items():
            for i, op in enumerate(line):
                index[id(op)] = i
        ranks = sorted(lines)
        for m in _who(key):
            if m < len(ops) and m not in lines:
                hazards.append(f"hang: rank {m} never calls the collectives of {_comm(key)}")
        for i in range(max(len(x) for x in lines.values())):
            seen = {r: (lines[r][i].parts[0].op, lines[r][i].parts[0].bytes,
                        lines[r][i].parts[0].dtype) if i < len(lines[r]) else None
                    for r in ranks}
            if len(set(seen.values())) > 1:
                listing = ", ".join(f"rank {r}: {'nothing' if c is None else _call(lines[r][i].parts[0])}"
                                    for r, c in seen.items())
                hazards.append(f"order: ranks of {_comm(key)} reach different collectives as "
                               f"call #{i} there ({listing})")
                break
    return partner, index, hazards


# ---------------------------------------------------------------- rules 2, 3, 6: streams
def _streams(ops: list[list[_Op]], partner: dict, index: dict) -> list[str]:
    queue = defaultdict(deque)
    owner = {}
    for line in ops:
        for op in line:
            queue[op.rank, op.key].append(op)
            for e in op.parts:
                owner[id(e)] = op
    undone = [{id(e): e for op in line for e in op.parts if e.waited is not None} for line in ops]
    done = set()

    def blocked_by(op):        # a waited call that must finish before ``op`` may start
        for e in undone[op.rank].values():
            if e.waited <= op.order and owner[id(e)] is not op:
                return owner[id(e)]
        return None

    def active(op):
        return queue[op.rank, op.key][0] is op and blocked_by(op) is None

    progress = True
    while progress:
        progress = False
        heads = [q[0] for q in queue.values() if q and active(q[0])]
        for op in heads:
            e0 = op.parts[0]
            if not _p2p(e0):
                peers = [queue[m, op.key][0] if queue[m, op.key] else None
                         for m in _who(op.key) if m < len(ops)]
                if all(p is not None and active(p) and index[id(p)] == index[id(op)] for p in peers):
                    done.update(id(p) for p in peers)
                continue
            for e in op.parts:
                other = partner.get(id(e))
                if other is not None and active(owner[id(other)]):
                    done.update((id(e), id(other)))
        for op in heads:
            if all(id(e) in done for e in op.parts) or id(op) in done:
                queue[op.rank, op.key].popleft()
                for e in op.parts:
                    undone[op.rank].pop(id(e), None)
                progress = True
    stuck = sorted((q[0] for q in queue.values() if q), key=lambda op: (op.rank, op.order))
    hazards = []
    for op in stuck:
        if blocked_by(op) is not None:
            continue                     # it waits on another of its own calls: not the cause
        why = []
        for e in op.parts:
            other = partner.get(id(e))
            if other is None or id(e) in done:
                continue
            theirs = owner[id(other)]
            q = queue[theirs.rank, theirs.key]
            if q and q[0] is not theirs:
                why.append(f"its {_call(e)} needs rank {theirs.rank}'s {_call(other)}, queued "
                           f"behind that rank's {q[0]} on the same stream")
            elif blocked_by(theirs) is not None:
                why.append(f"its {_call(e)} needs rank {theirs.rank}'s {_call(other)}, which "
                           f"that rank posts after waiting on its {blocked_by(theirs)}")
        if not _p2p(op.parts[0]):
            why.append(f"its {op} waits for every member of the group to reach it")
        hazards.append(f"hang: rank {op.rank} is stuck on {_comm(op.key)}: " + "; ".join(why))
    if stuck and not hazards:
        hazards.append(f"hang: calls never finish, first {stuck[0]} on rank {stuck[0].rank}")
    return hazards


def nccl_hazards(ledgers) -> list[str]:
    """Every hazard NCCL would turn into a hang (or a garbled message) in these traces.

    ``ledgers``: one per rank, in rank order (``comm.Ledger`` or a list of ``comm.Event``);
    events need ``op``, ``peer`` (global), ``bytes``, ``dtype``, ``ranks``, ``order``,
    ``batch`` and ``waited`` as ``comm`` records them. Returns plain sentences starting
    with "hang:", "mismatch:" or "order:"; an empty list when none is found."""
    ops = _ops(ledgers)
    hazards = _creation(ops)
    if hazards:
        return hazards
    partner, index, hazards = _matching(ops)
    return hazards or _streams(ops, partner, index)


if __name__ == "__main__":
    from types import SimpleNamespace as Call

    def ring(n: int, batched: bool) -> list[list]:
        def call(r, i, op, peer):
            return Call(op=op, peer=peer, bytes=16, dtype="torch.float32", ranks=(),
                        order=i, batch=0 if batched else None, waited=2)
        return [[call(r, 0, "recv", (r - 1) % n), call(r, 1, "send", (r + 1) % n)]
                for r in range(n)]

    for batched in (False, True):
        print("batched:" if batched else "irecv, then isend:")
        print("\n".join(nccl_hazards(ring(3, batched))) or "no hazard")
