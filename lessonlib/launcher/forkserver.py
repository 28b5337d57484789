"""multiprocessing's fork server, through the few private details the launcher needs.

What it teaches: Python's ``forkserver`` start method and ``set_forkserver_preload`` are
public, but restarting the server (lessonlib changed on disk), asking its pid, letting a
forked rank drop the server's "caller alive" pipe, choosing multiprocessing's temp folder
and knowing that a process *is* the server are not. Those private attributes of
``multiprocessing.forkserver.ForkServer`` are touched here and nowhere else, and ``check``
fails at once, with a sentence, if a Python release changes them (not a hang in a rank).

Checked on CPython 3.10.13, 3.11.7, 3.12.1 and 3.13.0: ``forkserver.py`` has the same
attributes, the same ``main(listener_fd, alive_r, preload, ...)`` command line and the same
``raise SystemExit`` at the caller's end in all four. ``tests/test_launcher_forkserver.py``
runs ``check`` on every Python it finds.

Laptop:  ``python -c "from lessonlib.launcher import forkserver; forkserver.check()"``
GPU box: the same (only the standard library is imported).
"""
from __future__ import annotations

import atexit
import multiprocessing.forkserver
import multiprocessing.process
import os
import sys
import warnings

CHECKED_ON = ("3.10", "3.11", "3.12", "3.13")
ATTRIBUTES = ("_lock", "_forkserver_pid", "_forkserver_alive_fd", "_forkserver_address",
              "_stop_unlocked", "ensure_running", "set_forkserver_preload")
# The command the caller gives the server's interpreter (``ensure_running``): how a process
# knows it is the server.
SERVER_COMMAND = "from multiprocessing.forkserver import main"


def server():
    return multiprocessing.forkserver._forkserver


def check(obj=None) -> None:
    """RuntimeError naming what is gone if ``obj`` (default: this process's ForkServer) lacks
    a private detail the launcher uses."""
    obj = server() if obj is None else obj
    missing = [name for name in ATTRIBUTES if not hasattr(obj, name)]
    if not hasattr(multiprocessing.process.current_process(), "_config"):
        missing.append("multiprocessing.process.current_process()._config")
    if missing:
        raise RuntimeError(
            f"Python {sys.version.split()[0]}'s multiprocessing.forkserver no longer has "
            f"{', '.join(missing)}, which lessonlib's warm launches use (checked on Python "
            f"{', '.join(CHECKED_ON)}); launch with warm=False, which spawns fresh ranks")


def lock():
    return server()._lock


def pid() -> int | None:
    return server()._forkserver_pid


def _stopping_marker(address) -> str | None:
    """A file beside the server's socket that says "stopped by a caller that lives on"."""
    if not isinstance(address, str) or not address or address.startswith("\0"):
        return None
    return os.path.join(os.path.dirname(address), f"stopping-{os.path.basename(address)}")


def stop_unlocked() -> None:
    """Stop the server; hold ``lock()``. The server is told first that its caller lives on
    (it must not wait for its caller's folders to be let go)."""
    marker = _stopping_marker(server()._forkserver_address)
    if marker:
        open(marker, "w").close()
    server()._stop_unlocked()
    if marker and os.path.exists(marker):
        os.unlink(marker)


def drop_alive_pipe() -> None:
    """In a forked rank: close its inherited copy of the server's "caller alive" pipe, so
    that the server ends as soon as the caller does, not when the last rank does."""
    obj = server()
    if obj._forkserver_alive_fd is not None:
        os.close(obj._forkserver_alive_fd)
        obj._forkserver_alive_fd = None


def temp_folder() -> str | None:
    """The folder multiprocessing makes its sockets in (None: not chosen yet)."""
    return multiprocessing.process.current_process()._config.get("tempdir")


def set_temp_folder(folder: str) -> None:
    multiprocessing.process.current_process()._config["tempdir"] = folder


def in_server() -> bool:
    return any(SERVER_COMMAND in arg for arg in getattr(sys, "orig_argv", ()))


def _end_at_once(server_pid: int, caller_pid: int) -> None:
    """The server's last act: when its caller is gone, remove the launch folders nobody holds
    any longer (its caller's among them), then leave without the interpreter's slow teardown
    of torch (1.3-1.7 s, measured), so nothing outlives the caller."""
    if os.getpid() != server_pid:          # a rank forked from the server inherits this hook
        return
    marker = _stopping_marker(server()._forkserver_address)
    if not (marker and os.path.exists(marker)):   # the caller ended (it may still be ending)
        from lessonlib.launcher import folders, reaper
        reaper.end_descendants([server_pid])       # its ranks, and all they started
        folders.sweep(owner=caller_pid)
    os._exit(0)


if in_server():
    # A group of its own: a signal to its caller's group (a sweep's killpg at a point's
    # timeout, say) leaves it to end by itself, at once, cleaning up after its caller.
    try:
        os.setpgid(0, 0)
    except OSError:                      # a session leader already: nothing to leave
        pass
    # A subreaper: the orphans of a rank that ended without ending them (killed from outside,
    # os._exit) are adopted here, not by init, for the launch to end (``reaper``). The server
    # reaps them when they end, which multiprocessing would otherwise warn about.
    from lessonlib.launcher import reaper
    reaper.become_subreaper()
    warnings.filterwarnings("ignore", message="forkserver: waitpid returned unexpected pid")
    atexit.register(_end_at_once, os.getpid(), os.getppid())
