"""Open the course in JupyterLab the way a student should first see it (``make course``).

    python tools/course.py [JUPYTERLAB OPTION ...]    # what `make course` runs
    make course LAB_ARGS="--ip=0.0.0.0 --port=8888"    # e.g. in a container with a published port

JupyterLab starts in notebooks/ on 01-why-scale.ipynb. The .py twins sit in notebooks/py_src/,
so each notebook is listed once. The course's settings (tools/jupyterlab/user-settings: no news
question, no update check) are copied into build/jupyterlab/ on first use, so what a student
changes later stays there and the repository stays clean. As root (the usual user in a
container) JupyterLab refuses to start without --allow-root; this adds it and says so.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
FIRST = "01-why-scale.ipynb"
SHIPPED = ROOT / "tools" / "jupyterlab" / "user-settings"
STATE = ROOT / "build" / "jupyterlab"          # ignored by git; `make clean` resets it


def command(uid: int, extra: list[str]) -> tuple[list[str], list[str]]:
    """(argv, notes): the JupyterLab command line for a user id, and what to tell the user."""
    argv = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={NOTEBOOKS}",
            f"--LabApp.default_url=/lab/tree/{FIRST}",
            f"--LabApp.user_settings_dir={STATE / 'user-settings'}",
            f"--LabApp.workspaces_dir={STATE / 'workspaces'}",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
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


if __name__ == "__main__":
    # JupyterLab's own check is the effective user id; Windows has none (never root).
    argv, notes = command(os.geteuid() if hasattr(os, "geteuid") else -1, sys.argv[1:])
    install_settings()
    for note in notes:
        print(note, flush=True)
    if os.name == "nt":                 # no exec on Windows: wait for JupyterLab instead
        sys.exit(subprocess.call(argv))
    os.execv(argv[0], argv)             # JupyterLab takes this process (and Ctrl-C) over
