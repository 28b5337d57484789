"""The launcher: results in rank order, clear errors, no leftover processes, no collisions."""
import inspect
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
import torch

import lessonlib
import rank_workers
from conftest import is_rank_process
from lessonlib.launcher import LaunchTimeout, RankError

WORKERS = os.path.relpath(rank_workers.__file__)   # as a timeout names it, from here

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.timeout(120)


def test_four_ranks_all_reduce_in_rank_order(no_children_left):
    out = lessonlib.launch(rank_workers.rank_and_sum, 4)
    assert [r["rank"] for r in out] == [0, 1, 2, 3]
    assert all(r["world"] == 4 and r["sum"] == 10.0 for r in out)
    assert len({r["pid"] for r in out}) == 4


def test_tensors_and_state_dicts_come_back_by_value(no_children_left):
    out = lessonlib.launch(rank_workers.state_dict_and_tensor, 2)
    assert torch.equal(out[1]["state"]["weight"], torch.ones(2, 3))
    assert torch.equal(out[1]["t"], torch.arange(4))


def test_failing_rank_is_named_with_its_traceback_and_nothing_is_left(no_children_left):
    with pytest.raises(RankError) as info:
        lessonlib.launch(rank_workers.fail_on, 3, 1, timeout=60)
    assert info.value.rank == 1
    message = str(info.value)
    assert "rank 1 of 3" in message
    assert "boom on purpose in rank 1" in message and "fail_on" in message  # its traceback
    assert lessonlib.launch(rank_workers.rank_and_sum, 2)[0]["sum"] == 3.0  # launching again works


def test_hang_ends_at_timeout_with_each_ranks_last_step_and_line(no_children_left):
    """Rank 1 never joins; rank 0 waits in comm's all-reduce (its breadcrumb says so), rank 2
    in torch.distributed's own (no breadcrumb): each rank's stack names its line."""
    start = time.monotonic()
    with pytest.raises(LaunchTimeout) as info:
        lessonlib.launch(rank_workers.skip_collective_on, 3, 1, 2, timeout=8)
    assert time.monotonic() - start < 30
    steps = info.value.last_steps
    assert "all_reduce" in steps[0]
    assert "deliberately skipping the all-reduce" in steps[1]
    assert "'started'" in steps[2]
    fn, where = rank_workers.skip_collective_on, f"{WORKERS}:{{}} in skip_collective_on"
    waiting_in_comm = where.format(_line(fn, "comm.all_reduce("))   # comm: a pass-through
    sleeping = where.format(_line(fn, "time.sleep("))
    waiting_in_torch = where.format(_line(fn, "dist.all_reduce("))
    assert info.value.lines[0].startswith(f"{waiting_in_comm} (waiting in all_reduce, ")
    assert info.value.lines[1] == sleeping
    assert info.value.lines[2].startswith(f"{waiting_in_torch} (waiting in all_reduce, ")
    for rank, line in info.value.lines.items():
        assert f"rank {rank}: " in str(info.value) and f"; at {line}\n" in str(info.value)


def _line(fn, text: str) -> int:
    """The line of ``fn``'s source holding ``text``."""
    source, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(source) if text in line)


@pytest.mark.parametrize("bad", [0, -2, 2.5, "2", True, None])
def test_bad_world_size_is_rejected_before_any_process_starts(bad, no_children_left):
    with pytest.raises(ValueError, match="world_size=.* must be a positive integer"):
        lessonlib.launch(rank_workers.rank_and_sum, bad)


def test_bad_backend_and_timeout_are_rejected():
    with pytest.raises(ValueError, match="backend='mpi'"):
        lessonlib.launch(rank_workers.rank_and_sum, 2, backend="mpi")
    for timeout in (0, 1e13, 1e300, float("nan")):      # gloo refuses 1e13, timedelta 1e300
        with pytest.raises(ValueError, match="timeout=.* must be a finite positive number"):
            lessonlib.launch(rank_workers.rank_and_sum, 2, timeout=timeout)


def test_function_defined_in_an_interactive_main_runs_with_its_globals(no_children_left):
    """A notebook cell's function (in an interactive ``__main__``, no ``__file__``) travels by
    value with the globals it uses."""
    cell = {"__name__": "__main__", "OFFSET": 100}
    exec("import torch.distributed as dist\n"
         "def from_a_cell(x):\n"
         "    return dist.get_rank() + x + OFFSET\n", cell)
    assert lessonlib.launch(cell["from_a_cell"], 2, 5) == [105, 106]


def test_lambdas_and_nested_functions_run_by_value(no_children_left):
    scale = 3

    def nested():
        return scale * 2

    assert lessonlib.launch(nested, 2) == [6, 6]
    assert lessonlib.launch(lambda x: x + 1, 2, 1) == [2, 2]


def test_two_launches_at_the_same_time_do_not_collide():
    script = textwrap.dedent("""
        import sys; sys.path.insert(0, %r)
        import lessonlib, rank_workers
        if __name__ == "__main__":
            for _ in range(2):
                assert lessonlib.launch(rank_workers.rank_and_sum, 2)[1]["sum"] == 3.0
            print("ok")
    """ % str(ROOT / "tests"))
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=100) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert all(out.strip() == "ok" for out, _ in outs)


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL], ids=["interrupt", "kill"])
def test_stopping_the_caller_leaves_no_rank_behind(how):
    """SIGINT is what "interrupt the kernel" sends; SIGKILL is a kernel restart or crash.

    The caller turns SIGINT into KeyboardInterrupt itself, as a Jupyter kernel does: a
    process started in the background by a shell without job control inherits SIGINT
    ignored, and the test must not depend on how the suite was started."""
    script = textwrap.dedent("""
        import signal, sys; sys.path.insert(0, %r)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        import lessonlib, rank_workers
        if __name__ == "__main__":
            lessonlib.launch(rank_workers.sleep_forever, 2, timeout=300)
    """ % str(ROOT / "tests"))
    caller = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        ranks = []
        while time.monotonic() < deadline and len(ranks) < 2:
            time.sleep(0.5)
            family = psutil.Process(caller.pid).children(recursive=True)
            ranks = [p for p in family if is_rank_process(p)]
        assert len(ranks) == 2
        ranks += [p for p in family if not is_rank_process(p)]  # its fork server too
        time.sleep(2)  # let them reach the sleep
        caller.send_signal(how)
        _, err = caller.communicate(timeout=30)
        assert how == signal.SIGKILL or "KeyboardInterrupt" in err
        gone, alive = psutil.wait_procs(ranks, timeout=10)
        assert not alive, f"processes outlived the interrupted caller: {[p.pid for p in alive]}"
    finally:  # a failure here must not leave processes for the next tests to find
        if caller.poll() is None:
            caller.kill()
            caller.wait()


def test_rank_output_goes_to_logs_not_the_caller(capfd):
    lessonlib.launch(rank_workers.rank_and_sum, 2)
    out, err = capfd.readouterr()
    assert out == ""


def test_worker_code_reads_rank_from_the_process_group_under_torchrun(tmp_path):
    """The labs' entry point, run for real under torchrun with 2 CPU ranks. The results are
    gathered to rank 0 only: the other rank leaves inside ``run``. Rank 0 then leaves as
    every lab does (``labkit.emit``): flushed, with ``os._exit``, since Python's teardown
    after ``destroy_process_group`` can abort a rank on a loaded machine (exit -6,
    "terminate called without an active exception", seen once in a full-suite run). No rank
    leaves a folder in the temp folder: a torchrun rank makes none."""
    script = tmp_path / "entry.py"
    script.write_text(textwrap.dedent("""
        import os, pathlib, sys; sys.path.insert(0, %r)
        import lessonlib, rank_workers
        if __name__ == "__main__":
            out = lessonlib.run(rank_workers.rank_and_sum, 99)
            pathlib.Path(%r, "after_run_" + os.environ["RANK"]).write_text(repr(out))
            if lessonlib.launcher.is_main_process():
                print("sums", [r["sum"] for r in out], "world", out[0]["world"], flush=True)
            os._exit(0)
    """ % (str(ROOT / "tests"), str(tmp_path))))
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc-per-node", "2", str(script)]
    temp = tmp_path / "temp"
    temp.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}  # as a user's
    env.update(OMP_NUM_THREADS="1", TMPDIR=str(temp))
    done = subprocess.run(torchrun, capture_output=True, text=True, timeout=100, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "sums [3.0, 3.0] world 2" in done.stdout
    assert sorted(p.name for p in tmp_path.glob("after_run_*")) == ["after_run_0"]
    assert [p.name for p in temp.glob("lessonlib-*")] == []
