"""Run a lab script for the labs' smoke tests, and the checks every lab's JSON record must pass.

``run`` runs ``python labs/<name>.py ARGS`` inside the test's own interpreter, the way the
interpreter runs a script: the file executes as ``__main__`` (its ``if __name__ ==
"__main__"`` block included) with ``labs/`` first on ``sys.path``, that argv, from the
course's root, and it hands back the exit code, stdout and stderr. Its ranks then come from
the test process's warm fork server instead of a fresh interpreter that imports torch twice
(the script, then its fork server): about 5-9 s less per run on a 2-core machine. ``command``
gives the real command line to the tests that must kill or time a separate process
(tests/test_checkpoint.py, tests/test_gpu_check.py)."""
import contextlib
import importlib.util
import io
import json
import runpy
import subprocess
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LABS = ROOT / "labs"


def command(name, *args) -> list[str]:
    return [sys.executable, str(LABS / f"{name}.py"), *args]


def run(name, *args) -> subprocess.CompletedProcess:
    """The lab's exit code, stdout and stderr (bad settings: code 2 and argparse's line), as
    its command line gives them. An exception becomes exit code 1 with its traceback on
    stderr, as the interpreter prints it; ``sys.exit("message")`` prints the message."""
    argv = command(name, *args)[1:]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.ExitStack() as stack:
        stack.enter_context(contextlib.chdir(ROOT))
        stack.enter_context(_as_command_line(argv))
        stack.enter_context(contextlib.redirect_stdout(out))
        stack.enter_context(contextlib.redirect_stderr(err))
        try:
            runpy.run_path(argv[0], run_name="__main__")
            code = 0
        except SystemExit as stop:
            code = 0 if stop.code is None else stop.code
            if not isinstance(code, int):
                print(code, file=sys.stderr)
                code = 1
        except Exception:  # noqa: BLE001  (what the interpreter would print and exit 1 on)
            traceback.print_exc()
            code = 1
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


@contextlib.contextmanager
def _as_command_line(argv):
    """sys.argv as the command line sets it, and the script's folder first on sys.path."""
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv, sys.path[:0] = list(argv), [str(LABS)]
    try:
        yield
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path


def run_lab(name, *flags, tmp_path) -> dict:
    """Run the lab to success and return the JSON record it wrote."""
    out = tmp_path / f"{name}.json"
    proc = run(name, *flags, "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def load_lab(name):
    """The lab script as a module, to call its functions without running it."""
    spec = importlib.util.spec_from_file_location(f"lab_{name}", LABS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_shape(record, lab, world_size):
    assert {"lab", "world_size", "backend", "device", "settings", "results"} <= set(record)
    assert (record["lab"], record["world_size"], record["backend"], record["device"]) == \
        (lab, world_size, "gloo", "cpu")
    assert record["settings"]["command"].startswith(f"python labs/{lab}.py")
