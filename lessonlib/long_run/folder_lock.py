"""One run per checkpoint folder: a lock that the run holds from its first look at the folder
to its end.

What it teaches: two trainings that share a checkpoint folder (the same command started
twice, a second run given the first one's folder) each take the other's files for their own:
one prunes the step folders and temporary files the other is writing, and both runs' work is
lost. A lock file says "this folder is in use": the first run takes it, a second one is
refused in one line that names the first's process, before it reads or moves anything.

The lock is ``flock`` on ``<folder>/run.lock``, which holds the holder's process id for people
and for that line. The kernel releases an ``flock`` when its process dies, however it dies
(``kill -9``, a preempted job), so the lock of a dead run is simply taken over: no stale lock
to delete by hand, and no guess from a process id that another process may have reused.
On a file system without ``flock`` the process id alone decides: a lock whose process no
longer runs on this host is taken over.

The run's launcher (the caller of ``launch``, or rank 0 under torchrun) holds it; the ranks
only write what they are told. Releasing removes the file; a run.lock this module did not
write (a user's file of that name) is refused, never overwritten or removed.

Laptop:  ``python labs/train.py --world-size 2 --checkpoint-dir results/ckpt`` twice, at
         once: the second says which process holds the folder
GPU box: the same under torchrun (rank 0 holds the lock for its job)
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
from pathlib import Path

from lessonlib.long_run.checkpoint_folder import LOCK


def holder(directory) -> str:
    """Who holds ``directory``'s lock, as its file says ("process 1234 on host"), or ""."""
    try:
        pid, _, host = (Path(directory) / LOCK).read_text().strip().partition(" ")
    except OSError:
        return ""
    return f"process {pid} on {host}" if pid.isdigit() else ""


def _alive_here(text: str) -> bool:
    """Does the "pid host" ``text`` name a process still running on this host?"""
    pid, _, host = text.strip().partition(" ")
    if not pid.isdigit() or host != socket.gethostname() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)      # PermissionError: another user's process, alive
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _busy(directory, setting: str) -> ValueError:
    who = holder(directory) or "a process"
    return ValueError(
        f"{setting}={str(directory)!r} is in use by another run ({who} holds "
        f"{Path(directory) / LOCK}); two runs in one folder delete each other's checkpoints. "
        f"Wait for that run to end (or stop it), or give this run its own folder")


def _take(path: Path, setting: str) -> int:
    """Open and lock ``path``; the file descriptor, or ValueError naming the holder."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise _busy(path.parent, setting) from None
        except OSError as exc:    # no flock on this file system: the process id decides
            if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                os.close(fd)
                raise
            if _alive_here(os.pread(fd, 200, 0).decode(errors="replace")):
                os.close(fd)
                raise _busy(path.parent, setting) from None
        try:      # the file we locked is still the one at ``path`` (not one just released)
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    if not _ours(os.pread(fd, 4096, 0).decode(errors="replace")):
        os.close(fd)
        raise ValueError(f"{setting}={str(path.parent)!r} holds a {LOCK} that this course did "
                         f"not write (the run would overwrite it, then delete it); move that "
                         f"file away, or give the run another folder")
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
    return fd


def _ours(text: str) -> bool:
    """Whether a lock file's ``text`` is one this module writes ("pid host", or empty: just
    made, or a holder killed between making and writing it)."""
    pid, _, host = text.strip().partition(" ")
    return not text.strip() or (pid.isdigit() and bool(host) and " " not in host)


@contextlib.contextmanager
def hold(directory, setting: str = "checkpoint_dir"):
    """Hold ``directory``'s lock for the ``with`` block (the folder is created if need be);
    ValueError naming ``setting`` and the holder's process if another live process holds it."""
    path = Path(directory) / LOCK
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = _take(path, setting)
    try:
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)           # while still locked: a newcomer then makes a new file
        os.close(fd)
