"""Warm starts: ranks forked from a server that imported torch once, never running stale code.

What it teaches: starting a rank costs an interpreter plus ``import torch`` (seconds), while
the work of a small lesson costs milliseconds. Python's ``forkserver`` start method keeps one
small server process per caller; ``set_forkserver_preload`` makes it import torch once, and
each rank is then a ``fork`` of that server (a tenth of a second). The server never imports
the worker's own module, so each rank imports it fresh from disk; when a file of lessonlib
itself changes (an author editing it), the server is restarted before the next launch. It
preloads the lessons' rooms the caller has imported (a lab script pays for its own only),
with torch._dynamo once the caller trains (torch.optim's first optimizer imports it), and
restarts once when the caller imports another. The server ends with its caller. Where
there is no forkserver (Windows), ranks are spawned.

Each launch also gets a private folder ``lessonlib-<caller pid>-*`` in the temp folder (logs,
results, the rendezvous file); it is removed when the launch ends, and folders left by a
caller that was killed are removed by the next launch.

Laptop:  ``python labs/launch_overhead.py --repeats 5``  (cold and warm launches)
GPU box: the same.
"""
from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import multiprocessing.util
import os
import shutil
import sys
import tempfile
from pathlib import Path

import lessonlib

# What every rank would otherwise import again: torch, and the lessons' own rooms (their
# imports pull in DTensor and torch's pipelining too, about 2 s together). Safe to preload:
# the server restarts whenever a lessonlib file changes.
BASE = ["torch", "torch.distributed", "torch.nn", "torch.nn.functional", "cloudpickle",
        "lessonlib.launcher"]
ROOMS = ["lessonlib.data_parallel.bench", "lessonlib.model_parallel",
         "lessonlib.tensor_parallel.runs", "lessonlib.pipeline.runs", "lessonlib.hybrid"]
# torch.optim imports torch._dynamo when a process builds its first optimizer (about 2 s of
# CPU): preloaded for a caller that trains (it imported a room, or built an optimizer), so
# that its ranks do not each pay it on every launch; a bare launch does not wait for it.
TRAINING = ["torch._dynamo"]
_LESSONLIB = Path(lessonlib.__file__).resolve().parent
# The server this process started: its pid, the code it preloaded and the modules.
_server = {"pid": None, "fingerprint": None, "preload": frozenset()}


def preload() -> list[str]:
    """torch, and the rooms this caller has imported (with TRAINING, once it trains). A
    notebook or a test session imports its rooms before it launches them; a lab script, run
    once, pays only for its own."""
    rooms = [room for room in ROOMS if room in sys.modules]
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
    server = multiprocessing.forkserver._forkserver
    code = fingerprint()  # before a new server imports lessonlib: a later edit is seen next time
    modules = preload()
    with server._lock:
        pid = server._forkserver_pid
        ours = pid is not None and pid == _server["pid"]
        if ours and _server["fingerprint"] != code:
            server._stop_unlocked()  # lessonlib changed on disk: its preloaded copy is stale
        elif ours and not set(modules) <= _server["preload"]:
            server._stop_unlocked()  # the caller imported another room since: preload it too
        if pid is None or ours:
            # Not "__main__" (the default): the server must not import the kernel or script.
            server.set_forkserver_preload(modules)
        _keep_the_server_socket_in_our_folder()
    server.ensure_running()
    if server._forkserver_pid != _server["pid"]:
        _server.update(pid=server._forkserver_pid, fingerprint=code, preload=frozenset(modules))
    return multiprocessing.get_context("forkserver")


def _keep_the_server_socket_in_our_folder() -> None:
    """The server listens on a socket file in multiprocessing's temp folder (``pymp-*``),
    removed when the caller exits normally. Name it like a launch folder instead, so that
    the next launch sweeps it away after a caller that was killed."""
    config = multiprocessing.process.current_process()._config
    prefix = os.path.join(tempfile.gettempdir(), f"lessonlib-{os.getpid()}-server-")
    # A socket's path must fit in about 100 bytes; a deep temp folder keeps the default.
    if config.get("tempdir") is None and len(prefix) + len("12345678/listener-12345678") < 100:
        folder = tempfile.mkdtemp(prefix=os.path.basename(prefix))
        multiprocessing.util.Finalize(None, shutil.rmtree, args=(folder, True), exitpriority=-100)
        config["tempdir"] = folder


def stop_server() -> None:
    """Stop the fork server this process started (the next warm launch starts a new one)."""
    server = multiprocessing.forkserver._forkserver
    with server._lock:
        if server._forkserver_pid is not None and server._forkserver_pid == _server["pid"]:
            server._stop_unlocked()
    _server.update(pid=None, fingerprint=None)


def server_pid() -> int | None:
    """The fork server's process id, while one started by this process runs."""
    pid = multiprocessing.forkserver._forkserver._forkserver_pid
    return pid if pid is not None and pid == _server["pid"] else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def sweep_stale_folders() -> None:
    """Remove the folders of launches whose caller is gone (killed before it could clean)."""
    for folder in Path(tempfile.gettempdir()).glob("lessonlib-*-*"):
        pid = folder.name.split("-")[1]
        if pid.isdigit() and folder.is_dir() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def new_folder() -> Path:
    sweep_stale_folders()
    return Path(tempfile.mkdtemp(prefix=f"lessonlib-{os.getpid()}-"))
