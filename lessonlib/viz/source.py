"""Show the library's own code in a notebook: the function a lesson teaches, highlighted.

What it teaches: the student reads the real implementation, not a copy. ``show(obj)`` takes a
function, class or method of lessonlib and displays its source (syntax-highlighted in
JupyterLab, plain text elsewhere) with the file and line it comes from. ``lab(name)`` loads
one of the course's ``labs/*.py`` scripts as a module (its ``main`` does not run), so a
lesson can show a lab's function the same way: ``show(lab("minimal_ddp").main)``.

Laptop:  in a notebook cell, ``from lessonlib.viz.source import show; show(some_function)``
GPU box: the same.
"""
from __future__ import annotations

import importlib.util
import inspect
import textwrap
from pathlib import Path
from types import ModuleType

LABS = Path(__file__).resolve().parents[2] / "labs"


class Source:
    """A piece of source code with where it lives; Jupyter renders it highlighted."""

    def __init__(self, obj):
        self.code = textwrap.dedent(inspect.getsource(obj)).rstrip() + "\n"
        path = Path(inspect.getsourcefile(obj))
        parts = path.parts
        roots = [i for i, part in enumerate(parts) if part in ("lessonlib", "labs")]
        start = roots[-1] if roots else len(parts) - 1
        self.where = f"{'/'.join(parts[start:])}, line {inspect.getsourcelines(obj)[1]}"
        self.lines = self.code.count("\n")

    def __repr__(self) -> str:
        return f"# {self.where}\n{self.code}"

    def _repr_html_(self) -> str:
        from pygments import highlight
        from pygments.formatters import HtmlFormatter
        from pygments.lexers import PythonLexer
        body = highlight(self.code, PythonLexer(), HtmlFormatter(noclasses=True))
        return f"<p><code>{self.where}</code></p>{body}"


class Sources(list):
    """Several pieces shown one after the other."""

    def __repr__(self) -> str:
        return "\n".join(repr(s) for s in self)

    def _repr_html_(self) -> str:
        return "".join(s._repr_html_() for s in self)


def show(*objs) -> Source | Sources:
    """The source of each of ``objs`` (lessonlib functions, classes or methods), to display
    in a cell."""
    sources = Sources(Source(obj) for obj in objs)
    return sources[0] if len(sources) == 1 else sources


def lab(name: str) -> ModuleType:
    """The course's ``labs/<name>.py`` loaded as a module, without running its ``main``."""
    path = LABS / f"{name}.py"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in LABS.glob("*.py")))
        raise ValueError(f"lab({name!r}): there is no labs/{name}.py; the labs are: {known}")
    spec = importlib.util.spec_from_file_location(f"labs.{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
