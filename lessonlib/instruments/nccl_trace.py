"""Reading a recorded trace for ``nccl_rules``: each rank's calls, checked before any replay.

What it teaches: a checker is only as good as the traces it is given. ``normalized`` reads
one ledger per rank into plain ``Call`` records (fields a hand-made event lacks take their
defaults), ``malformed`` says in words what makes a trace unreadable (an unknown operation,
a send with no peer, a call on a group its rank is not in), and ``created_in_order`` checks
rule 0 of ``nccl_rules``: every rank creates the same groups, in the same order.

Laptop:  used through ``nccl_rules.nccl_hazards``; nothing to run on its own.
GPU box: the same.
"""
from __future__ import annotations

from dataclasses import dataclass

P2P = ("send", "recv")
SIZED = ("all_reduce", "broadcast", "all_gather", "reduce_scatter")  # same count on every rank
COLLECTIVES = SIZED + ("all_to_all", "barrier", "gather_object", "all_gather_object",
                       "broadcast_object")
OPS = P2P + COLLECTIVES + ("new_group",)


@dataclass
class Call:
    rank: int
    op: str
    bytes: int = 0
    peer: int | None = None
    dtype: str | None = None
    ranks: tuple = ()          # the group's members (the world when a trace leaves it empty)
    order: int = 0
    batch: object = None
    waited: int | None = None
    group: str | None = None
    root: int | None = None
    written: bool = False      # a send whose buffer was written before its wait (comm notes it)

    @property
    def p2p(self) -> bool:
        return self.op in P2P

    def __str__(self) -> str:
        dtype = (self.dtype or "?").replace("torch.", "")
        if self.p2p:
            where = "to" if self.op == "send" else "from"
            kind = f"{'batched ' if self.batch is not None else ''}{self.op}"
            return f"{kind} {where} rank {self.peer} ({self.bytes} bytes of {dtype})"
        if self.op == "new_group":
            return f"new_group({list(self.ranks)})"
        root = f" from rank {self.root}" if self.op.startswith("broadcast") else (
            f" to rank {self.root}" if self.root is not None else "")
        return f"{self.op}{root} ({self.bytes} bytes of {dtype})"


def _int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def normalized(ledgers) -> tuple[list[list[Call]], list[str]]:
    """(each rank's calls sorted by ``order``, sentences on what could not be read)."""
    out, problems = [], []
    for rank, ledger in enumerate(ledgers):
        try:
            events = list(getattr(ledger, "events", ledger))
        except TypeError:
            problems.append(f"trace: rank {rank}'s ledger is not a list of events")
            continue
        calls = []
        for i, e in enumerate(events):
            fields = {name: getattr(e, name, Call.__dataclass_fields__[name].default)
                      for name in Call.__dataclass_fields__ if name != "rank"}
            if not isinstance(fields["op"], str):
                problems.append(f"trace: rank {rank}'s event #{i} has no operation name")
                continue
            fields["ranks"] = tuple(fields["ranks"] or ()) if _iterable(fields["ranks"]) else None
            try:
                hash(tuple(fields.values()))
            except TypeError:
                problems.append(f"trace: rank {rank}'s event #{i} has a field that is not a "
                                f"plain value: {fields}")
                continue
            calls.append(Call(rank, **fields))
        if not all(_int(c.order) for c in calls):
            problems.append(f"trace: rank {rank} has a call whose order is not an integer")
        out.append(sorted(calls, key=lambda c: c.order if _int(c.order) else 0))
    return out, problems


def _iterable(x) -> bool:
    try:
        iter(x if x is not None else ())
    except TypeError:
        return False
    return True


def malformed(calls: list[list[Call]]) -> list[str]:
    """What makes this trace impossible to replay, one sentence per problem (at most 5)."""
    n, problems = len(calls), []
    for rank, line in enumerate(calls):
        batches = {}
        for c in line:
            what = f"trace: rank {rank}'s {c.op} (order {c.order})"
            if c.op not in OPS:
                problems.append(f"{what} is not an operation the checker knows: {list(OPS)}")
                continue
            if c.ranks is None or not all(_int(m) and 0 <= m for m in c.ranks):
                problems.append(f"{what} names its group's members wrongly: {c.ranks!r}")
                continue
            if not c.ranks:
                c.ranks = tuple(range(n))
            if not _int(c.bytes) or c.bytes < 0 or not (c.waited is None or _int(c.waited)):
                problems.append(f"{what} has bytes={c.bytes!r}, waited={c.waited!r}")
            elif c.op != "new_group" and rank not in c.ranks:
                problems.append(f"{what} is on group {list(c.ranks)}, which rank {rank} is not in")
            elif c.p2p and not (_int(c.peer) and c.peer in c.ranks and c.peer < n):
                problems.append(f"{what} has peer {c.peer!r}: a global rank of its group "
                                f"{list(c.ranks)} inside the trace's {n} ranks is needed")
            elif c.batch is not None and not c.p2p:
                problems.append(f"{what} carries batch {c.batch!r}: only sends and receives "
                                f"are batched")
            elif c.batch is not None and batches.setdefault(c.batch, (c.group, c.ranks)) != (
                    c.group, c.ranks):
                problems.append(f"{what} is batched with calls on another group: "
                                f"batch_isend_irecv takes one group")
            elif c.root is not None and not (_int(c.root) and c.root in c.ranks):
                problems.append(f"{what} has root {c.root!r}, not a member of {list(c.ranks)}")
            elif c.op == "new_group" and c.waited is None:
                c.waited = c.order + 1            # it returns when the group exists
    return problems[:5]


def created_in_order(calls: list[list[Call]]) -> list[str]:
    """Rule 0: the same groups created in the same order on every rank, and each group
    name meaning the same members wherever it is used."""
    made = [[c.ranks for c in line if c.op == "new_group"] for line in calls]
    for i in range(max((len(m) for m in made), default=0)):
        seen = {r: m[i] if i < len(m) else None for r, m in enumerate(made)}
        if len(set(seen.values())) > 1:
            listing = ", ".join(f"rank {r}: {'nothing' if g is None else list(g)}"
                                for r, g in seen.items())
            return [f"order: the ranks create different groups as creation #{i} ({listing}); "
                    f"every rank must call new_group for every group, members or not, in the "
                    f"same order (torch.distributed docs, new_group)"]
    names = {}
    for line in calls:
        for c in line:
            if c.group is not None and c.op != "new_group":
                names.setdefault(c.group, {}).setdefault(c.ranks, c.rank)
    return [f"order: group #{name} has members {' on one rank, '.join(str(list(m)) for m in seen)}"
            f" on another (ranks {sorted(seen.values())}): the ranks created their groups in "
            f"different orders" for name, seen in sorted(names.items(), key=lambda kv: str(kv[0]))
            if len(seen) > 1]
