"""Open the course in JupyterLab the way a student should first see it (``make course``).

    python tools/course.py [JUPYTERLAB OPTION ...]    # what `make course` runs
    make course LAB_ARGS="--ip=0.0.0.0 --port=8888"    # e.g. in a container with a published port

The student works in a copy of the notebooks, my-notebooks/ (ignored by git), never in
notebooks/ itself: opening, running and saving a notebook rewrites it (outputs, widget
values, the kernel's name), and a student's `git pull` would then conflict with the
course's next version. Each notebook is copied there once, the first time the course opens
after it appears; a copy the student has is never overwritten or deleted, and when the
course's own notebook has changed since it was copied, this says so and how to get the new
one. A copy is a plain notebook, not paired with a py:percent twin as the course's are.
JupyterLab starts in my-notebooks/ on 01-why-scale.ipynb.

The kernels get the thread settings of `make test` (OMP_NUM_THREADS=1: the README's Run All
times are measured that way; torch's default, one thread per core it may run on, counts
every host core in a container limited to a few CPUs and made in-kernel training 6-24x
slower). The ranks a notebook launches take their share of the cores this process may use,
a container's CPU quota counted (``lessonlib.launcher.checks.cores``).

Exercise solutions stay folded, source and output, when Run All runs them, until the student
opens them: JupyterLab itself unfolds a cell's output whenever it runs, so the course adds
one small extension (tools/jupyterlab/labextensions/course-solutions, plain JavaScript).

The course's settings (tools/jupyterlab/user-settings: no news question, no update check)
are copied into build/jupyterlab/ on first use, so what a student changes later stays
there and the repository stays clean. As root (the usual user in a container) JupyterLab
refuses to start without --allow-root; this adds it and says so.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
FIRST = "01-why-scale.ipynb"
SHIPPED = ROOT / "tools" / "jupyterlab" / "user-settings"
EXTENSIONS = ROOT / "tools" / "jupyterlab" / "labextensions"   # course-solutions: see its file
STATE = ROOT / "build" / "jupyterlab"          # ignored by git; `make clean` resets it
WORK = ROOT / "my-notebooks"   # the student's copies: ignored by git, never deleted by make
COPIED = ".copied-from.json"   # in WORK: each copy's name -> the course notebook's sha256 then
THREADS = {"OMP_NUM_THREADS": "1"}   # as `make test` runs (tests/test_course.py compares)


def command(uid: int, extra: list[str]) -> tuple[list[str], list[str]]:
    """(argv, notes): the JupyterLab command line for a user id, and what to tell the user."""
    argv = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={WORK}",
            f"--LabApp.default_url=/lab/tree/{FIRST}",
            f"--LabApp.user_settings_dir={STATE / 'user-settings'}",
            f"--LabApp.workspaces_dir={STATE / 'workspaces'}",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            f"--LabApp.extra_labextensions_path={EXTENSIONS}"]
    notes = []
    if uid == 0 and "--allow-root" not in extra:
        argv.append("--allow-root")
        notes.append("running as root (usual in a container): started JupyterLab with "
                     "--allow-root; to reach it from outside the container, publish the port "
                     "and run: make course LAB_ARGS=--ip=0.0.0.0")
    return argv + extra, notes


def install_settings(into: Path = STATE / "user-settings") -> list[Path]:
    """Copy each shipped settings file that the user does not have yet; return those copied."""
    copied = []
    for source in sorted(SHIPPED.rglob("*.jupyterlab-settings")):
        target = into / source.relative_to(SHIPPED)
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
            copied.append(target)
    return copied


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def personal_copy(into: Path = WORK, source: Path = NOTEBOOKS) -> tuple[list[str], list[str]]:
    """Copy each course notebook the student has no copy of into ``into``; return (the names
    copied, a note for each copy whose course notebook has changed since it was copied).
    The student's copies are never overwritten."""
    into.mkdir(parents=True, exist_ok=True)
    record = into / COPIED
    hashes = json.loads(record.read_text()) if record.exists() else {}
    copied, notes = [], []
    for notebook in sorted(source.glob("[0-9][0-9]-*.ipynb")):
        target = into / notebook.name
        if not target.exists():
            copy = nbformat.read(notebook, as_version=4)
            # no py:percent twin for a student's copy: pairing is for the course's authors
            copy.metadata.pop("jupytext", None)
            nbformat.write(copy, target)
            hashes[notebook.name] = _sha256(notebook)
            copied.append(notebook.name)
        elif hashes.get(notebook.name) not in (None, _sha256(notebook)):
            notes.append(f"the course's {notebook.name} has changed since my-notebooks/ got its "
                         f"copy; yours is kept as it is. For the new one, rename yours (e.g. "
                         f"to {notebook.stem}-mine.ipynb) and run make course again")
    record.write_text(json.dumps(hashes, indent=1, sort_keys=True) + "\n")
    return copied, notes


def kernel_environment(environ: dict[str, str]) -> dict[str, str]:
    """``environ`` with the course's thread settings, which JupyterLab passes to its kernels."""
    return {**environ, **THREADS}


if __name__ == "__main__":
    # JupyterLab's own check is the effective user id; Windows has none (never root).
    argv, notes = command(os.geteuid() if hasattr(os, "geteuid") else -1, sys.argv[1:])
    install_settings()
    copied, changed = personal_copy()
    if copied:
        notes.append(f"copied {len(copied)} notebook(s) into my-notebooks/, where your work "
                     f"stays (git ignores it; notebooks/ keeps the course's own versions)")
    notes += changed
    notes.append("kernels run with " + " ".join(f"{k}={v}" for k, v in THREADS.items())
                 + " (as make test)")
    for note in notes:
        print(note, flush=True)
    environment = kernel_environment(dict(os.environ))
    if os.name == "nt":                 # no exec on Windows: wait for JupyterLab instead
        sys.exit(subprocess.call(argv, env=environment))
    os.execve(argv[0], argv, environment)   # JupyterLab takes this process (and Ctrl-C) over
