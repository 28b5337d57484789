"""What a student sees on opening the course (no browser needed): each notebook listed once,
JupyterLab's pairing points at py_src/, no news pop-up, `make course` opens as root too, in
the student's own copy of the notebooks, with the thread settings of `make test`."""
import json
import subprocess
import sys
from pathlib import Path

import json5
import nbformat
from jupytext.paired_paths import paired_paths
from jupyterlab.commands import get_app_dir

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

import course  # noqa: E402  (tools/course.py)
import notebooks  # noqa: E402  (tools/notebooks.py)

NOTIFICATION = "@jupyterlab/apputils-extension/notification.jupyterlab-settings"


def test_the_notebook_folder_lists_each_notebook_once():
    listed = sorted(p.name for p in (ROOT / "notebooks").iterdir() if not p.name.startswith("."))
    ipynbs = [n for n in listed if n.endswith(".ipynb")]
    assert ipynbs and [n for n in listed if n.endswith(".py")] == []
    assert sorted(py.stem for py, _ in notebooks.pairs()) == [n[:-6] for n in ipynbs]


def test_jupytext_pairs_each_notebook_with_its_twin_in_py_src():
    for py, ipynb in notebooks.pairs():
        for path in (py, ipynb):
            assert notebooks.pairing(path) == "ipynb,py_src//py:percent", path.name
        twins = paired_paths(str(ipynb), "ipynb", notebooks.PAIRING)
        assert [Path(p) for p, _ in twins] == [ipynb, py]


def test_shipped_settings_silence_the_news_question_and_update_check():
    settings = json5.loads((course.SHIPPED / NOTIFICATION).read_text())
    assert settings == {"fetchNews": "false", "checkForUpdates": False}
    # Both keys exist in this JupyterLab's own schema for the plugin, so neither is ignored.
    schema = Path(get_app_dir()) / "schemas" / NOTIFICATION.replace(".jupyterlab-settings", ".json")
    known = json.loads(schema.read_text())["properties"]
    assert set(settings) <= set(known)
    assert {"const": "false", "title": "Never"} in known["fetchNews"]["oneOf"]


def test_settings_are_copied_once_and_a_students_changes_are_kept(tmp_path):
    assert [p.relative_to(tmp_path).as_posix() for p in course.install_settings(tmp_path)] \
        == [NOTIFICATION]
    (tmp_path / NOTIFICATION).write_text('{"fetchNews": "true"}')
    assert course.install_settings(tmp_path) == []
    assert json5.loads((tmp_path / NOTIFICATION).read_text()) == {"fetchNews": "true"}


def test_command_opens_the_first_notebook_with_the_course_settings():
    argv, notes = course.command(uid=1000, extra=["--port=9999"])
    assert argv[:3] == [sys.executable, "-m", "jupyterlab"] and argv[-1] == "--port=9999"
    assert f"--ServerApp.root_dir={ROOT / 'my-notebooks'}" in argv
    assert "--LabApp.default_url=/lab/tree/01-why-scale.ipynb" in argv
    assert (ROOT / "notebooks" / "01-why-scale.ipynb").exists()
    assert f"--LabApp.user_settings_dir={course.STATE / 'user-settings'}" in argv
    assert f"--LabApp.extra_labextensions_path={course.EXTENSIONS}" in argv
    assert (course.EXTENSIONS / "course-solutions" / "static" / "remoteEntry.js").exists()
    assert "--allow-root" not in argv and notes == []


def test_as_root_the_course_adds_allow_root_and_says_so():
    argv, notes = course.command(uid=0, extra=[])
    assert argv.count("--allow-root") == 1 and "--allow-root" in notes[0]
    argv, notes = course.command(uid=0, extra=["--allow-root"])
    assert argv.count("--allow-root") == 1 and notes == []


def test_make_course_runs_the_course_script_with_lab_args():
    # --no-print-directory: under `make test` (as in CI) this make is nested and would
    # otherwise end its output with "Leaving directory"
    dry = subprocess.run(["make", "-n", "--no-print-directory", "-o", ".venv/.installed",
                          "course", "LAB_ARGS=--x=1"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert dry.strip().splitlines()[-1] == ".venv/bin/python tools/course.py --x=1"


def _notebook(path: Path, text: str) -> None:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(text)])
    nb.metadata["jupytext"] = {"formats": notebooks.PAIRING}
    nbformat.write(nb, path)


def _text(path: Path) -> str:
    return nbformat.read(path, as_version=4).cells[0].source


def test_the_student_works_in_a_copy_that_is_never_overwritten(tmp_path):
    course_dir, mine = tmp_path / "notebooks", tmp_path / "my-notebooks"
    course_dir.mkdir()
    _notebook(course_dir / "01-a.ipynb", "course v1")
    _notebook(course_dir / "02-b.ipynb", "course v1")
    assert course.personal_copy(mine, course_dir) == (["01-a.ipynb", "02-b.ipynb"], [])
    assert "jupytext" not in nbformat.read(mine / "01-a.ipynb", as_version=4).metadata
    _notebook(mine / "01-a.ipynb", "the student's answers")
    assert course.personal_copy(mine, course_dir) == ([], [])
    _notebook(course_dir / "01-a.ipynb", "course v2")          # a git pull changed it
    _notebook(course_dir / "03-c.ipynb", "course v1")          # and added one
    copied, notes = course.personal_copy(mine, course_dir)
    assert copied == ["03-c.ipynb"] and len(notes) == 1 and "01-a.ipynb has changed" in notes[0]
    assert _text(mine / "01-a.ipynb") == "the student's answers"
    (mine / "01-a.ipynb").rename(mine / "01-a-mine.ipynb")     # what the note suggests
    assert course.personal_copy(mine, course_dir) == (["01-a.ipynb"], [])
    assert _text(mine / "01-a.ipynb") == "course v2"


def test_the_copies_are_ignored_by_git():
    ignored = subprocess.run(["git", "check-ignore", "-q", "my-notebooks/01-why-scale.ipynb"],
                             cwd=ROOT)
    assert ignored.returncode == 0


def test_kernels_get_the_thread_settings_of_make_test():
    suite = next(line for line in (ROOT / "Makefile").read_text().splitlines()
                 if line.startswith("SUITE ="))
    for name, value in course.THREADS.items():
        assert f"{name}={value} " in suite
    assert course.kernel_environment({"OMP_NUM_THREADS": "16", "HOME": "/h"}) == \
        {"OMP_NUM_THREADS": "1", "HOME": "/h"}
