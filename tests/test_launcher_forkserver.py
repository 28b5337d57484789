"""The fork server's private details, in one module (``lessonlib.launcher.forkserver``): they
exist on this Python (and on every other one found), and their absence fails a launch at once
with a sentence, not with a hang in a rank."""
import shutil
import subprocess
import sys
import textwrap
import types

import pytest

import lessonlib
from lessonlib.launcher import forkserver

pytestmark = pytest.mark.timeout(60)

ROUND_TRIP = textwrap.dedent("""
    import importlib.util, multiprocessing, os, sys
    spec = importlib.util.spec_from_file_location("fs", sys.argv[1])
    fs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fs)
    if __name__ == "__main__":
        fs.check()
        fs.server().set_forkserver_preload([])
        fs.server().ensure_running()
        assert fs.pid() is not None
        p = multiprocessing.get_context("forkserver").Process(target=os.getpid)
        p.start(); p.join()
        with fs.lock():
            fs.stop_unlocked()
        assert p.exitcode == 0 and fs.pid() is None
        print("ok", ".".join(map(str, sys.version_info[:2])))
""")


def test_the_private_details_exist_on_this_python_and_it_was_checked():
    forkserver.check()
    assert f"{sys.version_info.major}.{sys.version_info.minor}" in forkserver.CHECKED_ON, (
        "a Python that lessonlib.launcher.forkserver was not checked on: run this file's "
        "tests, read multiprocessing/forkserver.py, and add the version to CHECKED_ON")


def test_a_missing_private_detail_stops_a_warm_launch_at_once(monkeypatch):
    changed = types.SimpleNamespace(_lock=None, _forkserver_pid=None, ensure_running=None)
    monkeypatch.setattr(forkserver, "server", lambda: changed)
    with pytest.raises(RuntimeError, match=r"no longer has _forkserver_alive_fd, .*"
                                           r"_stop_unlocked.*warm=False"):
        lessonlib.launch(lessonlib.launcher.demo_rank_sum, 2)


@pytest.mark.parametrize("minor", sorted({10, 11, 12, 13, sys.version_info.minor}))
def test_the_round_trip_works_on_every_python_found(tmp_path, minor):
    """Start, fork one child from and stop the server through the module alone (it imports
    only the standard library), on each CPython 3.x that runs here."""
    python = shutil.which(f"python3.{minor}") if minor != sys.version_info.minor else sys.executable
    if python is None or subprocess.run([python, "-c", "pass"], capture_output=True).returncode:
        pytest.skip(f"no working python3.{minor} on PATH")
    (tmp_path / "round_trip.py").write_text(ROUND_TRIP)
    done = subprocess.run([python, str(tmp_path / "round_trip.py"), forkserver.__file__],
                          capture_output=True, text=True, timeout=50, cwd=tmp_path)
    assert done.returncode == 0 and f"ok 3.{minor}" in done.stdout, done.stderr[-2000:]
