"""The flight recorder: each rank's last N collectives, readable while the rank is stuck.

What it teaches: when a job hangs, every rank is waiting inside some collective, and the
question is which one, on which group, and who never came. PyTorch's Flight Recorder keeps
a ring buffer of each rank's recent collectives (``TORCH_FR_BUFFER_SIZE``, formerly
``TORCH_NCCL_TRACE_BUFFER_SIZE``) and dumps it when its watchdog times out
(``TORCH_NCCL_DUMP_ON_TIMEOUT``). This is the same record in the ledger's terms: an
``Entry`` per call that ``comm`` posts (operation, group and its members, this call's
sequence number on that group, bytes, shape, dtype, peer), marked "posted" when the call
starts and "completed" when it returns (or when its handle reports it done).

A rank stuck in a collective runs no Python, so a ring kept in its memory could only be
dumped by another thread. Ours is a file of N fixed slots, one per entry, overwritten in
turn with ``pwrite`` (as ``breadcrumbs`` does): the launcher reads every rank's ring after
a timeout (``dump``), from outside, whatever state the rank is in.
``lessonlib.faults.hang_analysis`` reads the dumps and names the stuck collective.

It records only inside ``launch`` (which names the folder); ``LESSONLIB_FLIGHT_RECORDER``
sets N (default 64; 0 turns it off). Each call costs two small writes.

Laptop:  ``python -c "from lessonlib.faults import hangs; print(hangs.diagnose('skipped').finding)"``
GPU box: the same; under NCCL, read PyTorch's own dumps with ``hang_analysis.from_torch_dump``.
"""
from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, fields
from pathlib import Path

import torch.distributed as dist

from lessonlib.instruments.breadcrumbs import PROGRESS_ENV

SIZE_ENV = "LESSONLIB_FLIGHT_RECORDER"
DEFAULT_SIZE = 64
SLOT = 512                     # bytes per entry in the ring's file


@dataclass(frozen=True)
class Entry:
    """One call a rank posted: ``seq`` counts this rank's calls on ``group`` (from 1), as
    PyTorch's ``collective_seq_id`` does; point-to-point calls count per peer."""
    rank: int
    record: int                # this rank's entry number, across groups (from 0)
    op: str
    group: str | None
    ranks: tuple[int, ...]     # the group's members, global ranks
    seq: int
    bytes: int
    shape: tuple[int, ...]
    dtype: str | None
    peer: int | None = None
    state: str = "posted"      # "posted", then "completed"

    @property
    def p2p(self) -> bool:
        return self.peer is not None


FIELDS = [f.name for f in fields(Entry)]


class FlightRecorder:
    """This rank's ring: ``post`` an entry, ``done`` when its call returns. An entry is
    written as a JSON list in ``FIELDS`` order, its state last, so that marking it
    completed rewrites one slot from the text already made."""

    def __init__(self, path: Path, size: int, rank: int):
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        self.size, self.rank, self.records = size, rank, 0
        self.seqs: Counter = Counter()
        self.pending: list = []        # (entry, body, handle) of asynchronous calls not seen done

    def post(self, op, group, ranks, nbytes, shape, dtype, peer) -> tuple[Entry, str]:
        """Write the entry of a call about to start: (the entry, its text less its state)."""
        self._poll()
        key = (group, peer)
        self.seqs[key] += 1
        entry = Entry(self.rank, self.records, op, group, tuple(ranks), self.seqs[key], nbytes,
                      tuple(shape), dtype, peer)
        self.records += 1
        body = json.dumps([entry.rank, entry.record, op, group, entry.ranks, entry.seq, nbytes,
                           entry.shape, dtype, peer])[:-1]
        self._write(entry.record, body, "posted")
        return entry, body

    def done(self, posted: tuple[Entry, str], work, async_op: bool):
        if async_op and work is not None:
            self.pending.append((*posted, work))
        else:
            self._write(posted[0].record, posted[1], "completed")
        return work

    def _poll(self) -> None:
        """Mark the asynchronous calls whose handles say they finished (PyTorch's watchdog
        polls its work objects the same way)."""
        still = []
        for entry, body, work in self.pending:
            if work.is_completed():
                self._write(entry.record, body, "completed")
            elif entry.record > self.records - self.size:   # not yet overwritten
                still.append((entry, body, work))
        self.pending = still

    def _write(self, record: int, body: str, state: str) -> None:
        line = f'{body},"{state}"]'.encode()
        os.pwrite(self.fd, line[:SLOT].ljust(SLOT), (record % self.size) * SLOT)


_recorders: dict[str, FlightRecorder] = {}   # this process's ring, by the launch's folder


def recorder() -> FlightRecorder | None:
    """This rank's ring, or None outside a launch or when switched off."""
    folder = os.environ.get(PROGRESS_ENV)
    if folder is None or not dist.is_initialized():
        return None
    if folder not in _recorders:
        size = int(os.environ.get(SIZE_ENV, DEFAULT_SIZE))
        if size <= 0:
            return None
        rank = dist.get_rank()
        for old in _recorders.values():      # a ring of an earlier launch in this process
            os.close(old.fd)
        _recorders.clear()
        _recorders[folder] = FlightRecorder(Path(folder) / f"rank{rank}.flight", size, rank)
    return _recorders[folder]


def read(path: Path) -> list[Entry]:
    """One rank's ring, oldest first (a slot caught mid-write is skipped)."""
    data = path.read_bytes() if path.exists() else b""
    entries = []
    for start in range(0, len(data), SLOT):
        try:
            values = dict(zip(FIELDS, json.loads(data[start:start + SLOT].rstrip(b" \x00"))))
        except ValueError:
            continue
        entries.append(Entry(**{**values, "ranks": tuple(values["ranks"]),
                                "shape": tuple(values["shape"])}))
    return sorted(entries, key=lambda e: e.record)


def dump(workdir: Path, world_size: int) -> dict[int, list[Entry]]:
    """Every rank's ring, read from outside: {rank: entries, oldest first}."""
    return {rank: read(Path(workdir) / f"rank{rank}.flight") for rank in range(world_size)}
