"""The house reads as the lesson: one package per strategy, no import circle, one job a module.

Pure: parses every module's source (imports made inside functions count too), starts no
process and imports nothing of lessonlib."""
import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "lessonlib"
LONG = 300        # lines past which a module names its one job in its docstring


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


@pytest.mark.parametrize("package", ["data_parallel", "tensor_parallel", "pipeline", "costmodel",
                                     "precision"])
def test_each_strategy_is_a_package_with_a_map(package):
    init = ROOT / package / "__init__.py"
    doc = ast.get_docstring(ast.parse(init.read_text()))
    assert doc, f"{init} has no docstring mapping the package"
    for path in (ROOT / package).glob("*.py"):
        if path.name != "__init__.py":
            assert f"``{path.stem}``" in doc, f"{package}/__init__.py does not map {path.name}"


def test_the_core_reaches_the_bug_switches_not_the_zoo():
    edges = import_edges()
    below = [m for m, targets in edges.items() if "lessonlib.bug_checks" in targets]
    assert set(below) <= {"lessonlib.viz.bugzoo", "lessonlib.exercises.bugzoo"}, below
    assert "lessonlib.launcher" not in edges["lessonlib.comm"]


def test_each_module_says_its_one_job():
    """One job per module, and size follows the job: every module's docstring says what it
    teaches, and one that runs past LONG lines names the one job that makes it long
    (``One job: ...``), so that a reader knows why before reading it. A line count only asks
    for that sentence; it never chooses where a module is cut (the pipeline's validator was
    cut in three to fit a count once, and passed one schedule back and forth between them)."""
    quiet = [str(p.relative_to(ROOT.parent)) for p in ROOT.rglob("*.py")
             if p.name != "__init__.py" and not ast.get_docstring(ast.parse(p.read_text()))]
    assert not quiet, f"modules whose docstring does not say what they teach: {quiet}"
    long = {str(p.relative_to(ROOT.parent)): n for p in ROOT.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > LONG
            and "One job:" not in (ast.get_docstring(ast.parse(p.read_text())) or "")}
    assert not long, (f"modules over {LONG} lines whose docstring names no one job "
                      f"('One job: ...'): {long}")


def packed_lines(source: str) -> list[int]:
    """Lines that hold two statements (``a = 1; b = 2``), a compound statement with its
    body (``if x: return y``) or an ``if`` written as an expression for its side effects
    (``a() if x else b()``): a module packed to look shorter."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.IfExp):
            out.append(node.lineno)
        for name in ("body", "orelse", "finalbody", "handlers"):
            body = getattr(node, name, None)
            if isinstance(body, list):
                out += [b.lineno for a, b in zip(body, body[1:]) if a.end_lineno == b.lineno]
        if isinstance(node, (ast.If, ast.For, ast.While, ast.With, ast.Try)) \
                and node.body[0].lineno == node.lineno:
            out.append(node.lineno)
    return sorted(out)


def test_the_packing_finder_finds_two_statements_on_a_line():
    assert packed_lines("a = 1; b = 2\nif a:\n    c = 3\nif b: d = 4\n") == [1, 4]
    assert packed_lines("f() if a else g()\nx = f() if a else g()\n") == [1]
    assert packed_lines("x = [i for i in range(3)]\ndef f():\n    return 1\n") == []


def test_no_module_is_packed_into_fewer_lines():
    packed = {str(p.relative_to(ROOT.parent)): lines for p in ROOT.rglob("*.py")
              if (lines := packed_lines(p.read_text()))}
    assert not packed, f"statements packed into one line: {packed}"


# ---------------------------------------------------------------- the floors
README = ROOT.parent / "README.md"

# The README's floors, from the ground up, as data: a module (a top-level module or package
# of lessonlib) imports only modules of its own floor or of the floors below. Each floor is
# keyed by the bold words of its bullet in the README's map, which names every one of its
# modules. A new module is one more name here and in that bullet; a name that does not
# exist (yet) is skipped.
FLOORS = {
    "ground floor": ["costmodel", "models", "data", "device", "baseline", "bug_switches",
                     "argcheck", "writable", "instruments", "layer_split", "references"],
    "infrastructure": ["launcher", "comm", "gloo_cuda", "lab", "grid_layout", "grid"],
    "one package per strategy": ["data_parallel", "model_parallel", "tensor_parallel",
                                 "pipeline", "context_parallel", "expert_parallel",
                                 "precision"],
    "composition": ["hybrid", "long_run", "faults"],
    "faces": ["viz", "exercises", "bug_checks"],
}
# On the strategy floor the lessons come in the course's order, and a strategy builds only on
# those taught before it (or beside it): the assembly line (lesson 03) before pipelines (04).
LESSONS = [["data_parallel"], ["model_parallel"], ["tensor_parallel", "pipeline"],
           ["context_parallel", "expert_parallel"]]
# Breaches known and not yet mended, each with what would mend it (none now: the assembly
# line of lesson 03 cuts its model, draws its timeline and measures its stash with the ground
# floor's ``layer_split`` and instruments, which lesson 04's pipelines build on too).
KNOWN_BREACHES: set[str] = set()


def _top(module: str) -> str:
    return module.split(".")[1] if "." in module else ""


def _rank(name: str, table) -> int | None:
    return next((i for i, group in enumerate(table) if name in group), None)


def floor_breaches(edges, floors=FLOORS, lessons=LESSONS) -> list[str]:
    """Every import that reaches up a floor, or, on the strategy floor, a later lesson."""
    levels = list(floors.values())
    out = []
    for module, targets in sorted(edges.items()):
        for target in sorted(targets):
            a, b = _top(module), _top(target)
            if not a or not b or a == b:
                continue
            if _rank(b, levels) > _rank(a, levels):
                out.append(f"{module} imports {target}, a floor above it")
            elif _rank(a, lessons) is not None and _rank(b, lessons) is not None \
                    and _rank(b, lessons) > _rank(a, lessons):
                out.append(f"{module} imports {target}, a later lesson")
    return out


def test_the_floor_checker_finds_an_import_from_above_and_from_a_later_lesson():
    floors = {"low": ["a", "s", "t"], "high": ["b"]}
    edges = {"lessonlib.a": {"lessonlib.b.x"}, "lessonlib.b.x": {"lessonlib.a"},
             "lessonlib.s": {"lessonlib.t"}}
    assert floor_breaches(edges, floors, [["s"], ["t"]]) == [
        "lessonlib.a imports lessonlib.b.x, a floor above it",
        "lessonlib.s imports lessonlib.t, a later lesson"]


def test_every_module_of_lessonlib_has_a_floor():
    tops = {_top(m) for m in _modules() if _top(m)}
    placed = {name for names in FLOORS.values() for name in names}
    assert not tops - placed, f"modules with no floor in FLOORS: {sorted(tops - placed)}"


def test_each_module_imports_only_its_own_floor_or_lower():
    breaches = set(floor_breaches(import_edges()))
    assert not breaches - KNOWN_BREACHES, "\n".join(sorted(breaches - KNOWN_BREACHES))
    assert not KNOWN_BREACHES - breaches, f"mended, drop from KNOWN_BREACHES: " \
        f"{sorted(KNOWN_BREACHES - breaches)}"


def _readme_map() -> str:
    text = README.read_text()
    start = text.index("`lessonlib/` reads in the course's order")
    return text[start:text.index("\n## ", start)]


def _floor_texts(text: str) -> dict[str, str]:
    """The README map's top-level bullets, keyed by their bold words."""
    parts = text.split("\n- **")[1:]
    return {part.split("**", 1)[0]: part for part in parts}


def test_the_readme_map_places_every_module_on_its_floor():
    texts = _floor_texts(_readme_map())
    assert set(texts) == set(FLOORS), (sorted(texts), sorted(FLOORS))
    missing = []
    for floor, names in FLOORS.items():
        for name in names:
            path = ROOT / name
            token = f"`{name}/`" if path.is_dir() else f"`{name}.py`"
            if (path.is_dir() or path.with_suffix(".py").exists()) and token not in texts[floor]:
                missing.append(f"{token} under {floor}")
    assert not missing, f"the README's map does not name: {missing}"


def test_the_readme_map_or_the_package_map_names_every_file_of_a_package():
    text = _readme_map()
    missing = []
    for init in sorted(ROOT.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        for path in sorted(init.parent.glob("*.py")):
            names = (f"`{path.stem}`", f"`{path.name}`", f"`{init.parent.name}/{path.name}`")
            if path.name != "__init__.py" and not any(n in text for n in names) \
                    and f"``{path.stem}``" not in doc:
                missing.append(str(path.relative_to(ROOT.parent)))
    assert not missing, f"neither the README's map nor the package's map names: {missing}"


# ---------------------------------------------------------------- the cores
# The functions a student reads as the paper's algorithm: about 30 lines at most, and no
# instrument inline (timers, breadcrumbs, the ledger, device marks); what the course measures
# is recorded by ``comm`` or by a recorder the core is handed, a no-op by default. The cores
# are every function a notebook shows with ``show()`` (found in the notebooks' sources, each
# method of a shown class included) and these, which no notebook shows whole.
CORES = {
    "data_parallel/fsdp.py": ["GatherUnit.forward", "GatherUnit.backward",
                              "FullyShardedDataParallel.reduce_scatter"],
    "tensor_parallel/sequence.py": ["_LinearOnGatheredSequence.forward",
                                    "_LinearOnGatheredSequence.backward"],
    "context_parallel/ring.py": ["ring_backward"],
    "expert_parallel/dispatch.py": ["_AllToAll.forward", "_AllToAll.backward",
                                    "post_all_to_all"],
    "expert_parallel/layer.py": ["run_local_experts", "apply_ep"],
    "hybrid/build.py": ["build_stage"],
    "hybrid/trainer.py": ["HybridTrainer.step"],
    "tensor_parallel/parallelize.py": ["apply_tp"],
    "context_parallel/gpt.py": ["apply_cp"],
    "data_parallel/parallelize.py": ["apply_dp"],
}
CORE_LINES = 30
# The instrument modules, by the names a core would call them through (``device.mark``,
# ``time.perf_counter``), and the instrument calls under any name. An attribute, an argument
# or a local variable that only shares a module's name (a stage's ``self.device``, a
# ``device=`` parameter, ``device = torch.device("cpu")``) is not an instrument, and neither
# is asking the device helper where tensors go (``device.current_device()``).
INSTRUMENT_MODULES = {"device", "progress", "breadcrumbs", "ledger", "time"}
INSTRUMENT_CALLS = {"Ledger", "timer", "mark", "perf_counter"}
PLACEMENT = {"current_device"}
# A recorder call: a call of the recorder a core was handed, or of one of its methods.
RECORDERS = {"record", "recorder", "timeline", "clock"}
NOTEBOOK_SOURCES = ROOT.parent / "notebooks" / "py_src"
LABS = ROOT.parent / "labs"


def _function(path: Path, dotted: str):
    scope = ast.parse(path.read_text())
    for name in dotted.split("."):
        scope = next(n for n in scope.body if getattr(n, "name", None) == name)
    return scope


def _module_file(dotted: str) -> Path | None:
    base = ROOT.parent.joinpath(*dotted.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _import_targets(module: str, path: Path, tree) -> dict[str, tuple[str, list[str]]]:
    """name bound by a top-level import of ``tree`` -> (module, attributes under it)."""
    bound = {}
    for node in tree.body:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    bound[alias.asname] = (alias.name, [])
                else:
                    top = alias.name.partition(".")[0]
                    bound[top] = (top, [])
        elif isinstance(node, ast.ImportFrom):
            base = _imported(module, path, node)[0] if module else node.module
            for alias in node.names:
                bound[alias.asname or alias.name] = (base, [alias.name])
    return bound


def _resolve(module: str, attributes: list[str]) -> tuple[Path, str]:
    """Where ``module.attributes`` is defined: (file, dotted name in it), following
    submodules and re-exports (``from .ddp import DataParallel`` in a package's map)."""
    path = _module_file(module)
    if path is None or not attributes:
        raise LookupError(f"{module}.{'.'.join(attributes)} is not a function of lessonlib")
    first, rest = attributes[0], attributes[1:]
    if _module_file(f"{module}.{first}") and path.name == "__init__.py":
        return _resolve(f"{module}.{first}", rest)
    tree = ast.parse(path.read_text())
    if any(getattr(n, "name", None) == first for n in tree.body):
        return path, ".".join(attributes)
    bound = _import_targets(module, path, tree)
    if first not in bound:
        raise LookupError(f"{module} does not define {first}")
    target, under = bound[first]
    return _resolve(target, under + rest)


def shown_in(source: Path) -> list[tuple[Path, str]]:
    """(file, dotted name) of each function or class the notebook shows with ``show()``:
    its arguments read through the notebook's imports (``lab("x").f`` is labs/x.py's f)."""
    tree = ast.parse(source.read_text())
    bound = _import_targets("", source, tree)
    shown = []
    for call in ast.walk(tree):
        if not (isinstance(call, ast.Call) and getattr(call.func, "id", None) == "show"):
            continue
        for arg in call.args:
            parts = []
            while isinstance(arg, ast.Attribute):
                parts.insert(0, arg.attr)
                arg = arg.value
            if isinstance(arg, ast.Call) and getattr(arg.func, "id", None) == "lab":
                shown.append((LABS / f"{arg.args[0].value}.py", ".".join(parts)))
            elif isinstance(arg, ast.Name) and arg.id in bound:
                module, under = bound[arg.id]
                shown.append(_resolve(module, under + parts))
            else:
                raise LookupError(f"{source.name}: cannot read show({ast.unparse(arg)})")
    return shown


@functools.cache
def cores() -> dict[str, tuple[Path, str]]:
    """Every core as "file: dotted name" -> (file, dotted name); a shown class's methods
    each count as one."""
    found = [(ROOT / module, dotted) for module, names in CORES.items() for dotted in names]
    for source in sorted(NOTEBOOK_SOURCES.glob("[0-9][0-9]-*.py")):
        for path, dotted in shown_in(source):
            node = _function(path, dotted)
            if isinstance(node, ast.ClassDef):
                found += [(path, f"{dotted}.{n.name}") for n in node.body
                          if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
            else:
                found.append((path, dotted))
    return {f"{path.relative_to(ROOT.parent)}: {dotted}": (path, dotted)
            for path, dotted in found}


def _calls_recorder(call: ast.Call) -> bool:
    names = {n.id for n in ast.walk(call.func) if isinstance(n, ast.Name)}
    names |= {n.attr for n in ast.walk(call.func) if isinstance(n, ast.Attribute)}
    return bool(names & RECORDERS)


def recorder_calls(fn) -> tuple[int, int]:
    """(recorder calls that scope a phase, as the one item of a ``with``; other recorder
    calls). A core makes at most one recorder call: one in all, or one ``with`` per phase
    (``with record("F"):``), each phase recorded once, never both."""
    scoped = [item.context_expr for w in ast.walk(fn) if isinstance(w, ast.With)
              for item in w.items]
    phases = sum(isinstance(e, ast.Call) and _calls_recorder(e) for e in scoped)
    crowded = [w for w in ast.walk(fn) if isinstance(w, ast.With)
               and sum(isinstance(i.context_expr, ast.Call) and _calls_recorder(i.context_expr)
                       for i in w.items) > 1]
    calls = sum(_calls_recorder(c) for c in ast.walk(fn) if isinstance(c, ast.Call))
    return phases, calls - phases + 2 * len(crowded)


def core_problems(fn) -> list[str]:
    """What keeps the function ``fn`` (an ast node) from being a core; [] if nothing."""
    problems = []
    first = min([d.lineno for d in fn.decorator_list] + [fn.lineno])
    if fn.end_lineno - first + 1 > CORE_LINES:
        problems.append(f"is {fn.end_lineno - first + 1} lines long (at most {CORE_LINES})")
    local = {a.arg for a in ast.walk(fn.args) if isinstance(a, ast.arg)}
    local |= {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)
              and isinstance(n.ctx, ast.Store)}
    placed = {id(n.value) for n in ast.walk(fn) if isinstance(n, ast.Attribute)
              and n.attr in PLACEMENT and isinstance(n.value, ast.Name)}
    names = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and id(n) not in placed}
    attributes = {n.attr for n in ast.walk(fn) if isinstance(n, ast.Attribute)}
    used = (names - local) & (INSTRUMENT_MODULES | INSTRUMENT_CALLS)
    used |= attributes & INSTRUMENT_CALLS
    if used:
        problems.append(f"calls {sorted(used)}")
    phases, others = recorder_calls(fn)
    if others + (phases > 0) > 1:
        problems.append(f"makes {others} recorder call(s) beside {phases} phase(s)")
    return problems


def test_the_recorder_count_reads_phases_and_other_calls():
    fn = ast.parse("def f(x, record):\n    with record('F'):\n        y = x + 1\n"
                   "    with record('B'):\n        y.backward()\n").body[0]
    assert recorder_calls(fn) == (2, 0)
    fn = ast.parse("def f(self):\n    self.recorder.start()\n    with self.recorder.span():\n"
                   "        pass\n").body[0]
    assert recorder_calls(fn) == (1, 1)


def test_the_core_rule_tells_an_instrument_from_a_name_it_shares():
    fn = ast.parse("def f(x):\n    device = torch.device('cpu')\n"
                   "    return x.to(device)\n").body[0]
    assert core_problems(fn) == []
    fn = ast.parse("def f(x):\n    return x.to(device.current_device())\n").body[0]
    assert core_problems(fn) == []
    fn = ast.parse("def f(x):\n    t = time.perf_counter()\n    device.mark()\n").body[0]
    assert core_problems(fn) == ["calls ['device', 'mark', 'perf_counter', 'time']"]


def test_the_shown_functions_are_found_through_imports_and_re_exports(tmp_path):
    source = tmp_path / "nb.py"
    source.write_text("from lessonlib.data_parallel import DataParallel\n"
                      "from lessonlib.pipeline import schedules as s\nimport lessonlib\n"
                      "show(DataParallel._finish, s.one_f_one_b_order)\n"
                      "show(lab('minimal_ddp').main)\n")
    assert [(p.relative_to(ROOT.parent).as_posix(), d) for p, d in shown_in(source)] == [
        ("lessonlib/data_parallel/ddp.py", "DataParallel._finish"),
        ("lessonlib/pipeline/schedules.py", "one_f_one_b_order"),
        ("labs/minimal_ddp.py", "main")]


@pytest.mark.parametrize("core", sorted(cores()))
def test_each_core_is_short_and_free_of_instruments(core):
    path, dotted = cores()[core]
    problems = core_problems(_function(path, dotted))
    assert not problems, f"{core} " + "; ".join(problems)
