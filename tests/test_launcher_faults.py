"""The launcher's promises under faults and misuse: what a student is told, what is left behind,
what listens on the network, and that ranks never run stale code. Tiny, 2 ranks, warm."""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import types
from pathlib import Path

import pytest
import torch

import lessonlib
import rank_workers
from lessonlib.launcher import RankError, folders, starter

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.timeout(120)


# ---------------------------------------------------------------- refused before any start
def test_what_cannot_travel_is_named_before_any_process_starts(tmp_path, no_children_left):
    handle = open(tmp_path / "notes.txt", "w")
    lock = threading.Lock()
    cell = {"__name__": "__main__", "handle": handle}
    exec("def writes_notes():\n    handle.write('hi')\n", cell)
    with pytest.raises(ValueError, match=r"the global 'handle' \(TextIOWrapper\).*open file"):
        lessonlib.launch(cell["writes_notes"], 2)
    with pytest.raises(ValueError, match=r"argument 1 \(lock\).*cannot be pickled"):
        lessonlib.launch(rank_workers.rank_and_sum, 2, lock)
    # A tensor in this process's accelerator memory (CPU tests use the meta device).
    with pytest.raises(ValueError, match=r"keyword argument x=.*tensor on meta.*\.cpu\(\)"):
        lessonlib.launch(rank_workers.rank_and_sum, 2, x=torch.ones(2, device="meta"))
    handle.close()


def test_the_pickling_traceback_of_what_cannot_travel_is_kept():
    """The one line names the culprit; its cause, chained, is the pickler's own error, whose
    traceback shows what failed to travel and where."""
    with pytest.raises(ValueError, match=r"argument 1 \(lock\)") as refused:
        lessonlib.launch(rank_workers.rank_and_sum, 2, threading.Lock())
    assert isinstance(refused.value.__cause__, TypeError)
    assert "_thread.lock" in str(refused.value.__cause__)
    assert not refused.value.__suppress_context__ or refused.value.__cause__ is not None


def test_nccl_without_a_gpu_says_no_gpu_is_visible():
    if torch.cuda.device_count():
        pytest.skip("a GPU is visible")
    with pytest.raises(ValueError, match=r"backend='nccl' needs GPUs, but no GPU is visible"):
        lessonlib.launch(rank_workers.rank_and_sum, 2, backend="nccl")


def test_a_world_beyond_the_machine_is_refused_unless_asked_for():
    with pytest.raises(ValueError, match=r"world_size=10000 .* more than 8 per core.*"
                                         r"oversubscribe=True"):
        lessonlib.launch(rank_workers.rank_and_sum, 10000)
    with pytest.raises(ValueError, match="timeout=-1 must be a finite positive"):  # no start
        lessonlib.launch(rank_workers.rank_and_sum, 10000, oversubscribe=True, timeout=-1)


def test_a_script_read_from_standard_input_is_told_so_before_any_process_starts(monkeypatch):
    """``python - <<EOF`` or ``python < script.py``: the ranks cannot re-import a script that
    has no file, and the guard they would otherwise be told to add is already there."""
    stdin_main = types.ModuleType("__main__")
    stdin_main.__file__ = "<stdin>"
    monkeypatch.setitem(sys.modules, "__main__", stdin_main)
    with pytest.raises(ValueError, match=r"script read from standard input.*save the script "
                                         r"to a file") as refused:
        lessonlib.launch(rank_workers.rank_and_sum, 2, timeout=20)
    assert "if __name__" not in str(refused.value)


# ---------------------------------------------------------------- ranks that die
@pytest.mark.parametrize("code, how", [(3, "exit code 3"), (-signal.SIGKILL, "SIGKILL")],
                         ids=["os._exit", "SIGKILL"])
def test_a_rank_killed_mid_run_is_reported_as_killed_not_as_a_startup_problem(
        code, how, no_children_left):
    with pytest.raises(RankError) as info:
        lessonlib.launch(rank_workers.exit_midway, 2, code, timeout=60)
    message = str(info.value)
    assert info.value.rank == 1
    assert "rank 1 of 2 ended mid-run" in message and how in message
    assert "if __name__" not in message and "while starting" not in message


def test_a_rank_that_never_starts_gets_the_main_guard_hint(tmp_path):
    """A script that launches without ``if __name__ == '__main__'``: each rank re-imports it
    and would launch again, so it dies while starting."""
    script = tmp_path / "unguarded.py"
    script.write_text(textwrap.dedent("""
        import sys; sys.path.insert(0, %r)
        import lessonlib, rank_workers
        try:
            lessonlib.launch(rank_workers.rank_and_sum, 2, timeout=60)
        except lessonlib.RankError as err:
            print("RANKERROR", err)
    """ % str(ROOT / "tests")))
    folder = Path(tempfile.mkdtemp(prefix="ug-"))  # short: socket paths must be short
    try:
        done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                              timeout=100, env=dict(os.environ, TMPDIR=str(folder)))
        assert "RANKERROR" in done.stdout, done.stderr[-2000:]
        assert "died while starting" in done.stdout and "if __name__ == '__main__'" in done.stdout
        deadline = time.monotonic() + 5     # each rank's own server ends with its rank
        while list(folder.iterdir()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert list(folder.iterdir()) == []   # no server folder per rank left behind
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# ---------------------------------------------------------------- nothing left behind
# torch's own cache folder (empty), made in the temp folder by importing torch._dynamo: what
# the first optimizer of any process does, and what the fork server preloads for its ranks.
TORCH_CACHE = "torchinductor_"


def test_nothing_is_left_in_the_temp_folder_and_dead_launches_are_swept():
    """Success, a raising rank, a killed rank and a timeout leave the temp folder as they
    found it (but for the fork server's socket while the caller lives); the folder of a
    caller killed mid-launch is removed by the next launch."""
    script = textwrap.dedent("""
        import os, signal, subprocess, sys, tempfile; sys.path.insert(0, %r)
        import lessonlib, rank_workers
        if __name__ == "__main__":
            dead = subprocess.Popen([sys.executable, "-c", "pass"]); dead.wait()
            os.mkdir(os.path.join(tempfile.gettempdir(), f"lessonlib-{dead.pid}-stale"))
            lessonlib.launch(rank_workers.rank_and_sum, 2)
            for fn, arg in ((rank_workers.fail_on, 1), (rank_workers.exit_midway, -9),
                            (rank_workers.skip_collective_on, 1)):
                try:
                    lessonlib.launch(fn, 2, arg, timeout=5)
                except (lessonlib.RankError, lessonlib.LaunchTimeout):
                    pass
            server = f"lessonlib-{os.getpid()}-server-"  # the live fork server's socket
            print("left:", [f for f in os.listdir(tempfile.gettempdir())
                            if not f.startswith((server, %r))])
    """ % (str(ROOT / "tests"), TORCH_CACHE))
    folder = Path(tempfile.mkdtemp(prefix="lt-"))  # short: socket paths must be short
    try:
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              timeout=110, env=dict(os.environ, TMPDIR=str(folder)))
        assert done.returncode == 0, done.stderr[-2000:]
        assert "left: []" in done.stdout
        assert [f for f in os.listdir(folder) if not f.startswith(TORCH_CACHE)] == []
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _open_for_writing(fifo: Path) -> None:
    """Lets a reader blocked on ``fifo`` go (an open for writing, never blocking itself)."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:                    # nobody is waiting on it
        pass


def test_a_lock_that_is_not_a_regular_file_is_refused_not_waited_on(tmp_path, monkeypatch):
    """Anyone who may write to a shared temp folder can make a FIFO named owner.lock in a
    folder named like a launch's: opening it to read would wait for a writer, and every
    later launch with it. The sweep leaves that folder alone, in one line, at once."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    trap = tmp_path / "lessonlib-1-x"
    trap.mkdir()
    os.mkfifo(trap / folders.LOCK)
    release = threading.Timer(3.0, _open_for_writing, [trap / folders.LOCK])  # if it waits
    release.start()
    start = time.monotonic()
    try:
        with pytest.warns(UserWarning, match=r"lessonlib-1-x/owner.lock is not a regular file"):
            folders.sweep()
    finally:
        release.cancel()
    assert time.monotonic() - start < 2.0 and trap.exists()


def _planted(base: Path) -> Path:
    """A stale launch's folder (its pid is no live process, no lock) with a few files."""
    folder = base / "lessonlib-999999999-planted"
    (folder / "deep").mkdir(parents=True)
    for i in range(3):
        (folder / "deep" / str(i)).write_text("x")
    return folder


def test_a_folder_another_user_owns_is_never_walked(tmp_path, monkeypatch):
    """On a shared /tmp another user may plant a stale-looking folder: not ours to delete,
    and not walked (a planted folder of 100k files made every launch 17 times slower)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    planted = _planted(tmp_path)
    me = os.geteuid()
    monkeypatch.setattr(os, "geteuid", lambda: me + 1)     # every folder here: someone else's
    walked = []
    monkeypatch.setattr(shutil, "rmtree", lambda path, **kw: walked.append(path))
    folders.sweep()
    assert walked == [] and (planted / "deep" / "0").exists()


def test_a_folder_a_sweep_could_not_delete_is_not_walked_again(tmp_path, monkeypatch):
    """What a sweep failed to delete (its files are not ours, say) it remembers, so the next
    launches do not walk it again; a new folder of the same name is looked at afresh."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    planted = _planted(tmp_path)
    walked = []
    monkeypatch.setattr(shutil, "rmtree", lambda path, **kw: walked.append(path))   # it fails
    for _ in range(3):
        folders.sweep()
    assert walked == [planted]
    monkeypatch.undo()
    shutil.rmtree(planted)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    _planted(tmp_path)
    folders.sweep()
    assert not planted.exists()


def test_a_socket_folder_goes_where_its_path_fits_and_is_swept_there(tmp_path, monkeypatch):
    """A temp folder too long for the fork server's socket (macOS's own is about 48
    characters): the caller's folder, which holds it, goes to a short system temp folder,
    and the sweeps look there too once its owner is gone."""
    deep = tmp_path / ("d" * 60)
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    base = folders.socket_base()
    if base is None:
        pytest.skip(f"none of {folders.SHORT_TEMP_FOLDERS} is writable here")
    folder = folders.new("server-", socket=True)
    assert folder.parent == Path(base) and len(str(folder / "listener-12345678")) < 100
    os.close(folders._held.pop(str(folder)))    # its owner is gone: the lock is let go
    folders.sweep()
    assert not folder.exists()


# ---------------------------------------------------------------- no open door
def test_nothing_listens_beyond_this_machine_during_a_launch(no_children_left):
    out = lessonlib.launch(rank_workers.listening_sockets, 2, os.getpid())
    addresses = {ip for r in out for ips in r.values() for ip in ips}
    assert addresses <= {"127.0.0.1", "::1"}, addresses
    assert out[0]["caller"] == []  # the ranks meet through a file: the caller listens on nothing


# ---------------------------------------------------------------- never stale
def test_an_edited_worker_module_runs_its_new_code(tmp_path, monkeypatch, no_children_left):
    monkeypatch.syspath_prepend(str(tmp_path))
    module = tmp_path / "edited_worker.py"
    module.write_text("VALUE = 'old'\n")
    assert lessonlib.launch(rank_workers.value_of_module, 2, "edited_worker") == ["old", "old"]
    module.write_text("VALUE = 'new, and longer'\n")
    new = lessonlib.launch(rank_workers.value_of_module, 2, "edited_worker")
    assert new == ["new, and longer"] * 2


def test_a_change_to_lessonlib_restarts_the_server(monkeypatch, no_children_left):
    lessonlib.launch(rank_workers.rank_and_sum, 2)
    first = starter.server_pid()
    assert first is not None
    changed = starter.fingerprint() + (("edited.py", 1, 1),)
    monkeypatch.setattr(starter, "fingerprint", lambda: changed)  # as if a file had changed
    lessonlib.launch(rank_workers.rank_and_sum, 2)
    assert starter.server_pid() not in (None, first)


def test_the_server_preloads_the_rooms_the_caller_imported(monkeypatch, no_children_left):
    """A script pays only for the rooms it imported; importing another restarts the server
    once, with every room preloaded, so that it never restarts for a room again."""
    lessonlib.launch(rank_workers.rank_and_sum, 2)
    rooms = {room for room in starter.ROOMS if room in sys.modules}
    assert set(starter.preload()) == set(starter.BASE) | rooms | (
        set(starter.TRAINING) if rooms or "torch._dynamo" in sys.modules else set())
    first = starter.server_pid()
    lessonlib.launch(rank_workers.rank_and_sum, 2)
    assert starter.server_pid() == first                    # nothing new: the same server
    monkeypatch.setattr(starter, "ROOMS", starter.ROOMS + ["lessonlib.instruments.breadcrumbs"])  # one more
    lessonlib.launch(rank_workers.rank_and_sum, 2)
    second = starter.server_pid()
    assert second not in (None, first)
    assert set(starter.ROOMS) <= starter._server["preload"]    # every room, imported or not
    lessonlib.launch(rank_workers.rank_and_sum, 2)
    assert starter.server_pid() == second


def test_a_caller_that_trains_preloads_what_its_ranks_optimizers_import(monkeypatch):
    monkeypatch.setattr(starter, "ROOMS", ["a.room.nobody.imported"])
    monkeypatch.delitem(sys.modules, "torch._dynamo", raising=False)
    assert starter.preload() == starter.BASE                # a bare launch waits for no more
    monkeypatch.setattr(starter, "ROOMS", ["lessonlib.launcher"])   # a room it imported
    assert starter.preload() == starter.BASE + starter.TRAINING + ["lessonlib.launcher"]


def test_cold_launches_still_work(no_children_left):
    out = lessonlib.launch(rank_workers.rank_and_sum, 2, warm=False)
    assert [r["sum"] for r in out] == [3.0, 3.0]
