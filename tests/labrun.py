"""Run a lab script as a user would (``python labs/<name>.py ...`` from the course's root),
for the labs' smoke tests; and the checks every lab's JSON record must pass."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LABS = ROOT / "labs"


def command(name, *args) -> list[str]:
    return [sys.executable, str(LABS / f"{name}.py"), *args]


def run(name, *args, timeout=240) -> subprocess.CompletedProcess:
    """The lab's exit code, stdout and stderr (bad settings: code 2 and argparse's line)."""
    return subprocess.run(command(name, *args), cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def run_lab(name, *flags, tmp_path, timeout=150) -> dict:
    """Run the lab to success and return the JSON record it wrote."""
    out = tmp_path / f"{name}.json"
    proc = run(name, *flags, "--json", str(out), timeout=timeout)
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
