"""labs/gpu_check.py on a bare box: a virtual environment that holds only torch, numpy,
matplotlib and cloudpickle (and what they need), with the course not installed, runs it
from the checkout (versions, a 1-rank launch, the products, the memory point, the report)
and imports every lab; and the course's code parses as Python 3.10 (the oldest a GPU box may
bring)."""
import ast
import importlib.metadata as md
import json
import os
import re
import subprocess
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BARE = ("torch", "numpy", "matplotlib", "cloudpickle")


def _needed(names) -> set:
    """These distributions and every one they require (markers for this Python honoured)."""
    from packaging.requirements import Requirement

    seen, todo = set(), list(names)
    while todo:
        name = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if name in seen:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue                              # an optional one this machine lacks
        seen.add(name)
        for req in map(Requirement, dist.requires or []):
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def _link_packages(folder: Path) -> None:
    """Symlinks to just those distributions' top-level files, from this environment."""
    folder.mkdir()
    for name in _needed(BARE):
        dist = md.distribution(name)
        for top in {Path(f).parts[0] for f in dist.files or [] if not str(f).startswith("..")}:
            source = Path(dist.locate_file(top))
            if source.exists() and not (folder / top).exists() and top != "__pycache__":
                (folder / top).symlink_to(source)


@pytest.fixture(scope="module")
def bare(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bare")
    _link_packages(tmp / "packages")
    venv.EnvBuilder(with_pip=False, symlinks=True).create(tmp / "venv")
    python = tmp / "venv" / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    (Path(site) / "bare.pth").write_text(str(tmp / "packages") + "\n")
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp), "OMP_NUM_THREADS": "1"}
    return python, env, tmp


@pytest.mark.timeout(180)
def test_gpu_check_runs_from_a_plain_checkout_with_only_its_four_packages(bare):
    python, env, tmp = bare
    missing = subprocess.run([python, "-c", "import lessonlib"], capture_output=True, cwd=tmp, env=env)
    widgets = subprocess.run([python, "-c", "import ipywidgets"], capture_output=True, cwd=tmp, env=env)
    assert missing.returncode and widgets.returncode, "the environment is not bare"
    out = subprocess.run([python, str(ROOT / "labs" / "gpu_check.py"), "--allow-cpu", "--quick",
                          "--labs", "", "--budget-s", "90", "--out", str(tmp / "report")],
                         capture_output=True, text=True, cwd=tmp, env=env, timeout=150)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    report = json.loads((tmp / "report" / "report.json").read_text())
    points = {p["point"]: p for p in report["points"]}
    assert list(points) == ["versions", "launch", "gemm", "memory"]
    assert all(p["status"] == "ok" for p in points.values()), points
    assert points["launch"]["sum"] == 1.0 and points["launch"]["all_reduce_s"] > 0
    assert "| launch |" in (tmp / "report" / "report.md").read_text()


@pytest.mark.timeout(120)
def test_every_lab_imports_in_the_bare_environment(bare):
    python, env, tmp = bare
    labs = sorted(p.stem for p in (ROOT / "labs").glob("*.py"))
    code = ("import importlib, sys; sys.path[:0] = [sys.argv[1], sys.argv[1] + '/labs']\n"
            "for name in sys.argv[2:]: importlib.import_module(name)")
    out = subprocess.run([python, "-c", code, str(ROOT), *labs], capture_output=True,
                         text=True, cwd=tmp, env=env, timeout=100)
    assert out.returncode == 0, out.stderr[-3000:]


def test_the_course_parses_as_python_3_10():
    for path in [*ROOT.glob("lessonlib/**/*.py"), *ROOT.glob("labs/*.py")]:
        ast.parse(path.read_text(), str(path), feature_version=(3, 10))
