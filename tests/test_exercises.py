"""The exercises a student meets: every one has a stub, Run All never overwrites the stub with
the solution, and every checker speaks with one voice (a ``Verdict``, never a print).

Read from the notebooks' .py twins (the cells) and the executed .ipynb files (the outputs a
student sees on opening the course). Pure: nothing here starts a rank.
"""
from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
import sys
from pathlib import Path

import nbformat
import pytest

import lessonlib.exercises
from lessonlib.exercises.verdict import Verdict

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import notebooks  # noqa: E402  (tools/notebooks.py)

CHECK_CALL = re.compile(r"\bex\.(check_\w+)\(")


def _exercise_cells(py):
    """(stub, solution) pairs of code cells, with their positions in the notebook."""
    import jupytext
    nb = jupytext.read(py)
    code = [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    pairs = []
    for k, (i, cell) in enumerate(code):
        if "solution" in cell.metadata.get("tags", []):
            pairs.append((code[k - 1] if k else (None, None), (i, cell)))
    return nb, pairs


def _bound_names(source: str) -> set[str]:
    """Names a cell binds at its top level (assignments, defs, imports, for targets)."""
    names = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        else:
            for sub in ast.walk(node):
                if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                    names.add(sub.id)
    return names


def _text(outputs) -> str:
    parts = []
    for out in outputs:
        parts.append(out.get("text", ""))
        parts.append(out.get("data", {}).get("text/plain", ""))
    return "".join(parts)


PAIRS = notebooks.pairs()


@pytest.mark.parametrize("py, ipynb", PAIRS, ids=[py.stem[:2] for py, _ in PAIRS])
def test_every_exercise_has_a_stub_that_the_solution_leaves_alone(py, ipynb):
    nb, pairs = _exercise_cells(py)
    executed = nbformat.read(ipynb, as_version=4)
    student_names = set()
    for cell in nb.cells:
        if cell.cell_type == "code" and "solution" not in cell.metadata.get("tags", []):
            student_names |= _bound_names(cell.source)
    for (s_at, stub), (at, solution) in pairs:
        where = f"{py.name}, solution cell {at}"
        checks = CHECK_CALL.findall(solution.source)
        assert checks, f"{where} calls no ex.check_*"
        assert stub is not None and "solution" not in stub.metadata.get("tags", []), \
            f"{where} has no stub cell before it"
        assert CHECK_CALL.findall(stub.source)[-1:] == checks[-1:], \
            f"{where}: the cell before it does not call {checks[-1]} (the student's stub)"
        clash = _bound_names(solution.source) & student_names
        assert not clash, f"{where} overwrites the student's {sorted(clash)} in Run All"
        # What a student sees: the stub says "your turn", the solution "correct".
        assert "✏️ Your turn" in _text(executed.cells[s_at].outputs), f"{where}: stub output"
        assert "✅ Correct" in _text(executed.cells[at].outputs), f"{where}: solution output"


def _checkers():
    for info in pkgutil.iter_modules(lessonlib.exercises.__path__):
        module = importlib.import_module(f"lessonlib.exercises.{info.name}")
        for name, fn in inspect.getmembers(module, inspect.isfunction):
            if name.startswith("check_") and fn.__module__ == module.__name__:
                yield f"{info.name}.{name}", fn


CHECKERS = dict(_checkers())


@pytest.mark.parametrize("name", sorted(CHECKERS))
def test_every_checker_says_your_turn_to_an_untouched_stub(name, capsys):
    fn = CHECKERS[name]
    required = [p for p in inspect.signature(fn).parameters.values()
                if p.default is inspect.Parameter.empty]
    verdict = fn(*[None] * len(required))
    assert isinstance(verdict, Verdict) and verdict.ok is None, verdict
    assert "Your turn" in str(verdict)
    assert capsys.readouterr().out == "", "a checker returns its verdict; it does not print"


def test_verdict_reads_the_same_everywhere():
    assert str(Verdict(True, "x")) == "✅ Correct: x" and Verdict(True, "x")
    assert str(Verdict(False, "x")) == "❌ Not yet: x" and not Verdict(False, "x")
    assert str(Verdict(None, "x")) == "✏️ Your turn: x" and not Verdict(None, "x")
    with pytest.raises(ValueError, match="ok must be"):
        Verdict("yes", "x")


def test_lesson_01_checkers_name_the_slip():
    from lessonlib.exercises import scale
    usable = scale.usable_memory_bytes(scale.GPUS["A100-80GB"])       # 85.1 GB of 85.9
    assert scale.check_largest_model(usable / 16) and not scale.check_largest_model(40e9)
    assert "only the 16-bit weights" in scale.check_largest_model(usable / 2)
    assert "usable" in scale.check_largest_model(5e9) and not scale.check_largest_model(5e9)
    assert scale.check_min_gpus(33) and "round up" in scale.check_min_gpus(32)
    assert not scale.check_min_gpus(35)
    assert scale.check_gpus_for_days(4961)
    assert "round up" in scale.check_gpus_for_days(4960.3)
    assert "6PD" in scale.check_gpus_for_days(3720)
    assert "units" in scale.check_gpus_for_days(4960.3 / 86400)


def test_lesson_12_ring_speedup_is_2c_minus_1_over_c_and_names_the_slip():
    from lessonlib.exercises import context
    for c in (2, 4, 8):      # contiguous (c - 1/2) n^2 over zig-zag's c n^2 / 2
        assert context.ring_time_ratio(c) == pytest.approx((2 * c - 1) / c, rel=0.01)
    assert context.check_ring_speedup(15 / 8)
    assert "last rank's work over the first's" in context.check_ring_speedup(15)
    assert "limit for many ranks" in context.check_ring_speedup(2)


def test_lesson_16_dualpipev_bubble_is_the_played_schedule_and_names_the_slip():
    from lessonlib.exercises import dualpipe
    assert dualpipe.played_idle(4, 1.0, 2.0, 1.0, 2.5) == pytest.approx(4.5)   # section 6's row
    assert dualpipe.check_dualpipev_bubble(9.0) and not dualpipe.check_dualpipev_bubble(7)
    assert "hides nothing" in dualpipe.check_dualpipev_bubble(10.0)
    assert "two per device" in dualpipe.check_dualpipev_bubble(3.6)
    assert "1F1B" in dualpipe.check_dualpipev_bubble(33)


@pytest.mark.timeout(120)
def test_bug_zoo_prediction_is_checked_against_the_real_bug():
    from lessonlib.exercises import bugzoo
    assert bugzoo.check_wrong_microbatch_prediction([1, 1, 0])
    assert "what correct DDP sends" in bugzoo.check_wrong_microbatch_prediction([0, 0, 1])
    assert not bugzoo.check_wrong_microbatch_prediction("soon")


SOLUTION_LABEL = "# Solution (click to open)"   # the first line: what a folded solution shows


def folding_problems(nb, where: str) -> list[str]:
    """What gives a solution away in ``nb``: one not folded (source and output, the cell's
    ``jupyter`` metadata), one without the label a folded cell shows, or one that comes
    before the student's answer cell. Also run on what a real browser saved after Run All
    (tests/test_browser.py)."""
    problems = []
    for at, cell in enumerate(nb.cells):
        if "solution" not in cell.metadata.get("tags", []):
            continue
        folded = cell.metadata.get("jupyter", {})
        if not (folded.get("source_hidden") and folded.get("outputs_hidden")):
            problems.append(f"{where}, cell {at}: a solution must hide its source and its output")
        if "hide-output" not in cell.metadata["tags"]:
            problems.append(f"{where}, cell {at}: tag hide-output")
        if cell.source.splitlines()[:1] != [SOLUTION_LABEL]:
            problems.append(f"{where}, cell {at}: a solution's first line is {SOLUTION_LABEL!r}, "
                            f"what JupyterLab shows while it is folded")
        answer = next((c for c in reversed(nb.cells[:at]) if c.cell_type == "code"), None)
        if answer is None or "solution" in answer.metadata.get("tags", []):
            problems.append(f"{where}, cell {at}: the student's answer cell comes first")
    return problems


@pytest.mark.parametrize("py, ipynb", PAIRS, ids=[py.stem[:2] for py, _ in PAIRS])
def test_every_solution_is_hidden_source_and_output_until_opened(py, ipynb):
    """A solution's code and its output ("Correct: 5.0 B") stay folded in JupyterLab (the
    cell's ``jupyter`` metadata; tools/jupyterlab/labextensions/course-solutions keeps them
    folded when the cell runs) and on the static site (``<details>``, by the tag) until the
    student opens them: an answer printed under the empty cell would give it away."""
    for nb, where in ((_exercise_cells(py)[0], py.name), (nbformat.read(ipynb, 4), ipynb.name)):
        assert folding_problems(nb, where) == []
