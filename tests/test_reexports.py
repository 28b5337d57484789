"""No lessonlib module but an ``__init__`` re-exports another: "go to definition" lands on the
definition, never on an import line in a hub.

A name imported into a module (``from x import name``) and never used there, or listed in
its ``__all__``, is a re-export;
an ``__init__`` may do it on purpose (it maps its package). ``ALLOWED`` names the few left,
each with the reason, until their owners import them from the defining module."""
import ast
from pathlib import Path

LESSONLIB = Path(__file__).resolve().parents[1] / "lessonlib"

ALLOWED = {
    "grid.py": ("GridWarning", "Placement", "grid_mesh", "layout_name", "parse_layout",
                "being reshaped into one grid (issue 44, Build item 2)"),
    "moe.py": ("capacity", "aux_loss and the counters are moving (issue 44, Build item 3)"),
    "models.py": ("aux_loss", "re-exports moe.py's layer, which is moving with it"),
    "comm.py": ("Ledger", "nccl_hazards",
                "model_parallel.py, notebook 15 and test_hybrid_axes.py, being edited"),
    "labkit.py": ("add_gpt_flags", "check_number", "check_positive", "gpt_model", "parser",
                  "labs/hybrid.py, being edited"),
    "reshard.py": ("placement", "notebook 10, being edited"),
    "pipeline/schedules.py": ("compute_only", "notebook 04, being edited"),
}


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
