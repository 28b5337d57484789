"""Every process a rank starts ends with the launch, whatever session or group it moved to.

What it teaches: a process group is the usual handle on "a program and all it started"
(a shell's job control, ``killpg``), but any process may leave its group: ``setsid``
(``subprocess.Popen(..., start_new_session=True)``, every daemon) or ``setpgid``
(``process_group=0``). When its parent ends it is adopted by init and outlives everything.
Linux offers a handle that no process can leave: a *child subreaper*
(``prctl(PR_SET_CHILD_SUBREAPER)``, what systemd, tini and Docker's init use). An orphan is
adopted by its nearest subreaper ancestor instead of init, so every rank is one: all it
started, in any session, stays below it while it lives, and a rank ends that tree before it
ends itself. The fork server is one too: the orphans of a rank that ended without ending its
tree (killed from outside, ``os._exit``) wait below the server for the launch to end them
(a cold rank, ``warm=False``, has no server above it: those orphans go to init). A cgroup
would hold them as well, but needs a delegated cgroup, which a notebook's user seldom has.
Elsewhere (macOS) the process group is all there is: these calls do nothing.

Laptop:  ``python -c "from lessonlib.launcher import reaper as r; print(r.become_subreaper())"``
GPU box: the same.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

PR_SET_CHILD_SUBREAPER = 36      # from <linux/prctl.h>


def become_subreaper() -> bool:
    """Adopt this process's orphaned descendants; False where the kernel cannot."""
    if not sys.platform.startswith("linux"):
        return False
    return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def _processes() -> dict[int, tuple[int, bool]]:
    """pid -> (parent pid, still running) for every process in /proc (none without it)."""
    found = {}
    for entry in os.scandir("/proc") if os.path.isdir("/proc") else ():
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    stat = f.read()
            except OSError:              # ended meanwhile
                continue
            state, parent = stat[stat.rindex(b")") + 2:].split()[:2]
            found[int(entry.name)] = (int(parent), state not in (b"Z", b"X"))
    return found


def descendants(roots: list[int], spare: frozenset[int] = frozenset()) -> list[int]:
    """The running descendants of ``roots``, except the processes in ``spare`` and theirs."""
    children: dict[int, list[int]] = {}
    running = set()
    for pid, (parent, alive) in _processes().items():
        children.setdefault(parent, []).append(pid)
        if alive:
            running.add(pid)
    found, todo = [], list(roots)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in spare:
                found.append(child)
                todo.append(child)
    return [pid for pid in found if pid in running]


def _has_children() -> bool:
    """Whether this process has any child, running or ended (one cheap call, no /proc scan)."""
    if not hasattr(os, "waitid"):
        return True
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)   # reaps nothing
    except ChildProcessError:
        return False
    return True


def end_descendants(roots: list[int], spare: frozenset[int] = frozenset(),
                    within_s: float = 2.0) -> None:
    """SIGKILL every running descendant of ``roots`` (but ``spare`` and theirs), again until
    none is left: the orphans of one ended are adopted by a root (a subreaper) meanwhile."""
    if not roots or (roots == [os.getpid()] and not _has_children()):
        return
    deadline = time.monotonic() + within_s
    while (left := descendants(roots, spare)) and time.monotonic() < deadline:
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):  # gone, or not ours to end
                pass
        time.sleep(0.01)
