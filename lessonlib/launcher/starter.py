"""Warm starts: ranks forked from a server that imported torch once, never running stale code.

What it teaches: starting a rank costs an interpreter plus ``import torch`` (seconds), while
the work of a small lesson costs milliseconds. Python's ``forkserver`` start method keeps one
small server process per caller; ``set_forkserver_preload`` makes it import torch once, and
each rank is then a ``fork`` of that server (a tenth of a second). The server never imports
the worker's own module, so each rank imports it fresh from disk; when a file of lessonlib
itself changes (an author editing it), the server is restarted before the next launch. It
preloads the lessons' rooms the caller has imported (a lab script pays for its own only),
with torch._dynamo once the caller trains (torch.optim's first optimizer imports it), and
restarts once, with every room, when the caller imports another. The server ends with its
caller. Where there is no forkserver (Windows), ranks are spawned.

Each launch also gets a private folder ``lessonlib-<caller pid>-*`` in the temp folder (logs,
results, the rendezvous file), and the caller one of its own for the server's socket and
torch's compile cache (``folders``: each held by a lock while its owner lives). The private
details of multiprocessing it needs are gathered in ``forkserver``.

Laptop:  ``python labs/launch_overhead.py --repeats 5``  (cold and warm launches)
GPU box: the same.
"""
from __future__ import annotations

import multiprocessing
import multiprocessing.util
import os
import sys
import tempfile
from pathlib import Path

import lessonlib
from lessonlib.launcher import folders, forkserver

# What every rank would otherwise import again: torch, and the lessons' own rooms (their
# imports pull in DTensor and torch's pipelining too, about 2 s together). Safe to preload:
# the server restarts whenever a lessonlib file changes. A caller that imports only the
# one builder (hybrid, as notebook 15 does) trains too: without it there, each of its
# 8 ranks imported torch._dynamo for its first optimizer (5 s a launch on 2 cores).
BASE = ["torch", "torch.distributed", "torch.nn", "torch.nn.functional", "cloudpickle",
        "lessonlib.launcher"]
ROOMS = ["lessonlib.data_parallel.bench", "lessonlib.model_parallel",
         "lessonlib.tensor_parallel.layer_runs", "lessonlib.pipeline.schedule_runs",
         "lessonlib.hybrid"]
# torch.optim imports torch._dynamo when a process builds its first optimizer (about 2 s of
# CPU): preloaded for a caller that trains (it imported a room, or built an optimizer), so
# that its ranks do not each pay it on every launch; a bare launch does not wait for it.
TRAINING = ["torch._dynamo"]
_LESSONLIB = Path(lessonlib.__file__).resolve().parent
# The server this process started: its pid, the code it preloaded and the modules.
_server = {"pid": None, "fingerprint": None, "preload": frozenset()}
_caller: dict[str, Path | None] = {"folder": None}


def preload(every_room: bool = False) -> list[str]:
    """torch, and the rooms this caller has imported (with TRAINING, once it trains), or
    every room. A notebook or a test session imports its rooms before it launches them; a
    lab script, run once, pays only for its own."""
    rooms = [room for room in ROOMS if every_room or room in sys.modules]
    trains = rooms or any(module in sys.modules for module in TRAINING)
    return BASE + (TRAINING if trains else []) + rooms


def fingerprint() -> tuple:
    """Every lessonlib source file with its size and modification time (a cheap stat each)."""
    return tuple(sorted((str(p), s.st_size, s.st_mtime_ns)
                        for p in _LESSONLIB.rglob("*.py") for s in (p.stat(),)))


def context(warm: bool = True):
    """The multiprocessing context for the next launch, with a fresh-enough fork server."""
    if not warm or "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    forkserver.check()
    code = fingerprint()  # before a new server imports lessonlib: a later edit is seen next time
    modules = preload()
    with forkserver.lock():
        pid = forkserver.pid()
        ours = pid is not None and pid == _server["pid"]
        if ours and _server["fingerprint"] != code:
            forkserver.stop_unlocked()  # lessonlib changed on disk: its preloaded copy is stale
        elif ours and not set(modules) <= _server["preload"]:
            # The caller imported another room since (a notebook or a test session, which go
            # from room to room): the next server preloads every room, so none restarts it.
            forkserver.stop_unlocked()
            modules = preload(every_room=True)
        if pid is None or ours:
            # Not "__main__" (the default): the server must not import the kernel or script.
            forkserver.server().set_forkserver_preload(modules)
        _keep_the_server_socket_in_our_folder()
    forkserver.server().ensure_running()
    if forkserver.pid() != _server["pid"]:
        _server.update(pid=forkserver.pid(), fingerprint=code, preload=frozenset(modules))
    return multiprocessing.get_context("forkserver")


def caller_folder() -> Path:
    """This process's own folder, made once, locked for its life and removed at its exit."""
    if _caller["folder"] is None:
        _caller["folder"] = folders.new("server-", socket=True)
        multiprocessing.util.Finalize(None, folders.remove, args=(_caller["folder"],),
                                      exitpriority=-100)
    return _caller["folder"]


def _keep_the_server_socket_in_our_folder() -> None:
    """The server listens on a socket file in multiprocessing's temp folder (``pymp-*``),
    removed only when the caller exits normally. Put it in the caller's own folder instead,
    which the next launch (or the server as it ends) removes after a caller that was killed;
    ``folders`` makes that folder where a socket's path fits."""
    if forkserver.temp_folder() is not None:    # the caller's own multiprocessing chose one
        return
    folder = str(caller_folder())
    if len(folder) + len("/listener-12345678") >= 100:
        raise ValueError(
            f"the fork server's socket needs a temp folder path of at most "
            f"{folders.SOCKET_BASE_MAX} characters, but TMPDIR={tempfile.gettempdir()} has "
            f"{len(tempfile.gettempdir())} and none of {', '.join(folders.SHORT_TEMP_FOLDERS)} "
            f"is writable; set TMPDIR to a shorter folder, or launch with warm=False")
    forkserver.set_temp_folder(folder)


def is_a_caller() -> bool:
    """Not a rank that a launch forked or spawned, nor the fork server itself."""
    return multiprocessing.parent_process() is None and not forkserver.in_server()


def keep_the_compile_cache_in_our_folder() -> None:
    """torch._dynamo, once imported, makes ``torchinductor_<user>`` in the temp folder for
    its compile cache; unless the user chose a place, it goes into the caller's own folder
    (the fork server and the ranks take the caller's environment)."""
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ and "torch._dynamo" not in sys.modules:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(caller_folder() / "torch-compile-cache")


def stop_server() -> None:
    """Stop the fork server this process started (the next warm launch starts a new one)."""
    with forkserver.lock():
        if forkserver.pid() is not None and forkserver.pid() == _server["pid"]:
            forkserver.stop_unlocked()
    _server.update(pid=None, fingerprint=None)


def server_pid() -> int | None:
    """The fork server's process id, while one started by this process runs."""
    pid = forkserver.pid()
    return pid if pid is not None and pid == _server["pid"] else None
