"""The class's grading: student versions out, students' notebooks in, one CSV row per exercise.

    python tools/grade.py release                      # build/class/release: solutions removed
    python tools/grade.py collect --from "/home/{username}/course"
    python tools/grade.py autograde [--notebook 01-why-scale ...]   # build/class/grades.csv

``release`` writes the student version of every notebook: each exercise's solution cell
(tagged ``solution``) is deleted, not hidden, and the answer cell above it (a ``None`` or a
stub, then the checker call on its last line) gets ``course_exercise`` metadata: its id
(``01-why-scale/1``), the checker module the notebook imported as ``ex`` and that call.
The class's JupyterHub (hub/) gives each student a copy of these.

``collect`` copies each student's notebooks from their folder on the Hub (the ``--from``
template, ``{username}`` matched against every folder there) into
build/class/submitted/<username>/; their own files are only read.

``autograde`` runs each collected notebook from its first cell to its last (nbclient, errors
allowed), in a copy under build/class/autograded/<username>/. Right after each answer cell it
runs the course's own checker again, the call taken from the instructor's release, not from
the student's copy, and writes its verdict: one CSV row per student and exercise, with
``grade`` 1 for a correct answer and 0 for anything else (``status`` says which: correct,
not yet, not answered, error, missing).
"""
from __future__ import annotations

import argparse
import csv
import glob
import json
import os
import re
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from lessonlib.launcher.checks import cores

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
CLASS = ROOT / "build" / "class"
RELEASE, SUBMITTED, AUTOGRADED = CLASS / "release", CLASS / "submitted", CLASS / "autograded"
GRADES = CLASS / "grades.csv"
KEY = "course_exercise"            # the answer cell's metadata
MARK = "COURSE-GRADE "             # the line the grading cell prints
COLUMNS = ["student", "notebook", "exercise", "checker", "grade", "status", "verdict"]
STATUS = {True: "correct", False: "not yet", None: "not answered"}
IMPORT = re.compile(r"from lessonlib\.exercises import (\w+) as ex\b")
# The sentence of the full notebooks that points at the hidden solution
HIDDEN = re.compile(r"The\s+solution\s+is\s+hidden\s+under\s+it.*?without\s+touching\s+your\s+cell\.",
                    re.S)


def is_solution(cell) -> bool:
    return "solution" in cell.metadata.get("tags", [])


def student_version(nb, name: str):
    """The notebook without its solution cells, each answer cell labelled (``KEY``)."""
    cells, module, number = [], None, 0
    for cell in nb.cells:
        if cell.cell_type == "code":
            module = (IMPORT.findall(cell.source) or [module])[-1]
        if not is_solution(cell):
            if cell.cell_type == "markdown":
                cell.source = HIDDEN.sub("Your instructor keeps the solutions.", cell.source)
            cells.append(cell)
            continue
        answer = cells[-1]
        if answer.cell_type != "code" or module is None:
            raise ValueError(f"{name}: a solution cell without an answer cell that imports "
                             f"lessonlib.exercises as ex above it")
        number += 1
        answer.metadata[KEY] = {"id": f"{name}/{number}", "module": module,
                                "check": answer.source.strip().splitlines()[-1]}
    nb.cells = cells
    return nb


def release(out: Path = RELEASE, source: Path = NOTEBOOKS) -> list[Path]:
    """Write the student version of every notebook into ``out``; return the paths."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for path in sorted(source.glob("*.ipynb")):
        nb = student_version(nbformat.read(path, as_version=4), path.stem)
        nbformat.write(nb, out / path.name)
        written.append(out / path.name)
    return written


def exercises(nb) -> list[dict]:
    """The ``KEY`` metadata of each answer cell, in order."""
    return [cell.metadata[KEY] for cell in nb.cells if KEY in cell.metadata]


def collect(template: str, into: Path = SUBMITTED) -> dict[str, list[Path]]:
    """Copy every student's notebooks from ``template`` (a path with ``{username}``) into
    ``into/<username>/``; return {username: copies}. A copy collected before is replaced."""
    if "{username}" not in template:
        raise ValueError(f"--from must contain {{username}}, e.g. /home/{{username}}/course; "
                         f"got {template!r}")
    head, tail = (re.escape(part) for part in template.split("{username}", 1))
    collected = {}
    for folder in sorted(glob.glob(template.replace("{username}", "*"))):
        username = re.fullmatch(f"{head}([^/]+){tail}", folder)
        if username is None or not Path(folder).is_dir():
            continue
        username, folder = username.group(1), Path(folder)
        target = into / username
        target.mkdir(parents=True, exist_ok=True)
        collected[username] = [Path(shutil.copy2(nb, target / nb.name))
                               for nb in sorted(folder.glob("*.ipynb"))]
    return collected


def grading_cell(exercise: dict):
    """A cell that runs the released checker call and prints its verdict as one JSON line."""
    call = re.sub(r"^ex\.", "_grade_ex.", exercise["check"])
    return nbformat.v4.new_code_cell(
        f"from lessonlib.exercises import {exercise['module']} as _grade_ex\n"
        f"import json as _grade_json\n"
        f"_grade = {call}\n"
        f"print({MARK!r} + _grade_json.dumps({{'ok': _grade.ok, 'text': _grade.text}}))",
        metadata={"course_grading": exercise["id"]})


def verdicts(executed) -> dict[str, tuple[str, str]]:
    """{exercise id: (status, text)} from the grading cells of an executed notebook."""
    found = {}
    for cell in executed.cells:
        if "course_grading" not in cell.metadata:
            continue
        status, text = "error", "the checker did not run"
        for output in cell.get("outputs", []):
            if output.output_type == "error":
                text = f"{output.ename}: {output.evalue}"
            elif output.output_type == "stream" and MARK in output.text:
                line = output.text.split(MARK, 1)[1].splitlines()[0]
                verdict = json.loads(line)
                status, text = STATUS[verdict["ok"]], verdict["text"]
        found[cell.metadata["course_grading"]] = (status, text)
    return found


def ran(executed) -> set[str]:
    """The ids of the grading cells that executed."""
    return {cell.metadata["course_grading"] for cell in executed.cells
            if "course_grading" in cell.metadata and cell.get("execution_count")}


def grade_notebook(submitted: Path, reference, out: Path, timeout: float, threads: int) -> dict:
    """Run a student's notebook, a grading cell after each answer cell, in a kernel of
    ``threads`` compute threads; return the verdicts."""
    nb = nbformat.read(submitted, as_version=4)
    wanted = {exercise["id"]: exercise for exercise in exercises(reference)}
    cells = []
    for cell in nb.cells:
        if "course_grading" in cell.metadata:
            continue                       # a student's copy never grades itself
        cells.append(cell)
        exercise_id = cell.metadata.get(KEY, {}).get("id")
        if exercise_id in wanted:
            cells.append(grading_cell(wanted[exercise_id]))
    nb.cells = cells
    out.parent.mkdir(parents=True, exist_ok=True)
    client = NotebookClient(nb, timeout=timeout, allow_errors=True, kernel_name="python3",
                            resources={"metadata": {"path": str(out.parent)}})
    failure = None
    try:
        client.execute(env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    except Exception as exc:  # noqa: BLE001  (a cell past --timeout, a kernel that died)
        failure = f"the notebook stopped: {type(exc).__name__}: {exc}".splitlines()[0]
    nbformat.write(nb, out)
    found = verdicts(nb)
    if failure:        # the checkers that never ran say why
        found.update({key: ("error", failure) for key, (status, _) in found.items()
                      if status == "error" and key not in ran(nb)})
    return found


def rows_of(student: Path, name: str, reference, autograded: Path, timeout: float,
            threads: int) -> list[dict]:
    """The CSV rows of one student's notebook ``name``: one per exercise of ``reference``."""
    path = student / f"{name}.ipynb"
    found = (grade_notebook(path, reference, autograded / student.name / path.name, timeout,
                            threads) if path.exists() else {})
    rows = []
    for exercise in exercises(reference):
        status, text = found.get(exercise["id"], ("missing", "no answer cell found"))
        rows.append({"student": student.name, "notebook": name, "exercise": exercise["id"],
                     "checker": exercise["check"].split("(")[0].removeprefix("ex."),
                     "grade": int(status == "correct"), "status": status, "verdict": text})
    return rows


def autograde(submitted: Path = SUBMITTED, reference: Path = RELEASE, csv_path: Path = GRADES,
              notebooks: list[str] | None = None, timeout: float = 600,
              autograded: Path = AUTOGRADED, jobs: int = 1) -> list[dict]:
    """Grade every student under ``submitted`` on each released notebook with exercises
    (or those named), ``jobs`` notebooks at a time; write and return the rows."""
    released = {path.stem: nbformat.read(path, as_version=4)
                for path in sorted(reference.glob("*.ipynb"))
                if notebooks is None or path.stem in notebooks}
    if not released:
        raise ValueError(f"no released notebook to grade in {reference} (run: python "
                         f"tools/grade.py release)")
    # the kernels share the cores: torch's threads spinning against each other's slow all down
    threads = max(1, cores() // jobs)
    students = sorted(p for p in submitted.iterdir() if p.is_dir())
    work = [(student, name) for student in students for name, ref in released.items()
            if exercises(ref)]

    with ThreadPoolExecutor(jobs) as pool:       # each notebook runs in its own kernel
        graded = pool.map(lambda job: rows_of(*job, released[job[1]], autograded, timeout,
                                              threads), work)
        rows = [row for student_rows in graded for row in student_rows]
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    with open(csv_path, "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    return rows


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = p.add_subparsers(dest="command", required=True)
    r = commands.add_parser("release", help="write the student versions")
    r.add_argument("--out", type=Path, default=RELEASE)
    c = commands.add_parser("collect", help="copy the students' notebooks from the Hub")
    c.add_argument("--from", dest="template", required=True,
                   help="each student's folder, e.g. /home/{username}/course")
    c.add_argument("--into", type=Path, default=SUBMITTED)
    a = commands.add_parser("autograde", help="run the checkers on what was collected")
    a.add_argument("--submitted", type=Path, default=SUBMITTED)
    a.add_argument("--release", type=Path, default=RELEASE)
    a.add_argument("--csv", type=Path, default=GRADES)
    a.add_argument("--autograded", type=Path, default=AUTOGRADED,
                   help="where the executed copies go")
    a.add_argument("--notebook", action="append", help="grade only this notebook (repeat)")
    a.add_argument("--timeout", type=float, default=600, help="seconds per cell")
    a.add_argument("--jobs", type=int, default=1, help="notebooks graded at a time, each "
                   "in its own kernel with an equal share of the cores as its threads")
    args = p.parse_args(argv)
    if args.command == "release":
        written = release(args.out)
        print(f"{len(written)} student notebooks in {args.out}")
    elif args.command == "collect":
        collected = collect(args.template, args.into)
        for username, copies in collected.items():
            print(f"{username}: {len(copies)} notebooks")
        print(f"{len(collected)} students collected into {args.into}")
    else:
        rows = autograde(args.submitted, args.release, args.csv, args.notebook, args.timeout,
                         args.autograded, args.jobs)
        right = sum(row["grade"] for row in rows)
        print(f"{right} of {len(rows)} exercises correct; one row each in {args.csv}")


if __name__ == "__main__":
    main(sys.argv[1:])
