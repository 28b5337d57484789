"""The order the test workers take the suite's scopes in: the longest first.

pytest-xdist's ``--dist loadscope`` gives a worker a whole scope (a test file, or a notebook
with its kernel) and the next one when it is done. Left to itself it takes the scopes with
the most tests first, which leaves the files of one or two slow tests (a lab started as its
own command line, torchrun, the SLURM stand-in) to the end, where one worker runs them while
the other waits. Ordered by their measured seconds instead (``tests/durations.json``, longest
first: the longest-processing-time rule), the suite ends on short scopes. A scope not
measured yet goes first. ``make durations`` runs the suite and writes the file again; a
stale file only changes the order, never what runs.
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

DURATIONS = Path(__file__).resolve().parent / "durations.json"


def scope_of(nodeid: str) -> str:
    """The scope loadscope keeps on one worker: the node id up to its last ``::``."""
    return nodeid.rsplit("::", 1)[0]


def load(path: Path = DURATIONS) -> dict[str, float]:
    """Seconds per scope, as last measured ({} without the file)."""
    return json.loads(path.read_text()) if path.exists() else {}


def ordered(items: list, seconds: dict[str, float]) -> list:
    """The items grouped by scope, the longest scope first (unmeasured ones before all),
    each scope's items in their own order; equal scopes keep the collection's order."""
    scopes: dict[str, list] = {}
    for item in items:
        scopes.setdefault(scope_of(item.nodeid), []).append(item)
    longest_first = sorted(scopes, key=lambda scope: -seconds.get(scope, float("inf")))
    return [item for scope in longest_first for item in scopes[scope]]


class Recorder:
    """A pytest plugin for the process that sees every report (the controller, under
    xdist): sums each scope's setup, call and teardown seconds and writes them at the end."""

    def __init__(self, path: Path = DURATIONS):
        self.path, self.seconds = path, defaultdict(float)

    def pytest_runtest_logreport(self, report):
        self.seconds[scope_of(report.nodeid)] += report.duration

    def pytest_sessionfinish(self, session, exitstatus):
        table = {scope: round(s, 1) for scope, s in
                 sorted(self.seconds.items(), key=lambda kv: (-kv[1], kv[0]))}
        self.path.write_text(json.dumps(table, indent=1) + "\n")
