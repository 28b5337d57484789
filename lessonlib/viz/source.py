"""Show the library's own code in a notebook: the function a lesson teaches, highlighted.

What it teaches: the student reads the real implementation, not a copy. ``show(obj)`` takes a
function, class or method of lessonlib and displays its source (syntax-highlighted in
JupyterLab, plain text elsewhere) with the file and line it comes from.

Laptop:  in a notebook cell, ``from lessonlib.viz.source import show; show(some_function)``
GPU box: the same.
"""
from __future__ import annotations

import inspect
import textwrap
from pathlib import Path


class Source:
    """A piece of source code with where it lives; Jupyter renders it highlighted."""

    def __init__(self, obj):
        self.code = textwrap.dedent(inspect.getsource(obj)).rstrip() + "\n"
        path = Path(inspect.getsourcefile(obj))
        parts = path.parts
        start = parts.index("lessonlib") if "lessonlib" in parts else len(parts) - 1
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
