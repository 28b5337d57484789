"""Every lab setting is checked before any rank starts (issue 46, items 13-16): a size the
machine could never hold, a hybrid axis that does not fit, a sweep's point timeout and a path
on a kernel file system (``/proc``, ``/sys``) each cost one line naming the flag, with no
usage block above it. The launch is stubbed: a setting that passes every check would start
ranks, which these tests count as a failure; the sweep's reading of a lab's --help is
stubbed too."""
import sys

import labrun
import pytest

from lessonlib import launcher

sys.path.append(str(labrun.LABS))   # after site-packages: labs/ holds scripts, not a package
import sweep_points  # noqa: E402  (the sweep reads each lab's flags with it)

HUGE = "99999999999999999999"
STARTED = 99


def _would_start(*args, **kwargs):
    raise SystemExit(STARTED)


def refused(lab, *argv):
    """The lab's one line of refusal (the launch stubbed, so no rank ever starts)."""
    with pytest.MonkeyPatch.context() as mp:
        for name in ("run", "launch"):
            mp.setattr(launcher, name, _would_start)
        mp.setattr(sweep_points, "lab_flags", lambda python, lab: {"--help"})  # no subprocess
        done = labrun.run(lab, *argv)
    assert done.returncode == 2, (argv, done.returncode, done.stderr[-2000:])
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


@pytest.mark.parametrize("lab,flag", [("pp", "--microbatches"), ("cp", "--seq"),
                                      ("tp", "--seq"), ("ep", "--hidden"),
                                      ("hybrid", "--layers"), ("train", "--steps"),
                                      ("mp", "--width"), ("zero", "--batch")])
def test_a_twenty_digit_number_is_refused_naming_its_flag(lab, flag, tmp_path):
    extra = ["--checkpoint-dir", str(tmp_path)] if lab == "train" else []
    line = refused(lab, flag, HUGE, *extra)
    assert flag in line and "at most" in line, line


@pytest.mark.parametrize("lab,argv,flag", [
    ("pp", ["--microbatches", "2000000000", "--width", "4096"], "--microbatches"),
    ("cp", ["--seq", "2000000000"], "--seq"),
    ("tp", ["--seq", "400000000", "--heads", "2", "--hidden", "32"], "--seq"),
    ("ep", ["--hidden", "1000000000"], "--hidden"),
    ("hybrid", ["--hidden", "2000000000", "--heads", "1"], "--hidden"),
    ("mp", ["--model", "mlp", "--width", "2000000000"], "--width"),
    ("mp", ["--hidden", "2000000000"], "--hidden"),
    ("zero", ["--seq", "2000000000"], "--seq"),
    ("ddp", ["--batch", "2000000000"], "--batch"),
    ("allreduce", ["--size-mb", "1e11"], "--size-mb"),
])
def test_sizes_beyond_the_machine_are_refused_naming_the_flag(lab, argv, flag):
    line = refused(lab, *argv)
    assert flag in line and "memory" in line, line


@pytest.mark.parametrize("argv,words", [
    (["--cp", "0"], ["--cp", "got 0"]), (["--cp", "-2"], ["--cp", "got -2"]),
    (["--ep", "0"], ["--ep", "got 0"]),
    (["--cp", "3"], ["--cp 3", "use one of [1, 2, 4, 8]"]),
    (["--ep", "3"], ["--ep 3", "use one of [1, 2, 4]"]),
    (["--cp", "2", "--ep", "2"], ["--ep 2 with --cp 2", "use --cp 1"]),
    (["--ep", "2", "--shard", "zero1"], ["--shard zero1", "use --shard none"]),
    (["--cp", "2", "--seq", "30"], ["--cp 2 with --seq 30", "a multiple of 4"]),
])
def test_hybrid_names_the_axis_at_fault(argv, words):
    line = refused("hybrid", *argv)
    assert all(w in line for w in words), line
    assert "--layers" not in line and "--global-batch" not in line, line


@pytest.mark.parametrize("argv,words", [
    (["--point-timeout", "-1"], "--point-timeout"), (["--point-timeout", "0"], "--point-timeout"),
    (["--point-timeout", "nan"], "--point-timeout"),
    (["--point-timeout", "inf"], "--point-timeout"),
    (["--nproc-per-node", "0"], "--nproc-per-node"),
    (["--nproc-per-node", HUGE], "--nproc-per-node"),
    (["--grid", "steps"], "steps"),
])
def test_sweep_refuses_in_one_line_without_the_usage(argv, words, tmp_path):
    line = refused("sweep", "--lab", "tp", *argv, "--out", str(tmp_path / "out"), "--dry-run")
    assert words in line and line.startswith("labs/sweep.py: error: "), line


@pytest.mark.parametrize("argv", [["--budget-s", "-1"], ["--max-world-size", HUGE]])
def test_gpu_check_refuses_in_one_line_without_the_usage(argv):
    line = refused("gpu_check", "--allow-cpu", *argv)
    assert argv[0] in line and line.startswith("labs/gpu_check.py: error: "), line


@pytest.mark.parametrize("lab,argv,flag", [
    ("train", ["--checkpoint-dir", "/proc/ckpt"], "--checkpoint-dir"),
    ("train", ["--checkpoint-dir", "/sys/ckpt"], "--checkpoint-dir"),
    ("sweep", ["--lab", "tp", "--out", "/proc/sweep"], "--out"),
    ("sweep", ["--lab", "tp", "--out", "/sys/sweep"], "--out"),
    ("tp", ["--json", "/sys/out.json"], "--json"),
])
def test_kernel_file_systems_are_refused_up_front(lab, argv, flag):
    line = refused(lab, *argv)
    assert flag in line and "kernel" in line, line
