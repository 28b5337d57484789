"""Results come back as records: no notebook or lab reads a lessonlib result by a string key.

Static, so it costs no run: each notebook's source (``notebooks/py_src``) and each lab
(``labs/*.py``) is read in order,
statement by statement. A name is tied to the lessonlib function whose call it was bound
from (``rows = schedule_runs.summarize(...)``; ``lessonlib.launch(schedule_runs.rank_parity,
...)`` ties it to ``schedule_runs.rank_parity``, what each rank returned), and the tie passes on to what is taken out of it
(``rows[0]``, ``for r in rows``, ``next(r for r in rows ...)``, ``(a,) = ...``) until the name
is bound to something else. A string subscript of a tied name (``r["step_time_s"]``) means the
function handed back a dict where a caller wanted a field: a renamed key would then fail only
when the notebook runs. Each function so read is a failure unless ``KEYED`` says why its
result is keyed by design (a file format read back, a table keyed by data)."""
import ast
import functools
from pathlib import Path

import pytest

from test_layout import LABS, NOTEBOOK_SOURCES, _import_targets

# Results whose string keys are data or a file format, not field names; and the areas that
# other work of this round rewrites (they follow when it lands).
KEYED = {
    "lessonlib.data.stored": "a lab's JSON record read back from data/: the file's format",
    "lessonlib.viz.mp.load_table": "a stored JSON table: the file's format",
    "lessonlib.data_parallel.ladder_runs.step_timeline": "keyed by the rungs the caller names",
    "lessonlib.viz.scale.one_gpu_memory": "bytes by part, the parts the plots iterate over "
                                          "(the memory model's record, as its as_dict)",
}
KEYED_AREAS = {}
KEYED_BY_DATA = "{data}:"
SEQUENCE_CALLS = {"next", "max", "min", "sorted", "list", "reversed", "iter"}


class _Reader(ast.NodeVisitor):
    """Walks one notebook in order; ``found`` collects (line, function, key)."""

    def __init__(self, bound: dict):
        self.bound, self.tied, self.found = bound, {}, []
        self.keys = {}       # a loop's name over string constants -> the first of them

    def _function(self, node) -> str | None:
        parts = []
        while isinstance(node, ast.Attribute):
            parts.insert(0, node.attr)
            node = node.value
        if isinstance(node, ast.Name) and node.id in self.bound:
            module, under = self.bound[node.id]
            if module.split(".")[0] == "lessonlib":
                return ".".join([module, *under, *parts])
        return None

    def origin(self, expr) -> str | None:
        """The lessonlib function whose result ``expr`` is, or a part of; None if none. A
        dict the notebook builds of results (``{name: f(name) for ...}``) is tied as
        ``KEYED_BY_DATA + function``: its own keys are data, its values the results."""
        if isinstance(expr, ast.Name):
            return self.tied.get(expr.id)
        if isinstance(expr, ast.Subscript):
            origin = self.origin(expr.value)
            return origin.removeprefix(KEYED_BY_DATA) if origin else None
        if isinstance(expr, (ast.GeneratorExp, ast.ListComp)):
            first = expr.generators[0]       # (r for r in rows ...): items of rows
            if isinstance(expr.elt, ast.Name) and expr.elt.id in _targets(first.target):
                return self.origin(first.iter)
            return self._call(expr.elt)      # [f(x) for x in ...]: a list of f's results
        if isinstance(expr, ast.DictComp):
            value = self._call(expr.value)
            return KEYED_BY_DATA + value if value else None
        if isinstance(expr, (ast.List, ast.Tuple)):
            found = {self._call(e) for e in expr.elts}
            return found.pop() if len(found) == 1 else None
        return self._call(expr)

    def _call(self, expr) -> str | None:
        if not isinstance(expr, ast.Call):
            return None
        if isinstance(expr.func, ast.Name) and expr.func.id in SEQUENCE_CALLS and expr.args:
            return self.origin(expr.args[0])
        function = self._function(expr.func)
        if function and function.rsplit(".", 1)[-1] == "launch" and expr.args:
            return self._function(expr.args[0])     # what each rank's function returned
        return function

    def bind(self, target, origin, over=None):
        names = (over.elts if isinstance(over, (ast.Tuple, ast.List)) else [])
        if isinstance(target, ast.Name) and names and all(
                isinstance(n, ast.Constant) and isinstance(n.value, str) for n in names):
            self.keys[target.id] = names[0].value          # for k in ("a", "b"): r[k]
        for name in _targets(target):
            if origin:
                self.tied[name] = origin
            else:
                self.tied.pop(name, None)

    def visit_Assign(self, node):
        self.visit(node.value)
        for target in node.targets:
            self.bind(target, self.origin(node.value))

    def visit_AnnAssign(self, node):
        if node.value is not None:
            self.visit(node.value)
            self.bind(node.target, self.origin(node.value))

    def visit_For(self, node):
        self.visit(node.iter)
        self.bind(node.target, self.origin(node.iter), node.iter)
        for statement in node.body + node.orelse:
            self.visit(statement)

    def _comprehension(self, node, parts):
        saved = dict(self.tied)
        for generator in node.generators:
            self.visit(generator.iter)
            self.bind(generator.target, self.origin(generator.iter), generator.iter)
            for condition in generator.ifs:
                self.visit(condition)
        for part in parts:
            self.visit(part)
        self.tied = saved

    def visit_ListComp(self, node):
        self._comprehension(node, [node.elt])

    visit_SetComp = visit_GeneratorExp = visit_ListComp

    def visit_DictComp(self, node):
        self._comprehension(node, [node.key, node.value])

    def visit_FunctionDef(self, node):
        saved = dict(self.tied)        # a function's names are its own
        self.generic_visit(node)
        self.tied = saved

    def visit_Lambda(self, node):
        saved = dict(self.tied)
        for name in [a.arg for a in node.args.args]:
            self.tied.pop(name, None)
        self.generic_visit(node)
        self.tied = saved

    def visit_Subscript(self, node):
        key = node.slice
        if isinstance(key, ast.Name) and key.id in self.keys:
            key = ast.Constant(self.keys[key.id])
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            origin = self.origin(node.value)
            if origin and not origin.startswith(KEYED_BY_DATA):
                self.found.append((node.lineno, origin, key.value))
        self.generic_visit(node)


def _targets(target) -> list[str]:
    return [n.id for n in ast.walk(target) if isinstance(n, ast.Name)]


def keyed_reads(source: Path) -> list[tuple[int, str, str]]:
    """(line, lessonlib function, key) for each string key a notebook reads from a result."""
    tree = ast.parse(source.read_text())
    reader = _Reader(_import_targets("", source, tree))
    for statement in tree.body:
        reader.visit(statement)
    return reader.found


def _excused(function: str) -> bool:
    return function in KEYED or any(function.startswith(a) for a in KEYED_AREAS)


@functools.cache
def _reads() -> dict[str, list[str]]:
    """lessonlib function -> "notebook or lab:line ['key']" for each read not excused."""
    reads = {}
    for source in sorted(NOTEBOOK_SOURCES.glob("[0-9][0-9]-*.py")) + sorted(LABS.glob("*.py")):
        for line, function, key in keyed_reads(source):
            if not _excused(function):
                reads.setdefault(function, []).append(f"{source.stem}:{line} [{key!r}]")
    return reads


def test_the_reader_follows_a_result_into_rows_loops_and_launches(tmp_path):
    source = tmp_path / "nb.py"
    source.write_text(
        "import lessonlib\nfrom lessonlib.pipeline import schedule_runs\n"
        "rows = schedule_runs.summarize(lessonlib.launch(schedule_runs.measure, 2))\n"
        "best = next(r for r in rows if r['m'] == 4)\n"
        "for r in rows:\n    print(r['bubble_mean'])\n"
        "per_rank = lessonlib.launch(schedule_runs.rank_parity, 2, [])\n"
        "x = per_rank[0]['stash']\n"
        "rows = {'mine': 1}\nrows['mine']\n"
        "print(best.step_time_s, [r.m for r in schedule_runs.summarize([])])\n"
        "why = {n: schedule_runs.explain_bubble([], n) for n in 'ab'}\nwhy['a']['theory']\n"
        "pair = [schedule_runs.theory('gpipe', 2, 4, 1, 'wall') for _ in 'ab']\npair[0]['x']\n"
        "print(max(r[k] for r in schedule_runs.summarize([]) for k in ('m', 'v')))\n")
    assert keyed_reads(source) == [
        (4, "lessonlib.pipeline.schedule_runs.summarize", "m"),
        (6, "lessonlib.pipeline.schedule_runs.summarize", "bubble_mean"),
        (8, "lessonlib.pipeline.schedule_runs.rank_parity", "stash"),
        (13, "lessonlib.pipeline.schedule_runs.explain_bubble", "theory"),
        (15, "lessonlib.pipeline.schedule_runs.theory", "x"),
        (16, "lessonlib.pipeline.schedule_runs.summarize", "m")]


@pytest.mark.parametrize("area", sorted(KEYED_AREAS) + sorted(KEYED))
def test_each_excuse_names_something_that_exists(area):
    from test_layout import _module_file
    dotted = area.rstrip(".")
    assert _module_file(dotted) or _module_file(dotted.rpartition(".")[0]), area


def test_no_notebook_or_lab_reads_a_lessonlib_result_by_a_string_key():
    reads = _reads()
    assert not reads, "lessonlib results read by key (return a dataclass instead): " + \
        "; ".join(f"{f}: {', '.join(sites[:3])}" for f, sites in sorted(reads.items()))
