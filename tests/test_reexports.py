"""No lessonlib module but an ``__init__`` re-exports another: "go to definition" lands on the
definition, never on an import line in a hub.

A name imported into a module (``from x import name``) and never used there, or listed in
its ``__all__``, is a re-export;
an ``__init__`` may do it on purpose (it maps its package). ``ALLOWED`` names the few left,
each with the reason, until their owners import them from the defining module."""
import ast
from pathlib import Path

LESSONLIB = Path(__file__).resolve().parents[1] / "lessonlib"

ALLOWED: dict[str, tuple] = {}   # module -> (names..., the reason); none left


def unused_imports(tree: ast.Module) -> set[str]:
    imported, used, exported = set(), set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            used.add(node.id)
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            imported.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "__all__":
            exported.update(getattr(value, "value", None) for value in node.value.elts)
    return (imported - used) | (imported & exported)


def test_no_module_but_an_init_re_exports():
    found = {}
    for path in sorted(LESSONLIB.rglob("*.py")):
        if path.name != "__init__.py":
            unused = unused_imports(ast.parse(path.read_text()))
            if unused:
                found[path.relative_to(LESSONLIB).as_posix()] = unused
    allowed = {module: set(names[:-1]) for module, names in ALLOWED.items()}
    stale = {m: allowed[m] - found.get(m, set()) for m in allowed if allowed[m] - found.get(m, set())}
    extra = {m: names - allowed.get(m, set()) for m, names in found.items()
             if names - allowed.get(m, set())}
    assert not extra, f"re-exports (import them from the defining module instead): {extra}"
    assert not stale, f"allowed but no longer re-exported: drop them from ALLOWED: {stale}"
