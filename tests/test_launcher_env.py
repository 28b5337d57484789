"""What the environment may say about a launch: only what torchrun (``TORCHELASTIC_RUN_ID``)
or srun (``SLURM_PROCID``), or ``LOCAL_RANK`` beside ``RANK`` and ``WORLD_SIZE``, sets makes
a lab a rank of someone else's launch. ``RANK`` and ``WORLD_SIZE`` left in a shell (with
``MASTER_ADDR`` and ``MASTER_PORT`` or not) start local ranks as usual. Under a launcher the
lab's ``--timeout`` holds (each rank's Python stack is printed when it passes) and rank 0's
store listens on loopback only when ``MASTER_ADDR`` is loopback; a variable torch could not
read is refused in one line."""
import itertools
import os
import socket
import subprocess
import time

import pytest
from labrun import ROOT, command, run, run_lab

from lessonlib import launcher
from lessonlib.instruments.breadcrumbs import PROGRESS_ENV
from lessonlib.launcher import checks

LEFT_IN_A_SHELL = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                   "MASTER_PORT": "29599"}
LAUNCHERS = ("TORCHELASTIC_RUN_ID", "LOCAL_RANK", "SLURM_PROCID", "TORCHELASTIC_USE_AGENT_STORE",
             PROGRESS_ENV)
TINY = ("--world-size", "2", "--size-mb", "0.01", "--budget-s", "0.01", "--steps", "1",
        "--algorithms", "ring")


@pytest.fixture
def clean_env(monkeypatch):
    for name in (*LEFT_IN_A_SHELL, *LAUNCHERS):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("names", [names for n in range(1, 5)
                                   for names in itertools.combinations(LEFT_IN_A_SHELL, n)])
def test_variables_left_in_a_shell_are_no_launcher(clean_env, names):
    for name in names:
        clean_env.setenv(name, LEFT_IN_A_SHELL[name])
    assert not launcher.under_torchrun()


@pytest.mark.parametrize("extra", [{"TORCHELASTIC_RUN_ID": "x"}, {"LOCAL_RANK": "0"},
                                   {"SLURM_PROCID": "0"}])
def test_what_torchrun_or_srun_sets_is_a_launcher(clean_env, extra):
    for name, value in (LEFT_IN_A_SHELL | extra).items():
        clean_env.setenv(name, value)
    assert launcher.under_torchrun()
    clean_env.setenv(PROGRESS_ENV, "/nowhere")       # one of launch's own ranks: never
    assert not launcher.under_torchrun()


@pytest.mark.timeout(90)
def test_rank_and_world_size_in_the_shell_run_a_normal_launch(clean_env, tmp_path):
    """``RANK=0 WORLD_SIZE=2 python labs/ddp.py --steps 1`` (with MASTER_ADDR and MASTER_PORT
    too) starts two local ranks and gives a result, as every lab does through ``labkit``;
    the all-reduce lab is the cheapest to run (a training lab's ranks import more)."""
    for name, value in (LEFT_IN_A_SHELL | {"MASTER_PORT": str(_free_port())}).items():
        clean_env.setenv(name, value)
    record = run_lab("allreduce", *TINY, "--timeout", "60", tmp_path=tmp_path)
    assert record["world_size"] == 2 and "ring" in record["results"]


def _listeners(port: int) -> list[str]:
    """The local addresses (hex, as /proc/net/tcp{,6} write them) listening on ``port``."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # LISTEN
                    found.append(local.rsplit(":", 1)[0])
    return found


@pytest.mark.timeout(60)
def test_a_rank_whose_peer_never_comes_ends_at_its_timeout_listening_on_loopback():
    """A launcher's rank 0 (LOCAL_RANK set) whose rank 1 never starts: it ends at --timeout 2
    with its Python stack, and meanwhile listens on 127.0.0.1 only."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in (*LEFT_IN_A_SHELL, *LAUNCHERS)}
    env |= LEFT_IN_A_SHELL | {"MASTER_PORT": str(port), "LOCAL_RANK": "0",
                              "OMP_NUM_THREADS": "1"}
    argv = command("allreduce", *TINY, "--timeout", "2")
    start = time.monotonic()
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    seen = []
    try:
        while proc.poll() is None and time.monotonic() - start < 40:
            seen += _listeners(port)
            time.sleep(0.05)
    finally:
        proc.kill()
        _, err = proc.communicate()
    elapsed = time.monotonic() - start
    assert elapsed < 35, f"still running after {elapsed:.0f} s with --timeout 2"
    assert proc.returncode not in (0, None), err[-2000:]
    assert "Timeout (0:00:02)!" in err and "labs/allreduce.py\", line" in err, err[-2000:]
    assert seen and set(seen) == {"0100007F"}, seen          # 127.0.0.1, nothing else


@pytest.mark.parametrize("env, message", [
    ({"TORCHELASTIC_RUN_ID": "x", "WORLD_SIZE": "2"}, "RANK is not set, though "
                                                      "TORCHELASTIC_RUN_ID is"),
    ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x' in the environment is not a whole number"),
    ({"RANK": "0", "WORLD_SIZE": "9" * 20}, "WORLD_SIZE='9{20}' in the environment is not a "
                                            "whole number below 2"),
    ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK must be in 0..WORLD_SIZE-1"),
    ({"RANK": "0", "WORLD_SIZE": "0"}, "RANK must be in 0..WORLD_SIZE-1"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "70000", "MASTER_ADDR": "h"},
     "MASTER_PORT=70000 in the environment is not a port"),
    ({"RANK": "1", "WORLD_SIZE": "2"}, "MASTER_ADDR is not set, and rank 1 of 2 needs it"),
])
def test_launcher_variables_torch_cannot_read_are_refused_in_one_line(env, message):
    with pytest.raises(ValueError, match=message) as caught:
        checks.check_launcher_env(env)
    assert "\n" not in str(caught.value)


def test_a_lab_under_torchrun_with_a_bad_rank_exits_in_one_line(clean_env):
    for name, value in {"TORCHELASTIC_RUN_ID": "x", "RANK": "-1", "WORLD_SIZE": "2"}.items():
        clean_env.setenv(name, value)
    done = run("ddp", "--steps", "1")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1].endswith(
        "RANK='-1' in the environment is not a whole number below 2^31; start the ranks with "
        "torchrun, or unset RANK to start local ranks")


def test_minimal_ddp_outside_torchrun_says_so_in_one_line(clean_env):
    for name, value in (LEFT_IN_A_SHELL | {"MASTER_PORT": str(_free_port())}).items():
        clean_env.setenv(name, value)
    done = run("minimal_ddp")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip() == ("labs/minimal_ddp.py runs under torchrun: "
                                   "torchrun --standalone --nproc-per-node 2 labs/minimal_ddp.py")
