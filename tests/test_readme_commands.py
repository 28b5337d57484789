"""Every command that README.md and labs/README.md give runs as written on a fresh clone after
`make course`: .venv made, not activated, the shell in the repository's root.

The commands are every line of the READMEs' ```bash blocks (with their backslash
continuations, comments dropped) and every inline `code` that is a whole command (it starts
with a program and names no placeholder such as FILE, X.py or ...). Each is checked as far as
this machine can run it without training for minutes or a cluster:

- a Python program (`.venv/bin/python labs/ddp.py ...`, `-m lessonlib.costmodel ...`): the
  command's own flags, parsed by the program's own argparse parser in this process, which
  stops right after parsing (nothing is launched), and the program run as written with
  `--help` in a separate process whose environment has no virtual environment activated (so
  `python` there would be the system's). When this test runs in .venv's own interpreter, the
  in-process parse has already imported and started each program in it, so one program of
  each kind (a lab, a tool, a module) is run as a separate process, each import of torch
  costing a second or two of CPU; in any other interpreter, every program is;
- `.venv/bin/torchrun ...`: torchrun's flags by torchrun's own parser, then the script's
  command as above; `sbatch`/`salloc` and the SLURM dry run: the template file, then the
  lab's command as above (there is no SLURM here);
- `make TARGET`: `make -n` (what it would run, setup assumed done);
- `.venv/bin/python -c ...`: run as written;
- conda: environment.yml and the environment's name; native Windows: not run (Linux CI).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import io
import os
import re
import runpy
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ("README.md", "labs/README.md")
PYTHON = ".venv/bin/python"
COMMAND = re.compile(r"([A-Z_]+=\S* )*(make |\.venv/bin/|torchrun |python|sbatch |salloc |bash |"
                     r"conda |py -|\.venv\\)")
PLACEHOLDERS = re.compile(r"\.\.\.|<|\bFILE\b|\bFOLDER\b|\bX\.py\b|\bW\b|\bNODE0\b|\bTEXT\b")
WINDOWS = (".venv\\", "py -")
NO_PARSER = (["tools/notebooks.py"], ["-m", "lessonlib.viz.sweep"],   # --help only: they act,
             ["-m", "pytest"])                                         # or are a test session


def commands(text: str) -> list[str]:
    """The commands a README gives, in order: bash blocks' lines and whole inline commands."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0].strip() if not line.lstrip().startswith("#") else ""
            if line:
                found.append(" ".join(line.split()))
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    for code in re.findall(r"(?<!`)`([^`\n]+)`(?!`)", prose):
        if COMMAND.match(code) and " " in code and not PLACEHOLDERS.search(code):
            found += [part.strip() for part in code.split("&&")]
    return found


def documented() -> list[tuple[str, str]]:
    return [(doc, c) for doc in DOCS for c in commands((ROOT / doc).read_text())]


class _Parsed(Exception):
    """Raised by argparse, patched: the command line parsed; stop before the program runs."""


@contextlib.contextmanager
def _parse_only():
    parse_args = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        raise _Parsed(parse_args(self, args, namespace))

    argparse.ArgumentParser.parse_args = parse_then_stop
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_args = parse_args


def parse_flags(program: list[str], flags: list[str]) -> str | None:
    """Parse ``flags`` with ``program``'s own parser (``[script]`` or ``["-m", module]``),
    in this process, stopping once parsed; the parser's complaint, or None."""
    err = io.StringIO()
    saved_argv, saved_path = sys.argv, list(sys.path)
    target = program[1] if program[0] == "-m" else str(ROOT / program[0])
    sys.argv = [target, *flags]
    if program[0] != "-m":
        sys.path.insert(0, str(Path(target).parent))
    try:
        with _parse_only(), contextlib.chdir(ROOT), contextlib.redirect_stderr(err), \
                contextlib.redirect_stdout(io.StringIO()):
            if program[0] == "-m":
                runpy.run_module(target, run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(target, run_name="__main__")
        return "the program ran past its argument parser (none found)"
    except _Parsed:
        return None
    except SystemExit as stop:      # --help as written exits 0; a bad flag exits 2
        return None if stop.code in (0, None) else f"exit {stop.code}: {err.getvalue()[-500:]}"
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path


def _split_python(words: list[str]) -> tuple[list[str], list[str]]:
    """(program, flags) of the words after the interpreter."""
    if words[0] == "-m":
        return words[:2], words[2:]
    return words[:1], words[1:]


def plan(command: str) -> dict:
    """How to check one command: {"help": [program ...] to run with --help as written,
    "parse": [(program, flags)], "run": [argv to run as written], "make": [targets], "files":
    [paths that must exist], "skip": reason}."""
    words = shlex.split(command)
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):          # VAR=value command
        words = words[1:]
    if command.startswith(WINDOWS):
        return {"skip": "native Windows (not part of CI)"}
    if words[0] == "conda":
        return {"conda": words}
    if words[0] == "make":
        return {"make": words[1:]}
    if words[0] == "salloc":
        at = next(i for i, w in enumerate(words) if w == PYTHON or w.endswith("torchrun"))
        return plan(" ".join(shlex.quote(w) for w in words[at:]))
    if words[0] in ("sbatch", "bash"):
        at = next(i for i, w in enumerate(words) if w.startswith("labs/slurm/"))
        template, rest = words[at], words[at + 1:]
        if template.endswith("dry_run.sh"):
            rest = rest[2:]                                   # srun|torchrun RANKS
        return {"files": [template], "parse": [([f"labs/{rest[0]}.py"], rest[1:])]}
    if words[0].endswith("torchrun"):
        from torch.distributed.run import get_args_parser
        args = get_args_parser().parse_args(words[1:])
        return {"files": [words[0]], "parse": [([args.training_script],
                                                args.training_script_args)]}
    if words[0] == PYTHON and words[1] == "-c":
        return {"run": [words]}
    if words[0] == PYTHON:
        program, flags = _split_python(words[1:])
        return {"help": [program], "parse": [] if program in NO_PARSER else [(program, flags)]}
    raise AssertionError(f"a documented command this test does not know how to check: {command}")


def _environment_without_venv() -> dict:
    """This environment as a fresh shell would have it: no virtual environment activated."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME")}
    bins = {str(Path(sys.prefix) / "bin"), str(ROOT / ".venv" / "bin")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if p not in bins)
    return env


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=ROOT, env=_environment_without_venv(), capture_output=True,
                          text=True, timeout=120)


def test_the_readmes_give_commands_this_test_knows():
    found = documented()
    assert len(found) >= 40
    assert not [c for _, c in found if re.match(r"(python3?|torchrun) ", c)], \
        "a command names plain python or torchrun, which is not .venv's before it is activated"
    for _, command in found:
        plan(command)


@pytest.mark.timeout(240)
def test_every_documented_command_runs_as_written():
    if not (ROOT / PYTHON).exists():
        pytest.skip(f"{PYTHON} is missing: run make setup first")
    plans = [(doc, command, plan(command)) for doc, command in documented()]
    problems = []
    programs = sorted({tuple(p) for *_, how in plans for p in how.get("help", [])})
    if Path(sys.prefix).resolve() == (ROOT / ".venv").resolve():
        kinds = {p[0] if p[0] == "-m" else p[0].split("/")[0]: p for p in reversed(programs)}
        programs = sorted(kinds.values())
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        helped = dict(zip(programs, pool.map(lambda p: _run([PYTHON, *p, "--help"]), programs)))
        ran = {tuple(argv): pool.submit(_run, argv) for *_, how in plans
               for argv in how.get("run", [])}
    for program, done in helped.items():
        if done.returncode != 0 or not done.stdout.strip():
            problems.append(f"{PYTHON} {' '.join(program)} --help: exit {done.returncode}, "
                            f"{done.stderr.strip()[-300:]}")
    for argv, future in ran.items():
        done = future.result()
        if done.returncode != 0:
            problems.append(f"{' '.join(argv)}: exit {done.returncode}, {done.stderr[-300:]}")
    for doc, command, how in plans:
        where = f"{doc}: {command}"
        for program, flags in how.get("parse", []):
            if (complaint := parse_flags(program, flags)) is not None:
                problems.append(f"{where}: {complaint}")
        for path in how.get("files", []):
            if not (ROOT / path).exists():
                problems.append(f"{where}: {path} does not exist")
        if "make" in how:
            done = subprocess.run(["make", "-n", "--no-print-directory", "-o", ".venv/.installed",
                                   *how["make"]], cwd=ROOT, capture_output=True, text=True)
            if done.returncode != 0:
                problems.append(f"{where}: make -n: {done.stderr.strip()[-300:]}")
        if "conda" in how:
            spec = (ROOT / "environment.yml").read_text()
            name = how["conda"][-1] if how["conda"][1] == "activate" else None
            if (name and f"name: {name}" not in spec) or not spec:
                problems.append(f"{where}: environment.yml does not name {name}")
    assert problems == [], "\n".join(problems)
    print(f"{len(plans)} documented commands checked, {len(programs)} programs run with --help")
