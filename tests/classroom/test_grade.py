"""The instructor's grading path, end to end, with the commands of docs/instructor.md: student
versions released without their solutions, two students' work collected from their Hub
folders (one right, one wrong), autograded by the course's own checkers into a CSV; a
notebook that hangs, or one never handed in, is a row of its own, not the end of grading."""
import csv
import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import grade  # noqa: E402  (tools/grade.py)

GRADE = [sys.executable, str(ROOT / "tools" / "grade.py")]
NOTEBOOK = "01-why-scale"
RIGHT = {
    "my_params = None": 'my_params = cm.usable_memory_bytes(cm.GPUS["A100-80GB"]) / 16',
    "my_gpus = None": "import math\nmy_gpus = math.ceil(16 * cm.MODELS['gpt3-175B'].params() / "
                      "cm.usable_memory_bytes(cm.GPUS['A100-80GB']))",
    "my_n = None": "my_n = math.ceil(8 * 300e9 * 175e9 / (140e12 * 7 * 86400))",
}
# the wrong student: a wrong number, a question left as it was, and a forged verdict
WRONG = {
    "my_params = None": "my_params = 80e9 / 16",
    "my_n = None": 'my_n = 1024\nprint(\'COURSE-GRADE {"ok": true, "text": "forged"}\')',
}


def run(*args) -> str:
    done = subprocess.run([*GRADE, *map(str, args)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return done.stdout


def answer(release: Path, folder: Path, answers: dict) -> None:
    """A student's copy of the notebook from the Hub, with ``answers`` typed in."""
    nb = nbformat.read(release / f"{NOTEBOOK}.ipynb", as_version=4)
    for cell in nb.cells:
        for stub, typed in answers.items():
            cell.source = cell.source.replace(stub, typed)
    folder.mkdir(parents=True)
    nbformat.write(nb, folder / f"{NOTEBOOK}.ipynb")


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> Path:
    """The student versions of every notebook, as ``python tools/grade.py release`` writes them."""
    folder = tmp_path_factory.mktemp("release")
    count = len(list((ROOT / "notebooks").glob("*.ipynb")))
    assert f"{count} student notebooks in {folder}" in run("release", "--out", folder)
    return folder


def test_student_versions_hold_no_solution(release):
    for full in sorted((ROOT / "notebooks").glob("*.ipynb")):
        original = nbformat.read(full, as_version=4)
        student = nbformat.read(release / full.name, as_version=4)
        solutions = [c.source for c in original.cells if "solution" in c.metadata.get("tags", [])]
        text = json.dumps([c.source for c in student.cells])
        assert not [c for c in student.cells if "solution" in c.metadata.get("tags", [])]
        assert not [s for s in solutions if json.dumps(s)[1:-1] in text], full.name
        assert "hidden under it" not in text, full.name
        labelled = [c for c in student.cells if "course_exercise" in c.metadata]
        assert len(labelled) == len(solutions)
        assert len(student.cells) == len(original.cells) - len(solutions)


@pytest.mark.timeout(300)
def test_collected_work_is_autograded_into_a_csv(release, tmp_path):
    homes, submitted = tmp_path / "home", tmp_path / "submitted"
    answer(release, homes / "ann" / "course", RIGHT)
    answer(release, homes / "ben" / "course", WRONG)
    assert "2 students collected" in run("collect", "--from", f"{homes}/{{username}}/course",
                                         "--into", submitted)
    grades = tmp_path / "grades.csv"
    printed = run("autograde", "--submitted", submitted, "--release", release, "--csv", grades,
                  "--autograded", tmp_path / "autograded", "--notebook", NOTEBOOK, "--jobs", 2)
    assert "3 of 6 exercises correct" in printed
    rows = list(csv.DictReader(grades.open()))
    table = {(r["student"], r["exercise"]): (r["checker"], r["grade"], r["status"]) for r in rows}
    assert table == {
        ("ann", f"{NOTEBOOK}/1"): ("check_largest_model", "1", "correct"),
        ("ann", f"{NOTEBOOK}/2"): ("check_min_gpus", "1", "correct"),
        ("ann", f"{NOTEBOOK}/3"): ("check_gpus_for_days", "1", "correct"),
        ("ben", f"{NOTEBOOK}/1"): ("check_largest_model", "0", "not yet"),
        ("ben", f"{NOTEBOOK}/2"): ("check_min_gpus", "0", "not answered"),
        ("ben", f"{NOTEBOOK}/3"): ("check_gpus_for_days", "0", "not yet"),
    }
    assert all(r["verdict"] and r["verdict"] != "forged" for r in rows)
    # the students' own files are only read
    assert (homes / "ben" / "course" / f"{NOTEBOOK}.ipynb").read_text().count("forged") == 1


@pytest.mark.timeout(120)
def test_a_notebook_that_hangs_or_is_missing_is_graded_not_fatal(tmp_path):
    answer_cell = nbformat.v4.new_code_cell(
        "from lessonlib.exercises import scale as ex\nmy_params = 1\nex.check_largest_model(my_params)",
        metadata={grade.KEY: {"id": "quiz/1", "module": "scale",
                              "check": "ex.check_largest_model(my_params)"}})
    (tmp_path / "release").mkdir()
    nbformat.write(nbformat.v4.new_notebook(cells=[answer_cell]), tmp_path / "release" / "quiz.ipynb")
    hangs = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import time\ntime.sleep(600)"),
                                            answer_cell])
    (tmp_path / "submitted" / "cat").mkdir(parents=True)
    (tmp_path / "submitted" / "dan").mkdir()          # dan handed nothing in
    nbformat.write(hangs, tmp_path / "submitted" / "cat" / "quiz.ipynb")
    rows = grade.autograde(tmp_path / "submitted", tmp_path / "release", tmp_path / "grades.csv",
                           timeout=5, autograded=tmp_path / "autograded")
    assert [(r["student"], r["grade"], r["status"]) for r in rows] == [
        ("cat", 0, "error"), ("dan", 0, "missing")]
    assert "CellTimeoutError" in rows[0]["verdict"]
