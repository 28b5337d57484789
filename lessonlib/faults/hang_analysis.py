"""Which collective is stuck, on which group, and who never came: read from the dumps.

What it teaches: a hang is found by lining the ranks' flight records up by group and
sequence number, as PyTorch's Flight Recorder analyzer does
(``torch/distributed/flight_recorder/fr_trace.py``, "torchfrtrace"): every member of a group
must post its k-th collective on that group with the same operation and sizes. The first
k where that fails is the stuck collective, and what fails names the bug:

- ``size_mismatch``: every member posted it, with different sizes (one rank's tensor was
  cut short: the ranks with the bigger buffer wait for bytes that never come);
- ``op_mismatch``: every member posted its k-th call, but not the same operation;
- ``out_of_order``: a member is missing, and it waits in a collective of another group
  that the waiting ranks have not posted: the ranks disagree on the order of their
  collectives, and each side waits for the other (a call posted in another order, or a
  skipped call followed by another collective: a snapshot cannot tell which);
- ``skipped``: a member is missing and waits in no collective: it went past the call (a
  collective inside a rank-dependent ``if``), its last sequence number on the group is lower.

When several groups break, the stuck collective is the one the most ranks wait in.

Pure: no torch, no process. ``from_torch_dump`` turns one rank's dump of PyTorch's own
Flight Recorder (``torch._C._distributed_c10d._dump_fr_trace()``, the pickle the watchdog
writes on NCCL) into the same entries, so the same analysis reads both.

Laptop:  ``python -c "from lessonlib.faults import hangs; print(hangs.diagnose('reordered').finding)"``
GPU box: the same; or read the NCCL dumps of ``TORCH_FR_DUMP_TEMP_FILE`` with ``from_torch_dump``.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from lessonlib.instruments.flight_recorder import Entry


@dataclass(frozen=True)
class Finding:
    """The stuck collective: ``op`` number ``seq`` on ``group`` (members ``ranks``), posted
    by ``posted``, never by ``missing``; ``kind`` says how it went wrong."""
    kind: str
    group: str | None
    ranks: tuple[int, ...]
    seq: int
    op: str
    posted: tuple[int, ...]
    missing: tuple[int, ...]
    detail: str

    def __str__(self) -> str:
        return (f"{self.kind}: {self.op} #{self.seq} on group {self.group} {list(self.ranks)}; "
                f"posted by {list(self.posted)}, missing {list(self.missing)}. {self.detail}")


def _where(entry: Entry) -> str:
    return f"{entry.op} #{entry.seq} on group {entry.group}"


def _lines(dumps: dict[int, list[Entry]]):
    """{(group, members): {rank: {seq: entry}}} for the collectives (not point-to-point)."""
    lines = defaultdict(lambda: defaultdict(dict))
    for rank, entries in dumps.items():
        for e in entries:
            if not e.p2p:
                lines[(e.group, e.ranks)][rank][e.seq] = e
    return lines


def describe(dumps: dict[int, list[Entry]], last: int = 3) -> str:
    """Each rank's ``last`` entries, one line each: what a dump shows a person."""
    return "\n".join(f"rank {rank}: " + "; ".join(
        f"{e.op} #{e.seq} on group {e.group} {list(e.shape)} {e.state}" for e in entries[-last:])
        for rank, entries in sorted(dumps.items()))


def stuck_in(dumps: dict[int, list[Entry]]) -> dict[int, Entry]:
    """Each rank's last entry, where it never completed: the call the rank is waiting in."""
    return {rank: entries[-1] for rank, entries in dumps.items()
            if entries and entries[-1].state != "completed"}


def _first_break(group, members, by_rank) -> Finding | None:
    """The first sequence number on one group at which its members disagree."""
    first = max((min(seqs) for seqs in by_rank.values()), default=1)  # the rings' common window
    last = max((max(seqs) for seqs in by_rank.values()), default=0)
    for seq in range(first, last + 1):
        calls = {r: by_rank[r][seq] for r in members if seq in by_rank.get(r, {})}
        posted = tuple(sorted(calls))
        missing = tuple(r for r in members if r not in calls)
        some = calls[posted[0]]
        if missing:
            return Finding("missing", group, members, seq, some.op, posted, missing, "")
        if len({e.op for e in calls.values()}) > 1:
            ops = ", ".join(f"rank {r}: {e.op}" for r, e in calls.items())
            return Finding("op_mismatch", group, members, seq, some.op, posted, (),
                           f"The members posted different operations as call #{seq} ({ops}).")
        if len({e.shape for e in calls.values()}) > 1:
            sizes = ", ".join(f"rank {r}: {list(e.shape)}" for r, e in calls.items())
            return Finding("size_mismatch", group, members, seq, some.op, posted, (),
                           f"The members posted different sizes ({sizes}).")
    return None


def _explain_missing(f: Finding, stuck: dict[int, Entry], dumps) -> Finding:
    """A missing rank stuck elsewhere (in a call the waiting ranks have not posted) posted in
    another order; one stuck nowhere skipped the call."""
    elsewhere = {r: stuck[r] for r in f.missing if r in stuck}
    if elsewhere:
        said = "; ".join(f"rank {r} is waiting in {_where(e)}, which rank(s) "
                         f"{[p for p in f.posted if p in e.ranks]} have not reached"
                         for r, e in elsewhere.items())
        return Finding("out_of_order", f.group, f.ranks, f.seq, f.op, f.posted, f.missing,
                       f"The ranks disagree on the order of their collectives and each side waits "
                       f"for the other: {said}.")
    lasts = {r: max((e.seq for e in dumps.get(r, []) if e.group == f.group and not e.p2p),
                    default=0) for r in f.missing}
    said = ", ".join(f"rank {r} stopped at #{n}" for r, n in lasts.items())
    return Finding("skipped", f.group, f.ranks, f.seq, f.op, f.posted, f.missing,
                   f"The missing rank(s) wait in no collective ({said} on this group): "
                   f"they went past this call without posting it.")


def analyze(dumps: dict[int, list[Entry]]) -> Finding | None:
    """The stuck collective from every rank's flight record ({rank: entries}), or None when
    the records agree. A mismatch is the cause before any missing rank (the mismatched call
    is what left the others waiting); among missing ranks, the break the most ranks wait in."""
    stuck = stuck_in(dumps)
    breaks = [b for (group, members), by_rank in sorted(_lines(dumps).items(), key=str)
              if (b := _first_break(group, members, by_rank)) is not None]
    if not breaks:
        return None
    mismatches = [b for b in breaks if b.kind != "missing"]
    if mismatches:
        return mismatches[0]
    waiting = max(breaks, key=lambda b: sum(
        1 for r in b.posted if r in stuck and (stuck[r].group, stuck[r].seq) == (b.group, b.seq)))
    return _explain_missing(waiting, stuck, dumps)


# ---------------------------------------------------------------- PyTorch's own dumps
def torch_members(dumps: dict[int, dict]) -> dict[str, tuple[int, ...]]:
    """Each group's ranks from PyTorch dumps ({rank: dump}): ``pg_config``'s lists where it
    has them (NCCL), else the ranks whose ``pg_status`` knows the group (gloo's dump lists
    only the default group's configuration, with no ranks)."""
    members: dict[str, set] = defaultdict(set)
    for rank, dump in dumps.items():
        for group in dump.get("pg_status", {}):
            members[group].add(rank)
    listed = {g: tuple(ranks) for cfg in (d.get("pg_config", {}) for d in dumps.values())
              for g, c in cfg.items() if (ranks := _ranks(c.get("ranks")))}
    return {g: listed.get(g, tuple(sorted(r))) for g, r in members.items()}


def _ranks(text) -> list[int]:
    text = str(text or "").strip("[] ")
    return [int(r) for r in text.split(",") if r.strip().isdigit()]


def from_torch_dump(dump: dict, rank: int, members: dict[str, tuple[int, ...]]) -> list[Entry]:
    """One rank's PyTorch Flight Recorder dump (the unpickled dict of
    ``torch._C._distributed_c10d._dump_fr_trace()``, the file the NCCL watchdog writes on a
    timeout) as this module's entries. Its ``entries`` carry ``process_group`` (name,
    description), ``collective_seq_id``, ``p2p_seq_id``, ``profiling_name``
    ("nccl:all_reduce"), ``input_sizes``, ``input_dtypes`` and ``state``; ``pg_status`` says
    each group's ``last_completed_collective``, which dates the entries gloo leaves
    "scheduled". ``members``: each group's ranks (``torch_members``)."""
    out = []
    for i, e in enumerate(dump["entries"]):
        group, p2p = e["process_group"][0], e.get("is_p2p", False)
        seq = e["p2p_seq_id"] if p2p else e["collective_seq_id"]
        done = e["state"] == "completed" or (not p2p and seq <= dump.get("pg_status", {}).get(
            group, {}).get("last_completed_collective", -1))
        shape = tuple(e["input_sizes"][0]) if e["input_sizes"] else ()
        out.append(Entry(rank=rank, record=i, op=e["profiling_name"].split(":")[-1], group=group,
                         ranks=tuple(members[group]), seq=seq, bytes=0, shape=shape,
                         dtype=(e["input_dtypes"] or [None])[0], peer=-1 if p2p else None,
                         state="completed" if done else "posted"))
    return out


def analyze_torch(dumps: dict[int, dict]) -> Finding | None:
    """``analyze`` over PyTorch Flight Recorder dumps, {rank: unpickled dump}."""
    members = torch_members(dumps)
    return analyze({rank: from_torch_dump(d, rank, members) for rank, d in dumps.items()})
