"""The house reads as the lesson: one package per strategy, no import circle, small modules.

Pure: parses every module's source (imports made inside functions count too), starts no
process and imports nothing of lessonlib."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "lessonlib"
MAX_LINES = 300


def _modules() -> dict[str, Path]:
    mods = {}
    for path in sorted(ROOT.rglob("*.py")):
        name = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = path
    return mods


def _imported(module: str, path: Path, node) -> list[str]:
    """The dotted names an import statement reaches, relative imports resolved."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    base = node.module or ""
    if node.level:
        parts = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join(parts + ([base] if base else []))
    return [base] + [f"{base}.{alias.name}" for alias in node.names]


def import_edges() -> dict[str, set[str]]:
    """module -> the lessonlib modules it imports, anywhere in its body. A package's own
    ``__init__`` is not counted as a dependency of its submodules (Python runs it first
    either way)."""
    mods = _modules()
    edges = {m: set() for m in mods}
    for module, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target in _imported(module, path, node):
                while target and target not in mods:
                    target = target.rpartition(".")[0]
                if target and target != module and not module.startswith(target + "."):
                    edges[module].add(target)
    return edges


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import circle as [a, b, ..., a], or None."""
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for n in sorted(edges[m]):
            if state.get(n) == "open":
                return stack[stack.index(n):] + [n]
            if n not in state and (found := visit(n)):
                return found
        stack.pop()
        state[m] = "done"
        return None

    for m in sorted(edges):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_the_checker_finds_a_circle_through_an_import_inside_a_function():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_no_import_circle_in_lessonlib():
    cycle = find_cycle(import_edges())
    assert cycle is None, "import circle: " + " -> ".join(cycle)


@pytest.mark.parametrize("package", ["data_parallel", "tensor_parallel", "pipeline", "costmodel"])
def test_each_strategy_is_a_package_with_a_map(package):
    init = ROOT / package / "__init__.py"
    doc = ast.get_docstring(ast.parse(init.read_text()))
    assert doc, f"{init} has no docstring mapping the package"
    for path in (ROOT / package).glob("*.py"):
        if path.name != "__init__.py":
            assert f"``{path.stem}``" in doc, f"{package}/__init__.py does not map {path.name}"


def test_the_core_reaches_the_bug_switches_not_the_zoo():
    edges = import_edges()
    below = [m for m, targets in edges.items() if "lessonlib.bugzoo" in targets]
    assert set(below) <= {"lessonlib.viz.bugzoo", "lessonlib.exercises.bugzoo"}, below
    assert "lessonlib.launcher" not in edges["lessonlib.comm"]


def test_no_module_is_longer_than_one_sitting():
    long = {str(p.relative_to(ROOT.parent)): n for p in ROOT.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"
