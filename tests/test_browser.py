"""The course where students use it: JupyterLab in a real browser, widgets that respond.

For each core notebook (notebooks/01-05; each shows a widget; the deep dives' widgets are
moved in their nbval kernels by tests/widget_moves.py, and BROWSER_TEST_ALL_NOTEBOOKS=1
brings them here too) this opens the notebook in JupyterLab on
127.0.0.1 (a free port, a random token; one server and one headless Chromium, driven by
Selenium, with JupyterLab loaded once for all the notebooks, each closed and its kernel shut
down after its test) as `make course` opens it: the student's copy of the notebooks (made by
tools/course.py in a mirror of the repository, so nothing in the repository is touched), the
course's extension and the kernels' thread settings. It clears the stored outputs and runs
the cells the widgets need, checks that none of them raised, then
moves controls of each interactive widget (dropdowns first, then sliders with the keyboard,
as a student would) until its plot changes, comparing the widget's image before and after.
Screenshots go to results/screenshots/.

Notebook 01 is the student's first hour, so it gets Run All, as a student would press it:
every solution stays folded (source and output, with its label) through Run All, JupyterLab's
autosave and a kernel restart, and the saved notebook passes the folding check of
tests/test_exercises.py; the time widget's first plot says what the prose says (288 years);
and `git status` of the repository is what it was before.

Cells run: only those the widgets need, in notebook order: the first code cell (imports and
setup), each widget cell, and, transitively, the last earlier cell that defines each name
one of these uses, found by a static def-use analysis of the cells' Python source with ast
(widget_slice; a cell that does not parse, a magic, always runs). Most of a notebook's
time goes to measured multi-rank runs whose numbers feed tables and plots, not the widgets;
those cells are skipped here, since nbval executes every cell of every notebook anyway. A
measured run that a widget does read (deep dive 09's plots its own) still runs. What the
analysis cannot see (a cell that changes an object only by calling its methods, a file
written by one cell and read by another) would show up here as a widget cell that raises.
BROWSER_TEST_ALL_CELLS=1 runs every cell of every notebook instead.

Needs Debian's chromium and chromium-driver (or CHROMIUM / CHROMEDRIVER pointing at a
Chromium and its matching driver) and the selenium package; without them the tests are
skipped and the reason is printed.
"""
from __future__ import annotations

import contextlib
import ast
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
import warnings
from pathlib import Path

import nbformat
import pytest
from test_exercises import folding_problems
from widget_moves import BROWSER_NOTEBOOKS, widget_cells

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import course  # noqa: E402  (tools/course.py)

RUN_ALL = "01"                              # the first hour: Run All, as a student does
AUTOSAVE_S = 2                              # JupyterLab's autosave interval here (default 120)
# JupyterLab stretches that interval after each save to 10 times the save's duration (its
# SaveHandler: interval = max(10 x duration, autosaveInterval)): on a busy machine a save of
# 3 s puts the next one 30 s later. Wait up to JupyterLab's default interval.
AUTOSAVE_WAIT_S = 120
SCREENSHOTS = ROOT / "results" / "screenshots"
LIVE_NOTEBOOKS = ("02", "03", "04", "05")   # each has a widget that measures when moved
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--window-size=1400,1800"]
LAB_SETTINGS = {  # no windowing (every cell stays in the page), no news or update checks
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings":
        {"checkForUpdates": False, "fetchNews": "false"},
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings":
        {"autosave": True, "autosaveInterval": AUTOSAVE_S},
}


def _widget_cells(path: Path) -> list[int]:
    """Indices (among code cells) of the cells that show an interactive widget."""
    return widget_cells(nbformat.read(path, as_version=4))


# The browser test is about widgets: a notebook without one (some deep dives) is executed by
# nbval and has nothing a browser would add. The deep dives' widgets are moved in their nbval
# kernels (tests/widget_moves.py): the front end is the same for every notebook, and the
# core notebooks test it. BROWSER_TEST_ALL_NOTEBOOKS=1 opens every notebook with a widget.
ALL_NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]-*.ipynb"))
NOTEBOOKS = [p for p in ALL_NOTEBOOKS if _widget_cells(p)
             and (p.stem[:2] in BROWSER_NOTEBOOKS
                  or os.environ.get("BROWSER_TEST_ALL_NOTEBOOKS") == "1")]


# ---------------------------------------------------------------- is there a browser?
def _first(*paths) -> str | None:
    return next((p for p in paths if p and Path(p).is_file() and os.access(p, os.X_OK)), None)


def find_browser() -> tuple[str, str] | str:
    """(chromium, chromedriver) paths, or the reason the browser tests cannot run."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "the selenium package is not installed (pip install -e '.[test]')"
    chromium = _first(os.environ.get("CHROMIUM"), "/usr/bin/chromium",
                      shutil.which("chromium") or "", shutil.which("chromium-browser") or "")
    driver = _first(os.environ.get("CHROMEDRIVER"), "/usr/bin/chromedriver",
                    shutil.which("chromedriver") or "")
    if chromium is None:
        return "no Chromium found (apt-get install chromium chromium-driver, or set CHROMIUM)"
    if driver is None:
        return "no chromedriver found (apt-get install chromium-driver, or set CHROMEDRIVER)"
    return chromium, driver


BROWSER = find_browser()


def _skip_without_browser():
    if isinstance(BROWSER, str):
        reason = f"browser test skipped: {BROWSER}"
        print(reason, file=sys.stderr)
        warnings.warn(reason)
        pytest.skip(reason)


# ---------------------------------------------------------------- JupyterLab
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _mirror_repository(into: Path) -> Path:
    """The student's copy of the notebooks, as `make course` makes it (``course.personal_copy``),
    in a mirror of the repository (links to everything else), so that the browser's edits and
    autosaves stay out of the repository and out of a student's own my-notebooks/."""
    repo = into / "repo"
    repo.mkdir()
    for entry in ROOT.iterdir():
        if entry.name in {".git", ".venv", "results", "site", course.WORK.name}:
            continue
        (repo / entry.name).symlink_to(entry)
    course.personal_copy(repo / course.WORK.name, ROOT / "notebooks")
    return repo


@contextlib.contextmanager
def jupyterlab_server():
    """A JupyterLab on 127.0.0.1 over a mirror of the repository: {base, token, tmp,
    stopping (the kernels being shut down, by id)}."""
    tmp = Path(tempfile.mkdtemp(prefix="browser-test-"))
    repo = _mirror_repository(tmp)
    for name, values in LAB_SETTINGS.items():
        path = tmp / "settings" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    port, token = _free_port(), uuid.uuid4().hex
    env = {**course.kernel_environment(dict(os.environ)),
           "JUPYTER_CONFIG_DIR": str(tmp / "config"), "JUPYTER_RUNTIME_DIR": str(tmp / "runtime")}
    log = open(tmp / "jupyterlab.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         f"--ServerApp.token={token}", "--ServerApp.port_retries=0", "--allow-root",
         f"--ServerApp.root_dir={repo / course.WORK.name}", "--LabApp.expose_app_in_browser=True",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
         f"--LabApp.extra_labextensions_path={course.EXTENSIONS}",
         f"--LabApp.user_settings_dir={tmp / 'settings'}",
         f"--LabApp.workspaces_dir={tmp / 'workspaces'}"],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    server = {"base": base, "token": token, "tmp": tmp, "stopping": {},
              "work": repo / course.WORK.name}
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("JupyterLab did not start:\n"
                                       + (tmp / "jupyterlab.log").read_text()[-3000:])
                time.sleep(0.5)
        yield server
    finally:
        for thread in server["stopping"].values():
            thread.join(15)                      # kernels still shutting down
        os.killpg(proc.pid, signal.SIGTERM)      # the server and the kernels it started
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _git_status() -> str:
    """What `git status` says of the repository's own files (not of untracked ones, which
    tests running beside this one may make and remove)."""
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                          capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def git_status():
    """The repository's `git status` before the browser opens anything."""
    return _git_status()


@pytest.fixture(scope="module")
def lab():
    _skip_without_browser()
    with jupyterlab_server() as server:
        yield server


def _shutdown_kernels(lab) -> None:
    """Ask JupyterLab to shut every kernel down, without waiting for them to exit.

    A kernel whose notebook launched ranks takes 2.5 s to go: ipykernel stops its children
    before it exits and waits for them, and multiprocessing's resource tracker ignores
    SIGTERM (by design), so JupyterLab ends the wait with SIGTERM after half its
    shutdown_wait_time. The requests run in threads that ``lab`` joins before it stops.
    Nothing is lost by not waiting: the next notebook gets a kernel of its own."""
    headers = {"Authorization": f"token {lab['token']}"}
    with urllib.request.urlopen(urllib.request.Request(f"{lab['base']}/api/kernels",
                                                       headers=headers)) as r:
        kernels = json.load(r)
    for k in kernels:
        if k["id"] in lab["stopping"]:
            continue                                      # asked already, still going
        request = urllib.request.Request(f"{lab['base']}/api/kernels/{k['id']}",
                                         method="DELETE", headers=headers)
        thread = threading.Thread(target=urllib.request.urlopen, args=(request,), daemon=True)
        thread.start()
        lab["stopping"][k["id"]] = thread


@pytest.fixture(scope="module")
def browser(lab):
    """One headless Chromium with JupyterLab loaded once (?reset: a fresh workspace); each
    test opens its notebook in it and closes it again (``page``)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver_path = BROWSER
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in CHROMIUM_FLAGS + [f"--user-data-dir={tempfile.mkdtemp(dir=lab['tmp'])}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        driver.get(f"{lab['base']}/lab?reset&token={lab['token']}")
        wait_for(driver, "JupyterLab to load", 90,
                 lambda: driver.execute_script("return !!(window.jupyterapp && "
                                               "window.jupyterapp.commands)"))
        driver.set_script_timeout(90)
        assert driver.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            "window.jupyterapp.restored.then(() => done('ok'), e => done('error: ' + e));") == "ok"
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def page(browser, lab):
    """The browser for one notebook: afterwards its tab is closed without saving (the edits
    stay out of the mirror too) and every kernel is shut down."""
    yield browser
    browser.execute_script("""
        for (const w of Array.from(window.jupyterapp.shell.widgets('main'))) {
          if (w.context) { w.context.model.dirty = false; }
          w.dispose();
        }""")
    _shutdown_kernels(lab)


# ---------------------------------------------------------------- the notebook
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.ListComp,
           ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _bound_in(scope: ast.AST) -> set[str]:
    """The names a function, lambda, class or comprehension binds for itself."""
    if isinstance(scope, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
        return {n.id for g in scope.generators for n in ast.walk(g.target)
                if isinstance(n, ast.Name)}
    names: set[str] = set()
    if not isinstance(scope, ast.ClassDef):
        a = scope.args
        names |= {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs}
        names |= {x.arg for x in (a.vararg, a.kwarg) if x is not None}
    if isinstance(scope, ast.Lambda):
        return names
    declared_global: set[str] = set()
    for node in _walk_scope(scope.body):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            declared_global |= set(node.names)
    return names - declared_global


def _walk_scope(body: list[ast.stmt]):
    """The nodes of one scope's body, not those of the scopes nested in it (whose own names
    are theirs; a nested def or class itself, whose name is bound here, is yielded)."""
    todo = list(body)
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            todo += node.decorator_list       # evaluated here, unlike the body
        elif not isinstance(node, _SCOPES):
            todo += ast.iter_child_nodes(node)


def _base_name(node: ast.AST) -> str | None:
    """x for x, x.a, x[k], x.a[k].b ..."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Starred)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def defs_and_uses(source: str) -> tuple[set[str], set[str]] | None:
    """(names the cell defines, names it reads from outside itself), or None if the source
    does not parse as Python (an IPython magic). Defining: assignments (augmented and
    annotated too), for/with/except targets, imports, def and class, `global` names, and a
    subscript or attribute store on a name (x[k] = ..., x.a = ... define x). Using: every load
    of a name that the cell's own functions, lambdas, classes or comprehensions do not bind
    (conservative: a load after the cell assigned the name still counts)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    defs: set[str] = set()
    uses: set[str] = set()

    def visit(node: ast.AST, local: frozenset[str], top: bool) -> None:
        # top: at the cell's own level, not inside one of its functions or comprehensions
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Load) and node.id not in local:
                uses.add(node.id)
            elif isinstance(node.ctx, ast.Store) and top:
                defs.add(node.id)
        elif isinstance(node, (ast.Attribute, ast.Subscript)) and isinstance(node.ctx, ast.Store):
            if top and _base_name(node):
                defs.add(_base_name(node))
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            if node.target.id not in local:
                uses.add(node.target.id)  # x += 1 reads x before it stores it
        elif isinstance(node, (ast.Import, ast.ImportFrom)) and top:
            defs.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name and top:
            defs.add(node.name)
        elif isinstance(node, ast.Global):
            defs.update(node.names)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if top:
                defs.add(node.name)
            # decorators, defaults, annotations and bases are evaluated where the def stands
            outside = [*node.decorator_list]
            if isinstance(node, ast.ClassDef):
                outside += node.bases + [k.value for k in node.keywords]
            else:
                a = node.args
                outside += a.defaults + [d for d in a.kw_defaults if d is not None]
            for child in outside:
                visit(child, local, top)
            inner = local | _bound_in(node)
            for child in node.body:
                visit(child, inner, False)
            return
        if isinstance(node, _SCOPES):     # lambda, comprehension
            inner = local | _bound_in(node)
            for child in ast.iter_child_nodes(node):
                visit(child, inner, False)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, local, top)

    for statement in tree.body:
        visit(statement, frozenset(), True)
    return defs, uses


def widget_slice(sources: list[str], widgets: list[int]) -> list[int]:
    """The code cells (indices into sources) that the widget cells need, in notebook order:
    the first cell (imports, setup), the widget cells, every cell that does not parse (what it
    needs cannot be known) up to the last widget, and transitively, for each of these, the
    last earlier cell that defines each name it uses. A name no earlier cell defines (a
    builtin, one only the cell itself defines) needs nothing."""
    if not sources or not widgets:
        return []
    last = max(widgets)
    analysed = [defs_and_uses(s) for s in sources[:last + 1]]
    wanted = {0, *widgets} | {i for i, a in enumerate(analysed) if a is None}
    todo = sorted(wanted)
    while todo:
        i = todo.pop()
        if analysed[i] is None:
            continue
        for name in analysed[i][1]:
            definer = next((j for j in range(i - 1, -1, -1)
                            if analysed[j] is not None and name in analysed[j][0]), None)
            if definer is not None and definer not in wanted:
                wanted.add(definer)
                todo.append(definer)
    return sorted(wanted)


def cells_to_run(path: Path) -> tuple[list[int], str]:
    """(indices of the code cells to run, in order; why), from the stored notebook."""
    code = [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
    widget = _widget_cells(path)
    if path.stem[:2] == RUN_ALL:
        return list(range(len(code))), f"Run All ({len(code)} code cells)"
    if os.environ.get("BROWSER_TEST_ALL_CELLS") == "1" or not widget:
        return list(range(len(code))), f"every cell ({len(code)} code cells)"
    chosen = widget_slice([c.source for c in code], widget)
    return chosen, (f"{len(chosen)} of {len(code)} code cells: {chosen} "
                    f"(the widgets need them)")


JS_PANEL = """
const panelOf = path => window.jupyterapp && Array.from(window.jupyterapp.shell.widgets('main'))
    .find(w => w.context && w.context.path === path && w.content && w.sessionContext);
"""

JS_STATE = JS_PANEL + """
const w = panelOf(arguments[1]);
if (!w) return null;
const k = w.sessionContext.session && w.sessionContext.session.kernel;
const code = w.content.widgets.filter(c => c.model.type === 'code');
const chosen = (arguments[0] === null ? code.map((c, i) => i) : arguments[0])
    .map(i => [code[i], i]);            // the code cells run, by index among code cells
const errors = chosen.flatMap(([c, i]) => c.model.outputs.toJSON()
    .filter(o => o.output_type === 'error')
    .map(o => `${o.ename}: ${o.evalue} (code cell ${i}: ` + (c.model.sharedModel.getSource()
              .split('\\n').find(line => !line.startsWith('#')) || '') + ')'))
    .concat(window.browserTestRunError ? [`running the cells: ${window.browserTestRunError}`]
            : []);
return {kernel: k ? k.status : 'none', cells: code.length,
        pending: chosen.filter(([c]) => c.model.executionCount === null).length, errors};
"""

JS_FOLDED = JS_PANEL + """
const w = panelOf(arguments[0]);
if (!w) return null;
const solutions = w.content.widgets.filter(c => (c.model.getMetadata('tags') || [])
    .includes('solution'));
// what the page shows of each solution, and the lines of its outputs, which it must not show
const lines = c => c.model.outputs.toJSON().flatMap(o => [].concat(o.text || [],
    (o.data || {})['text/plain'] || [])).join('').split('\\n').filter(l => l.trim());
return {solutions: solutions.length,
        shown: solutions.filter(c => !c.inputHidden || !c.outputHidden).length,
        unlabelled: solutions.filter(c => !c.node.innerText.includes('Solution')).length,
        given_away: solutions.flatMap(c => lines(c).filter(l => c.node.innerText.includes(l))),
        ran: solutions.filter(c => c.model.executionCount !== null).length};
"""

JS_SAVED = JS_PANEL + """
const w = panelOf(arguments[0]);
return w ? {dirty: w.context.model.dirty} : null;
"""

JS_SAVE = JS_PANEL + """
const [path, done] = [arguments[0], arguments[arguments.length - 1]];
panelOf(path).context.save().then(() => done('ok'), e => done('error: ' + e));
"""

JS_RESTART = JS_PANEL + """
const [path, done] = [arguments[0], arguments[arguments.length - 1]];
panelOf(path).sessionContext.restartKernel().then(() => done('ok'), e => done('error: ' + e));
"""

JS_OPEN = """
const [path, done] = [arguments[0], arguments[arguments.length - 1]];
window.browserTestRunError = undefined;
window.jupyterapp.commands.execute('docmanager:open', {path})
    .then(() => done('ok'), e => done('error: ' + e));
"""

JS_RUN = JS_PANEL + """
const [chosen, path, done] = [arguments[0], arguments[1], arguments[arguments.length - 1]];
const app = window.jupyterapp, panel = panelOf(path), nb = panel.content;
app.shell.activateById(panel.id);         // the commands act on the active notebook
app.commands.execute('notebook:clear-all-cell-outputs').then(() => {
  const code = nb.widgets.map((c, i) => [c, i]).filter(([c]) => c.model.type === 'code');
  code.forEach(([c]) => { c.model.executionCount = null; });   // "not run yet", for finished()
  if (chosen.length === code.length) {
    app.commands.execute('notebook:run-all-cells');
  } else {
    // one cell at a time, each once the one before has finished, in notebook order
    chosen.reduce((before, i) => before.then(() => {
      nb.deselectAll();
      nb.activeCellIndex = code[i][1];
      return app.commands.execute('notebook:run-cell');
    }), Promise.resolve()).catch(e => { window.browserTestRunError = String(e); });
  }
  done('ok');                             // the cells run on; finished() watches them
}, e => done('error: ' + e));
"""


def wait_for(driver, what: str, timeout: float, check):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.3)


def plot_of(interact) -> str | None:
    """The data URL of the widget's plot (None while it is being redrawn)."""
    return interact.parent.execute_script(
        "const img = arguments[0].querySelector('.jp-OutputArea-output img');"
        "return img ? img.src : null;", interact)


def move(driver, control, steps: int = 3) -> str:
    """Change one control as a student would (a slider by ``steps`` presses of the right
    arrow); returns what was done."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select

    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", control)
    if control.tag_name == "select":
        menu = Select(control)
        current = [o.get_attribute("value") for o in menu.options].index(
            menu.first_selected_option.get_attribute("value"))
        menu.select_by_index((current + 1) % len(menu.options))
        return f"dropdown -> {menu.first_selected_option.text}"
    before = control.get_attribute("aria-valuetext")
    for _ in range(3):       # a click that lands while the page re-lays out misses the handle
        ActionChains(driver).click(control).send_keys(Keys.ARROW_RIGHT * steps).perform()
        if control.get_attribute("aria-valuetext") != before:
            break
        time.sleep(1)
    after = control.get_attribute("aria-valuetext") or ""
    return f"slider {before} -> {after} ({steps} x arrow right)"


def assert_folded(browser, where: str, when: str) -> dict:
    folded = browser.execute_script(JS_FOLDED, where)
    assert folded and folded["shown"] == 0 and folded["unlabelled"] == 0 \
        and folded["given_away"] == [], f"{where}: solutions not folded {when}: {folded}"
    return folded


def first_hour(browser, lab, where: str) -> None:
    """After Run All of notebook 01: solutions folded, also in what autosave wrote (the
    folding check of tests/test_exercises.py), and the time plot on the prose's 288 years."""
    folded = assert_folded(browser, where, "after Run All")
    assert folded["ran"] == folded["solutions"] >= 1
    # the time widget's first plot (its title is printed below it) against the prose
    prose = re.search(r"lands on (\d+) years", browser.find_element(
        "css selector", ".jp-NotebookPanel").text)
    assert prose, "01's prose no longer says where the time widget lands"
    titles = [e.text for e in browser.find_elements("css selector", ".widget-interact")
              if "TFLOP/s per GPU" in e.text]
    assert len(titles) == 1 and titles[0].rstrip().endswith(f"{prose[1]} years"), \
        f"01's prose says {prose[0]}, its time widget's first plot says {titles}"
    # JupyterLab's own autosave (every AUTOSAVE_S here) writes what Run All left
    saved = lab["work"] / where

    def autosaved():
        if browser.execute_script(JS_SAVED, where)["dirty"]:
            return None
        stored = nbformat.read(saved, as_version=4)
        return stored if all(c.get("execution_count") for c in stored.cells
                             if c.cell_type == "code") else None

    try:
        stored = wait_for(browser, "JupyterLab to autosave what Run All left", AUTOSAVE_WAIT_S,
                          autosaved)
        how = "autosaved"
    except AssertionError:
        # A save that took seconds on a busy machine stretches the next autosave past the
        # wait; what a save writes is the same either way, so save as Ctrl-S would
        print(f"  no autosave within {AUTOSAVE_WAIT_S} s: saved by the notebook's own save")
        assert browser.execute_async_script(JS_SAVE, where) == "ok"
        stored = wait_for(browser, "the notebook's own save", 60, autosaved)
        how = "saved"
    assert folding_problems(stored, f"{where} as {how} after Run All") == []


def test_every_core_notebook_is_tested_in_the_browser():
    tested = {p.stem[:2] for p in NOTEBOOKS}
    assert {"01", "02", "03", "04", "05"} <= tested, tested
    assert set(LIVE_NOTEBOOKS) <= tested


def test_widget_slice_runs_only_what_the_widgets_need():
    """The def-use slice on a small notebook, no browser needed."""
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

    nb = new_notebook(cells=[
        new_code_cell("import numpy as np\nfrom lib import viz"),                  # 0 setup
        new_code_cell("sizes = [1, 2, 4]\ntable = {}"),                        # 1
        new_code_cell("scale = 3\nfor n in sizes:\n    table[n] = n * scale"),  # 2 table[n] =
        new_code_cell("measured = expensive_launch(sizes, steps=1000)"),        # 3 not needed
        new_markdown_cell("The widget below reads `table`, not `measured`."),
        new_code_cell("scale = 10   # an older value"),                          # 4
        new_code_cell("scale = 5\nprint(len(measured))"),                      # 5 needs 3
        new_code_cell("def redraw(k):\n    return viz.plot(table, k, scale=scale)"),  # 6
        new_code_cell("print(sum(np.ones(3)) for _ in range(2))"),               # 7 not needed
        new_code_cell("viz.widget(redraw, ks=[n for n in sizes])"),               # 8 the widget
        new_code_cell("after = measured"),                                        # 9 after it
    ])
    sources = [c.source for c in nb.cells if c.cell_type == "code"]
    defs, uses = defs_and_uses(sources[2])
    assert {"scale", "n", "table"} <= defs and {"sizes", "table"} <= uses   # x[k] = ... defines x
    defs, uses = defs_and_uses(sources[6])
    assert defs == {"redraw"} and uses == {"viz", "table", "scale"}     # k is redraw's own
    assert defs_and_uses("%timeit f()") is None
    # 8 needs redraw (6) and sizes (1); redraw needs table, whose last definer is the
    # subscript store in 2 (which needs sizes and table from 1), and scale, whose last
    # definer before 6 is 5 (not 2 or 4), which needs the expensive 3 for measured.
    assert widget_slice(sources, [8]) == [0, 1, 2, 3, 5, 6, 8]
    sources[5] = "scale = 5"             # now nothing the widget needs reads measured
    assert widget_slice(sources, [8]) == [0, 1, 2, 5, 6, 8]
    # a cell that does not parse (a magic) before the last widget always runs
    sources[7] = "%matplotlib inline"
    assert widget_slice(sources, [8]) == [0, 1, 2, 5, 6, 7, 8]


@pytest.mark.timeout(420)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_and_its_widgets_respond(path, page, lab, git_status):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    browser = page
    chosen, why = cells_to_run(path)
    start = time.monotonic()
    print(f"{path.name}: running {why}")
    where = path.name                     # in the student's copy, the server's root
    browser.set_script_timeout(30)
    assert browser.execute_async_script(JS_OPEN, where) == "ok"
    wait_for(browser, "JupyterLab to open the notebook and start its kernel", 90,
             lambda: (browser.execute_script(JS_STATE, None, where) or {}).get("kernel") == "idle")
    assert_folded(browser, where, "on opening")
    assert browser.execute_async_script(JS_RUN, chosen, where) == "ok"

    def finished():
        state = browser.execute_script(JS_STATE, chosen, where)
        if state["errors"]:
            browser.save_screenshot(str(SCREENSHOTS / f"{path.stem}-error.png"))
            raise AssertionError(f"{path.name}: a cell raised {state['errors'][0]}")
        return state["pending"] == 0 and state["kernel"] == "idle"

    opened = time.monotonic()
    wait_for(browser, f"{path.name} to run ({why})", 200, finished)
    print(f"  opened in {opened - start:.0f} s, ran in {time.monotonic() - opened:.0f} s")
    browser.save_screenshot(str(SCREENSHOTS / f"{path.stem}-ran.png"))
    if path.stem[:2] == RUN_ALL:
        first_hour(browser, lab, where)

    interacts = browser.find_elements("css selector", ".widget-interact")
    assert interacts, f"{path.name} shows no interactive widget after running {why}"
    live = [i for i in interacts if "live-widget" in (i.get_attribute("class") or "")]
    if path.stem[:2] in LIVE_NOTEBOOKS:
        assert live, f"{path.name} shows no live widget (one that re-runs ranks)"
    for number, interact in enumerate(interacts, 1):
        # a live widget starts real ranks for each move: give it the time of a launch
        patience = 90 if interact in live else 15
        before = wait_for(browser, f"widget {number}'s first plot", 30, lambda: plot_of(interact))
        interact.screenshot(str(SCREENSHOTS / f"{path.stem}-widget{number}-before.png"))
        controls = (interact.find_elements("css selector", "select")
                    + interact.find_elements("css selector", ".noUi-handle"))
        assert controls, f"{path.name}: widget {number} has no dropdown or slider"
        tried = []
        for control in controls:
            # each step of a live widget's slider starts ranks: one step is enough to redraw
            tried.append(move(browser, control, steps=1 if interact in live else 3))
            try:
                wait_for(browser, "the plot to change", patience,
                         lambda: plot_of(interact) not in (None, before))
                break
            except AssertionError:
                continue
        else:
            interact.screenshot(str(SCREENSHOTS / f"{path.stem}-widget{number}-unchanged.png"))
            raise AssertionError(f"{path.name}: widget {number}'s plot never changed; tried "
                                 f"{tried}")
        interact.screenshot(str(SCREENSHOTS / f"{path.stem}-widget{number}-after.png"))
        print(f"  widget {number}{' (live)' if interact in live else ''}: {tried[-1]} "
              f"changed the plot")
    if path.stem[:2] == RUN_ALL:      # last: a restart leaves the widgets without a kernel
        browser.set_script_timeout(60)
        assert browser.execute_async_script(JS_RESTART, where) == "ok"
        assert_folded(browser, where, "after a kernel restart")
    assert _git_status() == git_status, "opening, running and saving changed `git status`"
