"""The launch's private folders, each held by a lock while its owner lives.

What it teaches: a folder in the shared temp folder is stale when its owner is gone, and
"gone" must be asked of something the owner itself holds. A process id is not that: a
process in another PID namespace (another container sharing the temp folder, ``unshare
-p``) cannot see the owner's pid and would take a live launch for a dead one. A lock is:
each folder ``lessonlib-<pid>-*`` holds ``owner.lock``, locked (``flock``) by the process
that made it for as long as it uses the folder; the kernel releases the lock when that
process ends, however it ends (``kill -9`` included), in whatever namespace it ran. A folder
whose lock can be taken is stale and removed by the next launch, by the launch's end, or by
the fork server as it ends with its caller. A lock that is not a regular file (a FIFO that
anyone on a shared ``/tmp`` can make, whose opening would block every later launch) is never
opened blocking: its folder is left alone, with one line saying so. A folder another user
owns is never touched (anyone may plant one on a shared ``/tmp``, and it is not ours to
delete), and one that could not be wholly deleted is remembered and not walked again by this
process: a planted folder of many files would otherwise slow every launch.

A folder that holds a Unix socket (the fork server's) is made where the socket's path fits
(about 100 bytes): the temp folder, or, when that is too long (macOS's own is about 48
characters), a short system temp folder, which the sweeps cover too. multiprocessing's own
fallback, a ``pymp-*`` folder, is removed only by a caller that exits normally.

Laptop:  ``python -c "from lessonlib.launcher import folders; print(folders.new())"``
GPU box: the same.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import stat
import tempfile
import time
import warnings
from pathlib import Path

LOCK = "owner.lock"
PREFIX = "lessonlib-"
# The longest base a socket's folder may have: its socket is <base>/lessonlib-<pid>-<kind><8
# random>/listener-<8 random> (multiprocessing's name), under 100 bytes with the largest pid.
SOCKET_BASE_MAX = 100 - len("/lessonlib-4194304-server-12345678/listener-12345678")
SHORT_TEMP_FOLDERS = ("/tmp", "/var/tmp", "/dev/shm")
_held: dict[str, int] = {}  # folder -> the open file descriptor holding its lock
_failed: set[tuple[str, int, int]] = set()  # (folder, inode, ctime in ns) a sweep could not delete


def socket_base() -> str | None:
    """Where a folder for a socket goes: the temp folder if short enough, else the first
    short system temp folder this process may write to (None: there is none)."""
    for base in (tempfile.gettempdir(), *SHORT_TEMP_FOLDERS):
        if len(base) <= SOCKET_BASE_MAX and os.path.isdir(base) \
                and os.access(base, os.W_OK | os.X_OK):
            return base
    return None


def _bases() -> list[str]:
    """Every folder this module makes folders in: the temp folder and the sockets' one."""
    temp, sockets = tempfile.gettempdir(), socket_base()
    return [temp] if sockets in (None, temp) else [temp, sockets]


def new(kind: str = "", socket: bool = False) -> Path:
    """A fresh folder ``lessonlib-<pid>-<kind>*`` in the temp folder (``socket``: where a
    socket's path fits), locked by this process until ``remove`` (or its end); stale folders
    are swept first."""
    sweep()
    base = socket_base() if socket else None
    # Locked under a hidden name, then renamed (atomic): no sweep ever sees it unlocked
    staging = Path(tempfile.mkdtemp(prefix=f".{PREFIX}{os.getpid()}-{kind}", dir=base))
    fd = os.open(staging / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    folder = staging.with_name(staging.name[1:])
    os.rename(staging, folder)
    _held[str(folder)] = fd
    return folder


def remove(folder) -> None:
    """Delete a folder this process made, then let go of its lock."""
    shutil.rmtree(folder, ignore_errors=True)
    fd = _held.pop(str(folder), None)
    if fd is not None:
        os.close(fd)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stale(folder: Path) -> bool:
    """True if nobody holds the folder's lock (without a lock file: if its pid is not a live
    process here)."""
    try:
        # Non-blocking and not through a link: whatever the file is, opening it returns at once
        fd = os.open(folder / LOCK, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:          # not made by ``new``: the old rule, by its pid
        pid = folder.name[len(PREFIX):].split("-")[0]
        return pid.isdigit() and not _pid_alive(int(pid))
    except OSError:
        return False
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        warnings.warn(f"{folder / LOCK} is not a regular file, so it is no lock lessonlib made; "
                      f"that folder is left alone (remove it if it is yours)", stacklevel=3)
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False                     # held: its owner is alive, in whatever namespace
    finally:
        os.close(fd)
    return True


def _identity(folder: Path, st: os.stat_result) -> tuple[str, int, int]:
    return str(folder), st.st_ino, st.st_ctime_ns


def _ours(folder: Path) -> bool:
    """A real folder (not a link) this user owns, that no sweep of this process failed to
    delete."""
    try:
        st = folder.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() \
        and _identity(folder, st) not in _failed


def _delete(folder: Path) -> None:
    """Delete a stale folder; remember it if some of it stays (not ours, or in use)."""
    shutil.rmtree(folder, ignore_errors=True)
    try:
        _failed.add(_identity(folder, folder.lstat()))
    except FileNotFoundError:
        pass


def sweep(owner: int | None = None, within_s: float = 1.0) -> None:
    """Remove the folders whose owner is gone (killed before it could clean up). ``owner``:
    a pid that just ended, whose folders may stay locked a moment longer (the kernel
    releases a dead process's files in no set order): wait up to ``within_s`` for them."""
    deadline = time.monotonic() + within_s
    while True:
        for folder in (f for base in _bases() for f in Path(base).glob(f"{PREFIX}*-*")):
            if str(folder) not in _held and _ours(folder) and _stale(folder):
                _delete(folder)
        if owner is None or time.monotonic() > deadline or not any(
                f for base in _bases() for f in Path(base).glob(f"{PREFIX}{owner}-*")):
            return
        time.sleep(0.02)
