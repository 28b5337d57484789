"""The setup stays honest: conda and pip get the same packages, notebooks match their twins."""
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import notebooks  # noqa: E402  (tools/notebooks.py)


def _name(requirement: str) -> str:
    return re.split(r"[=<>!~ ;\[]", requirement.strip(), maxsplit=1)[0].lower()


def test_environment_yml_lists_the_same_packages_as_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {_name(r): r.replace(" ", "") for r in
              project["dependencies"] + project["optional-dependencies"]["test"]}
    pip_section = re.search(r"- pip:\n((?:\s+- .+\n)+)", (ROOT / "environment.yml").read_text())
    listed = {_name(line.split("- ", 1)[1]): line.split("- ", 1)[1].strip().strip('"')
              for line in pip_section.group(1).splitlines()}
    listed.pop("-e", None)
    assert listed == wanted


def test_torch_is_pinned_to_the_tested_version():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "torch==2.13.0" in project["dependencies"]


def test_every_notebook_matches_its_py_percent_twin():
    assert notebooks.pairs(), "no notebooks found"
    assert notebooks.differences() == []
