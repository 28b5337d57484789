"""`make setup` with a wrong Python: one line naming it and its version, before any .venv is
made, and a .venv made earlier by a wrong Python is refused, not reused (tools/check_python.py)."""
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import check_python  # noqa: E402  (tools/ is not a package)

# A stand-in python3 that reports 3.9.18: the real interpreter, its version doctored.
FAKE = f"""#!/bin/sh
exec {sys.executable} -c "import runpy, sys; sys.version_info = (3, 9, 18, 'final', 0); \\
sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')" "$@"
"""


def _fake_python(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(FAKE)
    path.chmod(0o755)
    return path


def _make_setup(*settings: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "--no-print-directory", "setup", *settings], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def test_supported_versions_are_those_the_readme_and_pyproject_give():
    assert check_python.problem(sys.version_info, "python3") is None
    assert check_python.problem((3, 10, 0), "python3") is None
    assert check_python.problem((3, 12, 9), "python3") is None
    line = check_python.problem((3, 9, 18), "python3")
    assert "python3 is Python 3.9.18" in line and "3.10-3.12" in line and "\n" not in line
    assert 'requires-python = ">=3.10"' in (ROOT / "pyproject.toml").read_text()
    assert "Python 3.10-3.12" in (ROOT / "README.md").read_text()


def test_a_wrong_python_stops_setup_in_one_line_and_makes_no_venv(tmp_path):
    venv = tmp_path / "venv"
    done = _make_setup(f"PYTHON={_fake_python(tmp_path / 'python3')}", f"VENV={venv}")
    assert done.returncode != 0
    ours = [line for line in done.stderr.splitlines()          # make's own "make[1]: ***" too
            if not re.match(r"make(\[\d+\])?: ", line)]
    assert len(ours) == 1 and re.search(r"python3 is Python 3\.9\.18, and the course needs "
                                        r"Python 3\.10-3\.12", ours[0]), done.stderr
    assert not venv.exists()


def test_a_venv_made_by_a_wrong_python_is_refused_not_reused(tmp_path):
    venv = tmp_path / "venv"
    _fake_python(venv / "bin" / "python")
    done = _make_setup(f"PYTHON={sys.executable}", f"VENV={venv}")
    assert done.returncode != 0 and f"{venv} was made with Python 3.9.18" in done.stderr
    assert f"rm -rf {venv}" in done.stderr
    assert sorted(os.listdir(venv)) == ["bin"]          # nothing installed into it
