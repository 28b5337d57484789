"""Keep each notebook and its reviewable py:percent twin in step, and execute notebooks.

    python tools/notebooks.py build [NAME ...]   # .py -> executed .ipynb (all by default)
    python tools/notebooks.py check              # exit 1 if any pair differs

The .py file is the source of truth; the executed .ipynb is committed so the course reads
well without running it. The twins live in notebooks/py_src/ (jupytext pairing
``ipynb,py_src//py:percent``), so a student's file browser shows each notebook once.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import jupytext
import nbformat
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
TWINS = NOTEBOOKS / "py_src"
PAIRING = "ipynb,py_src//py:percent"   # the jupytext formats every notebook declares


def pairs() -> list[tuple[Path, Path]]:
    return [(py, NOTEBOOKS / f"{py.stem}.ipynb") for py in sorted(TWINS.glob("[0-9][0-9]-*.py"))]


def cells(notebook) -> list[tuple[str, str]]:
    return [(c.cell_type, c.source.strip()) for c in notebook.cells]


def pairing(path: Path) -> str | None:
    return jupytext.read(path).metadata.get("jupytext", {}).get("formats")


def differences() -> list[str]:
    problems = []
    for py, ipynb in pairs():
        if not ipynb.exists():
            problems.append(f"{ipynb.name} is missing (run: python tools/notebooks.py build)")
        elif cells(jupytext.read(py)) != cells(jupytext.read(ipynb)):
            problems.append(f"{py.name} and {ipynb.name} differ "
                            f"(run: python tools/notebooks.py build {py.stem})")
        # Another pairing would make JupyterLab write a second twin next to the .ipynb.
        for path in [p for p in (py, ipynb) if p.exists() and pairing(p) != PAIRING]:
            problems.append(f"{path.name} pairs as {pairing(path)!r}; expected {PAIRING!r}")
    strays = sorted(NOTEBOOKS.glob("[0-9][0-9]-*.py"))
    problems += [f"{py.name} sits next to the notebooks; its place is py_src/" for py in strays]
    return problems


def build(names: list[str]) -> None:
    for py, ipynb in pairs():
        if names and py.stem not in names:
            continue
        print(f"executing {py.name} ...", flush=True)
        nb = jupytext.read(py)
        nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python",
                                     "name": "python3"}
        start = time.perf_counter()
        NotebookClient(nb, timeout=900, kernel_name="python3",
                       resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
        print(f"  {ipynb.name}: Run All took {time.perf_counter() - start:.0f} s", flush=True)
        nbformat.write(nb, ipynb)
        # Jupytext in JupyterLab refuses a pair whose .ipynb is newer than its .py.
        py.touch()


if __name__ == "__main__":
    command, *rest = sys.argv[1:] or ["check"]
    if command in ("-h", "--help"):
        print(__doc__)
    elif command == "build":
        build(rest)
    elif command == "check":
        problems = differences()
        print("\n".join(problems) or "every notebook matches its .py twin")
        sys.exit(1 if problems else 0)
    else:
        sys.exit(__doc__)
