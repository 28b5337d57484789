"""Where a run may write: a folder on a disk, not on one of the kernel's own file systems.

What it teaches: ``os.access`` answers for permissions, not for the file system. To root,
``/proc`` and ``/sys`` say "writable", then refuse every new file, so a check that trusts
``os.access`` lets a run start and fail at its first save. The kernel says which file system
holds a path: the mount that holds it, and that mount's type, are in ``/proc/self/mountinfo``
(the longest mount point that is a prefix of the resolved path). Where that table is not
there (not Linux), the path's place under ``/proc`` or ``/sys`` is the test.

Laptop:  ``python -c "from lessonlib import writable; print(writable.kernel_filesystem('/sys'))"``
GPU box: the same; pure Python.
"""
from __future__ import annotations

import os
from pathlib import Path

MOUNTINFO = Path("/proc/self/mountinfo")
# The kernel's views of itself, where no course file belongs (tmpfs, /dev/shm, is a disk here).
KERNEL = {"proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "debugfs", "tracefs",
          "securityfs", "configfs", "pstore", "bpf", "mqueue", "hugetlbfs", "fusectl",
          "efivarfs", "binfmt_misc", "autofs", "selinuxfs", "nsfs", "rpc_pipefs"}


def _unescape(field: str) -> str:
    """A mount point as mountinfo writes it: space, tab, newline and backslash in octal."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def mounts() -> dict[str, str]:
    """``{mount point: file system type}`` of this process's mounts, {} where unreadable."""
    try:
        lines = MOUNTINFO.read_text().splitlines()
    except OSError:
        return {}
    table = {}
    for line in lines:
        fields, _, rest = line.partition(" - ")
        if len(fields.split()) > 4 and rest:
            table[_unescape(fields.split()[4])] = rest.split()[0]
    return table


def filesystem(path) -> str | None:
    """The type of the file system that holds ``path`` (resolved), or None if unknown."""
    resolved = os.path.realpath(path)
    table = mounts()
    holders = [m for m in table if resolved == m or resolved.startswith(m.rstrip("/") + "/")]
    return table[max(holders, key=len)] if holders else None


def kernel_filesystem(path) -> str | None:
    """The kernel file system ``path`` lies on (``"proc"``, ``"sysfs"``, ...), else None."""
    kind = filesystem(path)
    if kind is not None:
        return kind if kind in KERNEL else None
    top = Path(os.path.realpath(path)).parts[1:2]
    return {("proc",): "proc", ("sys",): "sysfs"}.get(tuple(top))
