"""Nothing outlives a launch and no launch kills another: a rank's children end with it
(also at a timeout), results travel back by value, a launch in another PID namespace over the
same temp folder leaves a live launch alone, and a killed caller leaves no process and no
folder behind."""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from contextlib import nullcontext
from pathlib import Path

import psutil
import pytest

import lessonlib
import lifetime_workers
from lessonlib.launcher import LaunchTimeout, RankError, folders

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.timeout(120)


def _all_gone(pids, within_s=5.0) -> list[int]:
    """The pids still running after ``within_s`` (a zombie has ended: only init's reaping of
    an orphan is left, which in a container can take a second or two)."""
    deadline = time.monotonic() + within_s
    while True:
        alive = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.02)


def test_what_a_rank_starts_ends_with_the_launch(tmp_path, no_children_left):
    pids = lessonlib.launch(lifetime_workers.start_children, 2, str(tmp_path / "pids"))
    assert not _all_gone([pid for rank in pids for pid in rank])


def test_what_a_rank_starts_ends_at_the_timeout(tmp_path, no_children_left):
    with pytest.raises(LaunchTimeout):
        lessonlib.launch(lifetime_workers.start_children, 2, str(tmp_path / "pids"), True,
                         timeout=4)
    pids = [int(pid) for f in tmp_path.glob("pids.*") for pid in f.read_text().split()]
    assert len(pids) == 4 and not _all_gone(pids)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="child subreapers are Linux's")
@pytest.mark.parametrize("then", ["return", "exit", "hang"])
def test_what_a_rank_starts_in_another_session_or_group_ends_with_the_launch(
        tmp_path, then, no_children_left):
    """``start_new_session=True``, ``process_group=0`` and a daemon's orphaned grandchild
    leave the rank's process group. The rank returns (it ends them), dies (the fork server
    adopted them, the launch ends them) or hangs (the launch ends them, then it)."""
    ends = nullcontext() if then == "return" else pytest.raises((RankError, LaunchTimeout))
    with ends:
        lessonlib.launch(lifetime_workers.start_escapees, 2, str(tmp_path / "pids"), then,
                         timeout=3)
    pids = [int(pid) for f in tmp_path.glob("pids.*") for pid in f.read_text().split()]
    assert len(pids) == 6 and not _all_gone(pids)


def test_results_travel_back_by_value(no_children_left):
    cell = {"__name__": "__main__"}
    exec("import dataclasses\nimport torch.distributed as dist\n"
         "@dataclasses.dataclass\nclass Point:\n    x: int\n    y: float\n"
         "def make():\n    return Point(dist.get_rank(), 0.5)\n", cell)
    assert lessonlib.launch(cell["make"], 2) == [cell["Point"](0, 0.5), cell["Point"](1, 0.5)]


def test_a_rank_that_closed_its_stdout_still_returns(no_children_left):
    assert lessonlib.launch(lifetime_workers.close_stdout_and_return, 2, 7) == [7, 7]


def test_a_result_that_cannot_travel_is_blamed_not_the_oom_killer(no_children_left):
    with pytest.raises(RankError, match="raised an exception") as failed:
        lessonlib.launch(lifetime_workers.return_a_lock, 2)
    assert "lock" in str(failed.value) and "out-of-memory" not in str(failed.value)
    assert "raised the same error on their own" in str(failed.value)


def test_an_open_file_is_refused_not_sent_as_a_copy(tmp_path):
    (tmp_path / "data.txt").write_text("abc")
    with open(tmp_path / "data.txt") as f, pytest.raises(ValueError, match="open file"):
        lessonlib.launch(lifetime_workers.close_stdout_and_return, 2, f)


def _unshare_works() -> str | None:
    if shutil.which("unshare") is None:
        return "no unshare command here"
    done = subprocess.run(["unshare", "-p", "-f", "--mount-proc", "true"], capture_output=True,
                          text=True)
    return None if done.returncode == 0 else f"unshare -p is not permitted: {done.stderr.strip()}"


@pytest.mark.timeout(150)
def test_a_launch_in_another_pid_namespace_leaves_a_live_launch_alone(tmp_path, monkeypatch):
    """The other launch cannot see this process's pid; it must still see that the launch
    folder is held. Both use a temp folder of their own, shared by the two."""
    reason = _unshare_works()
    if reason:
        pytest.skip(reason)
    shared = Path(tempfile.mkdtemp(prefix="ns-"))
    go = tmp_path / "go"
    monkeypatch.setattr(tempfile, "tempdir", str(shared))
    outcome = {}

    def host_launch():
        try:
            outcome["ranks"] = lessonlib.launch(lifetime_workers.wait_for, 2, str(go), timeout=100)
        except Exception as exc:  # noqa: BLE001  (reported by the assertion below)
            outcome["error"] = exc

    host = threading.Thread(target=host_launch)
    host.start()
    try:
        deadline = time.monotonic() + 60
        while not list(shared.glob("lessonlib-*/rank1.log")) and time.monotonic() < deadline:
            time.sleep(0.1)
        script = ("import lessonlib; print(lessonlib.launch(lessonlib.launcher.demo_rank_sum, "
                  "2)[1].sum)")
        other = subprocess.run(["unshare", "-p", "-f", "--mount-proc", sys.executable, "-c",
                                script], capture_output=True, text=True, timeout=100,
                               env=dict(os.environ, TMPDIR=str(shared), PYTHONPATH=str(ROOT)))
        assert other.returncode == 0 and other.stdout.strip() == "1.0", other.stderr[-2000:]
    finally:
        go.write_text("")
        host.join(100)
        shutil.rmtree(shared, ignore_errors=True)
    assert outcome == {"ranks": [0, 1]}, outcome


@pytest.mark.timeout(150)
@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "kill-9"])
def test_a_killed_caller_leaves_no_process_and_no_folder(tmp_path, how):
    """The ranks and their children (in other sessions and groups too) end, the fork server
    ends at once (not after torch's teardown), and the temp folder is left as it was found.
    Under kill -9 the temp folder is too long for the server's socket (as macOS's is): its
    folder goes to a short system temp folder, removed as well, never to multiprocessing's
    pymp-* that nothing removes."""
    long = "x" * 60 if how == signal.SIGKILL else ""
    folder = Path(tempfile.mkdtemp(prefix=f"kc-{long}"))
    script = textwrap.dedent("""
        import sys; sys.path.insert(0, %r)
        from lessonlib import launcher  # noqa: F401  (first, as the labs import it)
        import lessonlib, lifetime_workers
        if __name__ == "__main__":
            import torch._dynamo  # as a lab that trains: torch's compile cache is made now
            lessonlib.launch(lifetime_workers.start_escapees, 2, %r, "hang", timeout=300)
    """ % (str(ROOT / "tests"), str(tmp_path / "pids")))
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    caller = subprocess.Popen([sys.executable, "-c", script], env=dict(env, TMPDIR=str(folder)),
                              stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while len(list(tmp_path.glob("pids.*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        family = psutil.Process(caller.pid).children(recursive=False)
        server = [p for p in family if "multiprocessing.forkserver" in " ".join(p.cmdline())]
        family = psutil.Process(caller.pid).children(recursive=True)
        children = [int(p) for f in tmp_path.glob("pids.*") for p in f.read_text().split()]
        caller.send_signal(how)
        caller.wait(30)
        ended = time.monotonic()
        assert len(server) == 1 and not _all_gone([server[0].pid], within_s=10)
        assert time.monotonic() - ended < 1.0, "the fork server outlived its caller"
        assert not _all_gone([p.pid for p in family] + children, within_s=10)
        deadline = time.monotonic() + 5
        while list(folder.iterdir()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert list(folder.iterdir()) == []
        assert [f for base in folders.SHORT_TEMP_FOLDERS
                for f in Path(base).glob(f"lessonlib-{caller.pid}-*")] == []
    finally:
        if caller.poll() is None:
            caller.kill()
            caller.wait()
        shutil.rmtree(folder, ignore_errors=True)
