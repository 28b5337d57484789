"""Fuzzed, not just probed: the cost model (``estimate`` and its command line), the pipeline
schedule functions, every lab's command line (the sweep's too) and ``launch``'s settings,
driven by Hypothesis with arbitrary settings (zero, negatives, huge integers, NaN and
infinities, strings, None, wrong types).

The labs run under any environment a launcher or a shell may leave (``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT``, torchrun's and SLURM's variables, each set to anything).

The property: every call either returns finite numbers or raises one ValueError (or, on the
command line, exits with status 2) whose message is one line naming a setting. Never NaN,
never another exception from deep inside. Deterministic (``derandomize``, no example
database) and a few seconds long, so CI never flakes.
"""
import contextlib
import datetime
import io
import json
import math
import operator
import re
import sys
import tempfile
from pathlib import Path

import labrun
import lifetime_workers
import numpy
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from lessonlib import launcher
from lessonlib.instruments.breadcrumbs import PROGRESS_ENV
from lessonlib.launcher import starter
from lessonlib.costmodel import GPT, Layout, estimate, make_cluster
from lessonlib.costmodel.__main__ import main
from lessonlib.pipeline import schedules
from lessonlib.pipeline.validate import simulate

sys.path.append(str(labrun.LABS))   # after site-packages: labs/ holds scripts, not a package
import sweep_points  # noqa: E402  (the sweep's module, whose lab_flags the fuzz stubs)


def fuzz(examples):
    """Hypothesis settings: deterministic, no example database, ``examples`` calls."""
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])


SMALL = st.integers(min_value=-3, max_value=130)
# Settings no function should take: not positive, far too large, or not an integer at all.
BAD = st.one_of(st.integers(max_value=0), st.integers(min_value=10**7), st.floats(),
                st.none(), st.booleans(), st.text(max_size=2), st.just([1]))
WILD = st.one_of(SMALL, BAD)
OFTEN_VALID = st.one_of(st.integers(min_value=1, max_value=64), WILD)

# Every name a message may use for a setting (Python keyword or command-line flag).
SETTINGS = ("layers", "hidden", "heads", "seq", "vocab", "t=", "p=", "d=", "b=", "m=", "v=",
            "global_batch", "global-batch", "microbatch", "recompute", "schedule",
            "zero_stage", "zero=", "gpu", "gpus", "gpus_per_node", "gpus-per-node",
            "network_gbit", "network-gbit", "network_ports", "network-ports", "collectives",
            "model", "layout", "cluster", "forward", "backward", "latency", "send",
            "argument --", "give m")


def _assert_clear(message):
    event("refused with a clear error")  # --hypothesis-show-statistics counts both outcomes
    assert message and "\n" not in message.strip(), message
    assert any(name in message for name in SETTINGS), message


def _numbers(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from _numbers(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _numbers(v)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield value


# --- estimate ------------------------------------------------------------------------------

# Settings that can describe a run (some combinations still cannot, e.g. t not dividing a).
VALID = {
    "L": st.integers(1, 64), "a": st.sampled_from([1, 4, 8, 12, 16]),
    "k": st.integers(1, 64),  # h = a*k
    "s": st.integers(1, 4096), "V": st.integers(1, 60000),
    "t": st.sampled_from([1, 1, 2, 4, 8, 16, 3]), "p": st.integers(1, 16),
    "d": st.integers(1, 64), "b": st.integers(1, 8), "m": st.integers(1, 64),
    "v": st.sampled_from([1, 1, 2, 3]), "zero_stage": st.integers(0, 3),
    "recompute": st.sampled_from(["none", "selective", "full"]),
    "schedule": st.sampled_from(["1f1b", "gpipe"]),
    "gpu": st.sampled_from(["A100", "H100-SXM5", "h200", "V100"]),
    "gpus_per_node": st.sampled_from([1, 2, 4, 8, 16, 72]),
    "network": st.one_of(st.none(), st.floats(1, 1600)),
    "ports": st.one_of(st.none(), st.integers(1, 16)),
    "collectives": st.sampled_from(["multi-ring", "flat-ring"]),
}
# What may replace one of them: wrong in value or in type.
WRONG = {**{k: WILD for k in VALID}, "recompute": st.sampled_from(["some", 3, None]),
         "schedule": st.sampled_from(["zb", None, 1]), "gpu": st.sampled_from(["TPU", 7]),
         "network": st.one_of(st.floats(), SMALL, st.text(max_size=2)),
         "collectives": st.sampled_from(["tree", None])}


@st.composite
def one_knob_wrong(draw, valid, wrong):
    """A valid setting for every knob, and in about half the draws one knob made wrong."""
    chosen = {k: draw(strategy) for k, strategy in valid.items()}
    if draw(st.booleans()):
        knob = draw(st.sampled_from(sorted(wrong)))
        chosen[knob] = draw(wrong[knob])
    return chosen


def _estimate(c):
    h = c["a"] * c["k"] if isinstance(c["a"], int) and isinstance(c["k"], int) else c["k"]
    model = GPT(L=c["L"], h=h, a=c["a"], s=c["s"], V=c["V"])
    layout = Layout(t=c["t"], p=c["p"], d=c["d"], b=c["b"], m=c["m"], v=c["v"],
                    zero_stage=c["zero_stage"], recompute=c["recompute"],
                    schedule=c["schedule"])
    cluster = make_cluster(c["gpu"], c["gpus_per_node"], c["network"], network_ports=c["ports"],
                           collectives=c["collectives"])
    return estimate(model, layout, cluster)


@fuzz(150)
@given(settings_=one_knob_wrong(VALID, WRONG))
def test_estimate_returns_finite_numbers_or_one_clear_error(settings_):
    try:
        est = _estimate(settings_)
    except ValueError as exc:
        _assert_clear(str(exc))
        return
    event("estimated")
    numbers = list(_numbers(est.as_dict()))
    assert numbers and all(math.isfinite(x) for x in numbers)
    assert est.step_time_s > 0 and est.tflops_per_gpu > 0 and est.memory.total > 0


@fuzz(30)
@given(model=WILD, layout=WILD, cluster=WILD)
def test_estimate_names_an_argument_of_the_wrong_type(model, layout, cluster):
    try:
        estimate(model, layout, cluster)
    except ValueError as exc:
        _assert_clear(str(exc))
    else:
        raise AssertionError("estimate accepted arguments that are not a GPT, Layout, Cluster")


# --- the command line ------------------------------------------------------------------------

FLAG_VALUE = st.one_of(SMALL.map(str), st.sampled_from(
    ["nan", "inf", "-inf", "1e3", "2.5", "", "x", "-0", str(2**31), str(10**40)]))
FLAGS = ("--layers", "--hidden", "--heads", "--seq", "--vocab", "--t", "--p", "--d",
         "--microbatch", "--global-batch", "--m", "--v", "--zero", "--gpus-per-node",
         "--network-gbit", "--network-ports", "--gpus", "--model", "--gpu", "--cluster",
         "--recompute", "--schedule", "--collectives")


@st.composite
def command_lines(draw):
    """A run the command line can estimate or plan, and in most draws one or two flags set to
    anything at all."""
    argv = ["--model", draw(st.sampled_from(["gpt2-small", "gpt-161B", "megatron-1T"])),
            "--t", str(draw(st.sampled_from([1, 2, 4, 8, 16]))),
            "--p", str(draw(st.sampled_from([1, 2, 4, 8]))),
            "--global-batch", str(draw(st.sampled_from([64, 128, 512])))]
    argv += draw(st.lists(st.sampled_from(["--plan", "--json", "--sequence-parallel",
                                           "--no-scatter-gather"]), unique=True, max_size=2))
    if draw(st.booleans()):
        argv += ["--gpus", str(draw(st.sampled_from([64, 128, 256])))]
    for flag in draw(st.lists(st.sampled_from(FLAGS), max_size=2)):
        argv.append(f"{flag}={draw(FLAG_VALUE)}")
    return argv


@fuzz(100)
@example(argv=["--model", "gpt2-small", "--t", "1", "--p", "1", "--network-gbit=1e308"])
@example(argv=["--model", "gpt2-small", "--global-batch", "16", "--d", "16",
               "--network-gbit=1e-320", "--json"])                    # was Infinity, not JSON
@given(argv=command_lines())
def test_cli_prints_finite_numbers_or_exits_2_with_one_line(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(argv)
        except SystemExit as exc:  # argparse: a flag it cannot read
            status = exc.code
    if status == 2:
        assert out.getvalue() == "" and err.getvalue().startswith("error: ")
        _assert_clear(err.getvalue())
        return
    assert status == 0, (argv, status, err.getvalue())
    event("printed a result")
    text = out.getvalue()
    if "--json" in argv:
        assert all(math.isfinite(x) for x in _numbers(json.loads(text)))
    else:
        assert "nan" not in text and "inf " not in text


# --- pipeline schedules ------------------------------------------------------------------------

SCHEDULE_VALID = {
    "function": st.sampled_from(["gpipe", "one_f_one_b", "interleaved_one_f_one_b", "make"]),
    "name": st.sampled_from(["gpipe", "1f1b", "interleaved"]),
    "p": st.integers(1, 6), "m": st.integers(1, 12), "v": st.integers(1, 3),
    "forward": st.one_of(st.floats(0, 10), st.just(lambda s, a: 1.0 + s)),
    "backward": st.floats(0, 10), "latency": st.floats(0, 1), "send": st.floats(0, 1)}
SCHEDULE_WRONG = {"function": SCHEDULE_VALID["function"],
                  "name": st.sampled_from(["zb", None, ["1f1b"]]),
                  "p": BAD, "m": BAD, "v": BAD,
                  **{k: st.one_of(BAD, st.sampled_from([lambda s, a: float("nan"),
                                                        lambda s, a: -1.0]))
                     for k in ("forward", "backward", "latency", "send")}}


@fuzz(100)
@example(c={"function": "make", "name": "1f1b", "p": 2, "m": 4, "v": 1, "forward": 1e308,
            "backward": 1e308, "latency": 0.0, "send": 0.0})         # sums overflow: not nan
@given(c=one_knob_wrong(SCHEDULE_VALID, SCHEDULE_WRONG))
def test_schedules_and_simulation_finite_or_one_clear_error(c):
    function, name, p, m, v = c["function"], c["name"], c["p"], c["m"], c["v"]
    calls = {"gpipe": lambda: schedules.gpipe(p, m),
             "one_f_one_b": lambda: schedules.one_f_one_b(p, m),
             "interleaved_one_f_one_b": lambda: schedules.interleaved_one_f_one_b(p, m, v),
             "make": lambda: schedules.make(name, p, m, v)}
    try:
        schedule = calls[function]()
    except ValueError as exc:
        _assert_clear(str(exc))
        return
    assert len(schedule) == p
    try:
        sim = simulate(schedule, forward=c["forward"], backward=c["backward"],
                       latency=c["latency"], send=c["send"])
    except ValueError as exc:
        _assert_clear(str(exc))
        return
    event("simulated")
    numbers = [sim.makespan, *sim.bubble, *sim.bubble_ideal, *sim.peak_stash]
    assert all(math.isfinite(x) and x >= 0 for x in numbers)


# --- the labs' command lines and launch's settings ---------------------------------------------
# Each lab's own flags, read from its usage; each set to values a careless student might type
# (20-digit numbers and sizes no machine holds among them). A value that passes every check
# reaches the launch, which is stubbed: "a run" (exit 99). The sweep runs with --dry-run (a
# run prints its commands, exit 0) and reads each lab's flags from the same usage. Paths
# only ever point into a folder of the test's own, or onto the kernel's file systems.

LABS = ("allreduce", "ddp", "mp", "tp", "pp", "cp", "ep", "hybrid", "zero", "train",
        "launch_overhead", "sweep")
SCRATCH = Path(tempfile.mkdtemp(prefix="lessonlib-fuzz-"))
(SCRATCH / "a_file").write_text("not a folder")
VALUES = ("0", "-1", "1", "2", "3", "nan", "inf", "-inf", "1e308", "1e10", str(10 ** 30),
          "99999999999999999999", "-99999999999999999999", "2147483647", "2000000000",
          "0.5", "abc", "", "t1p2d1", "t3p1d1", "1,2", "1,1000", "gpipe", "fp32", "zero1",
          "fsdp", "none", "tp", "steps=1,2")
PATHS = (str(SCRATCH / "out.json"), str(SCRATCH), str(SCRATCH / "a_file" / "x"), "/proc/x",
         "/sys/x", "x" * 300)
PATH_FLAGS = ("--json", "--checkpoint-dir", "--out", "--grid-file", "--collect")
BASE = {"train": ["--checkpoint-dir", str(SCRATCH / "ckpt")],
        "sweep": ["--lab", "tp", "--dry-run", "--out", str(SCRATCH / "sweep")]}
RUN = 99


def _lab_flags(lab: str) -> dict[str, bool]:
    """``{flag: takes a value}`` from the lab's usage."""
    usage = labrun.run(lab, "--help").stdout.split("\n\n")[0]
    return {flag: bool(meta) for flag, meta in re.findall(r"\[(--[a-z0-9-]+)(?: ([^\]\s]+))?",
                                                          usage)}


FLAGS_OF = {lab: _lab_flags(lab) for lab in LABS}


def _would_run(*args, **kwargs):
    raise SystemExit(RUN)


def _would_start_ranks(worker, *args, **kwargs):
    """The stubbed launch: a 20-digit count never reaches the ranks (it overflows there)."""
    huge = [x for x in _numbers([args, kwargs]) if isinstance(x, int) and abs(x) >= 10 ** 19]
    assert not huge, f"ranks would start with {huge}"
    raise SystemExit(RUN)


def _flags_from_usage(python, lab):
    return set(FLAGS_OF[lab]) | {"--help"}


@pytest.mark.parametrize("lab", LABS)
@fuzz(12)
@given(data=st.data())
def test_lab_command_lines_run_or_refuse_in_one_line(lab, data):
    argv = list(BASE.get(lab, []))
    for flag in data.draw(st.lists(st.sampled_from(sorted(FLAGS_OF[lab])), max_size=3)):
        if FLAGS_OF[lab][flag]:
            argv += [flag, data.draw(st.sampled_from(PATHS if flag in PATH_FLAGS else VALUES))]
        else:
            argv.append(flag)
    lines = _refusal(lab, argv)
    assert lines is None or len(lines) == 1 or "unrecognized arguments" in lines[-1], \
        (lab, argv, lines)


def _refusal(lab: str, argv: list[str], env: dict | None = None) -> list[str] | None:
    """``labs/<lab>.py argv`` with the launch stubbed, under ``env`` (the launcher variables
    not in it unset; None: as they are): None if it would run, else its refusal's lines,
    with exit status 2 and no traceback."""
    with pytest.MonkeyPatch.context() as mp:
        for name in LAUNCH_ENV if env is not None else ():
            if name in env:
                mp.setenv(name, env[name])
            else:
                mp.delenv(name, raising=False)
        for name in ("run", "launch"):
            mp.setattr(launcher, name, _would_start_ranks)
        mp.setattr(sweep_points, "lab_flags", _flags_from_usage)
        done = labrun.run(lab, *argv)
    if done.returncode == RUN or (lab == "sweep" and done.returncode == 0):
        event("a run")
        return None
    assert done.returncode == 2 and "Traceback" not in done.stderr, (lab, argv, env, done.stderr)
    event("refused in one line")
    return done.stderr.strip().splitlines()


# What a launcher (or a shell) may leave in the environment, each to any value: a lab is a
# rank of torchrun's or srun's launch only when they say so, and a value torch could not
# read is refused in one line; RANK and WORLD_SIZE alone start local ranks ("a run" either way)
LAUNCH_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
              "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE",
              "SLURM_PROCID", "SLURM_LOCALID", "SLURM_JOB_ID", PROGRESS_ENV)
ENV_VALUES = ("0", "1", "3", "-1", "", "x", "1.5", " 1", "99999999999999999999", "127.0.0.1",
              "10.0.0.1", "localhost", "True", "70000", "29500")


@pytest.mark.parametrize("lab", LABS)
@fuzz(8)
@given(data=st.data())
def test_lab_environment_runs_or_refuses_in_one_line(lab, data):
    env = data.draw(st.dictionaries(st.sampled_from(LAUNCH_ENV), st.sampled_from(ENV_VALUES),
                                    max_size=6))
    lines = _refusal(lab, list(BASE.get(lab, [])), env)
    assert lines is None or (len(lines) == 1 and any(name in lines[0] for name in LAUNCH_ENV)), \
        (lab, env, lines)


@fuzz(100)
@example(world_size=2, timeout=1e13, backend="gloo")        # gloo: "Invalid timeout"
@example(world_size=2, timeout=1e300, backend="gloo")       # timedelta: OverflowError
@example(world_size=numpy.int64(2), timeout=600, backend="gloo")
@given(world_size=st.one_of(OFTEN_VALID, st.integers(1, 4).map(numpy.int64)),
       timeout=st.one_of(st.floats(), st.integers(), BAD, st.sampled_from([1e13, 1e300, 600])),
       backend=st.sampled_from(["auto", "gloo", "nccl", "mpi", None, 3]))
def test_launch_settings_run_or_refuse_in_one_line(world_size, timeout, backend):
    """What passes the checks is what the ranks can use: a timedelta, gloo's 64-bit count of
    nanoseconds, a whole number of ranks."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(starter, "context", _would_run)
        try:
            launcher.launch(lifetime_workers.wait_for, world_size, "unused", timeout=timeout,
                            backend=backend)
        except SystemExit as stop:
            assert stop.code == RUN
            assert datetime.timedelta(seconds=timeout) and timeout * 1e9 < 2 ** 63, timeout
            assert operator.index(world_size) >= 1
            event("a run")
        except ValueError as exc:
            assert "\n" not in str(exc).strip() and any(
                name in str(exc) for name in ("world_size", "timeout", "backend")), str(exc)
            assert not (isinstance(world_size, numpy.integer) and timeout == 600
                        and backend == "gloo"), f"a NumPy world size refused: {exc}"
            event("refused in one line")
