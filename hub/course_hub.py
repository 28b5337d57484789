"""What the class's JupyterHub does at each spawn: the student's own copy of the course, the
course's JupyterLab settings, and the kernels' threads from the CPUs the server may use.

hub/jupyterhub_config.py loads this module; ``give_copy`` is its ``Spawner.pre_spawn_hook``
and ``kernel_threads`` fills the thread variables of ``Spawner.environment``.

Each student works in ``~/course``: on every spawn, each student notebook that is not there
yet is copied in (the first login copies them all; a notebook the student deleted comes
back), and nothing already there is ever written over. The shared environment (the Hub's
own ``.venv``) is only read: the servers and kernels run its Python, and what a student
writes goes to their home.
"""
from __future__ import annotations

import os
import pwd
import sys
from pathlib import Path

from lessonlib.launcher.checks import cores

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import course  # noqa: E402  (tools/course.py: the student's copy, the JupyterLab settings)

FOLDER = "course"                  # each student's copy: ~/course
FIRST = course.FIRST               # the notebook a server opens on
SETTINGS = Path(".jupyter") / "lab" / "user-settings"   # JupyterLab's, under the home
THREADS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def account(spawner):
    """The OS account the user's server runs as (``LocalProcessSpawner``), or None when every
    server runs as the Hub's own account (``SimpleLocalProcessSpawner``, which has a
    ``home_dir`` per user)."""
    return None if getattr(spawner, "home_dir", None) else pwd.getpwnam(spawner.user.name)


def hand_over(paths: list[Path], top: Path, owner) -> None:
    """Give what the Hub (root) made for a user to their account: each path and its folders
    up to ``top`` (nothing above it)."""
    for path in paths:
        for owned in [path, *path.parents]:
            if not owned.is_relative_to(top):
                break
            os.chown(owned, owner.pw_uid, owner.pw_gid)


def give_copy(spawner, source: Path) -> list[Path]:
    """The pre-spawn hook: the notebooks of ``source`` and the course's JupyterLab settings
    that the user does not have yet, copied into their home; returns what was copied."""
    if not source.is_dir() or not any(source.glob("*.ipynb")):
        raise RuntimeError(f"no student notebooks in {source}: run python tools/grade.py "
                           f"release first (make hub does)")
    owner = account(spawner)
    user_home = Path(owner.pw_dir if owner else spawner.home_dir)
    names, _ = course.personal_copy(user_home / FOLDER, source)   # never over their work
    copied = [user_home / FOLDER / name for name in names]
    copied += course.install_settings(user_home / SETTINGS)
    if owner is not None and os.geteuid() == 0:
        hand_over([*copied, user_home / FOLDER / course.COPIED], user_home, owner)
    spawner.log.info("%s: %d files copied into %s", spawner.user.name, len(copied), user_home)
    return copied


def kernel_threads(spawner) -> str:
    """Threads for a server's kernels: the CPUs this Hub may use (``cores()``: affinity and
    the container's CPU quota), at most the spawner's ``cpu_limit`` where the instructor set
    one."""
    threads = cores()
    if spawner.cpu_limit:
        threads = min(threads, max(1, int(spawner.cpu_limit)))
    return str(threads)
