"""What went wrong in a launch, in words: which rank failed first, how, and what it last did.

What it teaches: when N processes run one program, one failure shows up as N failures (the
others lose their peer). The rank that failed *first* is the cause; a rank that was killed
(the out-of-memory killer, a segfault, ``os._exit``) leaves no traceback, only an exit code
or a signal; a rank that never started usually could not import what it was sent.

Laptop:  ``python -c "import lessonlib as L, os; L.launch(os._exit, 2, 3)"``  (exit code 3)
GPU box: the same.
"""
from __future__ import annotations

import importlib.util
import os
import re
import signal
import sysconfig
from pathlib import Path

from lessonlib.instruments import flight_recorder
from lessonlib.instruments.breadcrumbs import read_steps

STACK_SIGNAL = signal.SIGUSR1
_FRAME = re.compile(r'^  File "(.+)", line (\d+) in (.+)$')
# Where a rank waits is not in these: Python's own library, torch, and comm (the one pass
# through to torch.distributed); the line that called into them is the rank's.
_NOT_THE_RANKS = (sysconfig.get_paths()["stdlib"],
                  str(Path(importlib.util.find_spec("torch").origin).parent) + os.sep,
                  f"{os.sep}lessonlib{os.sep}comm.py")


def _short(path: str) -> str:
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def stuck_at(log_text: str) -> str | None:
    """Where the main thread of a rank's last stack dump was: its innermost line of the
    rank's own code (or lessonlib's), and the library call it waits in, if any."""
    dumps = log_text.split("(most recent call first):\n")
    for block in reversed(dumps[1:]):          # the main thread runs rank.main at the bottom
        frames = [m.groups() for line in block.splitlines() if (m := _FRAME.match(line))]
        if not any(f.endswith(f"launcher{os.sep}rank.py") and fn == "main"
                   for f, _, fn in frames):
            continue
        own = next((fr for fr in frames if not any(p in fr[0] for p in _NOT_THE_RANKS)), None)
        if own is None:
            return None
        where = f"{_short(own[0])}:{own[1]} in {own[2]}"
        inner = frames[0]
        if inner == own:
            return where
        return f"{where} (waiting in {inner[2]}, {_short(inner[0])}:{inner[1]})"
    return None


NEVER_STARTED_HINT = ("(nothing: it died while starting, before running any of lessonlib's "
                      "code. From a script, call launch under `if __name__ == '__main__':`, "
                      "since each rank re-imports the script.)")


class RankError(RuntimeError):
    """A rank raised, crashed or was killed; ``rank`` says which."""

    def __init__(self, message: str, rank: int):
        super().__init__(message)
        self.rank = rank


class LaunchTimeout(TimeoutError):
    """The ranks did not finish in time; ``last_steps`` maps rank -> last reported step,
    ``lines`` rank -> the line its stack was at (``stuck_at``; None: none was read),
    ``flight`` rank -> its flight recorder's last calls (``lessonlib.faults.hang_analysis``)."""

    def __init__(self, message: str, last_steps: dict[int, str],
                 lines: dict[int, str | None] | None = None, flight=None):
        super().__init__(message)
        self.last_steps = last_steps
        self.lines = lines or {}
        self.flight = flight or {}


def log_tail(workdir: Path, rank: int, lines: int = 15) -> str:
    path = workdir / f"rank{rank}.log"
    text = path.read_text(errors="replace").strip() if path.exists() else ""
    return "\n".join(text.splitlines()[-lines:])


def timed_out(workdir: Path, world_size: int, backend: str, timeout: float) -> LaunchTimeout:
    """The timeout, each rank's last step and the line its stack dump was at (the dumps
    were asked for by the caller: ``local._wait``)."""
    steps = read_steps(workdir, world_size)
    lines = {r: stuck_at(_log(workdir, r)) for r in range(world_size)}
    listing = "\n".join(f"  rank {r}: {s}" + (f"; at {lines[r]}" if lines[r] else "")
                        for r, s in steps.items())
    return LaunchTimeout(
        f"{world_size} {backend} ranks did not finish within timeout={timeout} s; "
        f"all ranks were stopped. Last step each rank reported, and the line it was at:\n"
        f"{listing}\n"
        f"A rank that never joins a collective leaves the others waiting; "
        f"raise timeout= if the work is only slow.", steps, lines,
        flight=flight_recorder.dump(workdir, world_size))


def _log(workdir: Path, rank: int) -> str:
    path = workdir / f"rank{rank}.log"
    return path.read_text(errors="replace") if path.exists() else ""


def dumped(workdir: Path, rank: int) -> bool:
    """Whether rank ``rank``'s log holds a stack dump."""
    return "(most recent call first):" in _log(workdir, rank)


def _how(exitcode: int) -> str:
    if exitcode < 0:
        try:
            return f"killed by signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"


def _last_line(traceback_text: str) -> str:
    lines = traceback_text.strip().splitlines()
    return lines[-1] if lines else ""


def first_failure(workdir: Path, world_size: int, deaths: dict[int, tuple[float, int]]) -> RankError:
    """The rank that failed first is the cause; the others usually failed because it left.

    ``deaths`` maps each rank seen ended without a result to (when it was seen, exit code).
    A rank that raised wrote ``rankN.error`` (its time and traceback); a rank that left no
    traceback is dated when the caller saw it gone, a little after it truly ended."""
    raised = {}
    for rank in range(world_size):
        path = workdir / f"rank{rank}.error"
        if path.exists():
            stamp, _, text = path.read_text().partition("\n")
            raised[rank] = (float(stamp), text)
    when = {r: seen - 0.1 for r, (seen, _) in deaths.items()}  # the poll comes after the death
    when.update({r: stamp for r, (stamp, _) in raised.items()})
    rank = min(when, key=lambda r: when[r])
    others = sorted(set(when) - {rank})
    after = (f" Rank(s) {others} failed after it, most likely because rank {rank} stopped."
             if others else "")
    if others and rank in raised and all(_last_line(raised.get(r, (0, ""))[1])
                                         == _last_line(raised[rank][1]) for r in others):
        after = f" Rank(s) {others} raised the same error on their own."
    if rank in raised:
        return RankError(f"rank {rank} of {world_size} raised an exception; the other ranks "
                         f"were stopped.{after} Traceback from rank {rank}:\n{raised[rank][1]}",
                         rank)
    exitcode = deaths[rank][1]
    if not (workdir / f"rank{rank}.log").exists():  # the rank's first act is to open its log
        return RankError(f"rank {rank} of {world_size} died while starting ({_how(exitcode)}); "
                         f"the other ranks were stopped.{after} Last lines it printed:\n"
                         f"{NEVER_STARTED_HINT}", rank)
    what = ("returned no result" if exitcode == 0 else _how(exitcode))
    return RankError(f"rank {rank} of {world_size} ended mid-run without a Python traceback "
                     f"({what}: the out-of-memory killer, a crash in native code, a kill or "
                     f"os._exit); the other ranks were stopped.{after} Last lines it printed:\n"
                     f"{log_tail(workdir, rank) or '(nothing)'}", rank)
