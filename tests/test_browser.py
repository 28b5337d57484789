"""The course where students use it: JupyterLab in a real browser, widgets that respond.

For each notebooks/NN-*.ipynb that shows a widget (every core notebook, and the deep dives
that have one; nbval executes the others) this starts JupyterLab on 127.0.0.1 (a free port,
a random token, a copy of the notebooks so nothing in the repository is touched), opens the
notebook in headless Chromium driven by Selenium, clears the stored outputs and runs the
cells, checks that no cell raised, then moves controls of each interactive widget (dropdowns first, then
sliders with the keyboard, as a student would) until its plot changes, comparing the
widget's image before and after. Screenshots go to results/screenshots/.

Cells run: every cell up to the notebook's last widget (the widgets come with the
predictions; the measured runs after them take most of a notebook's time and nbval executes
them anyway), so the notebooks take a few minutes; BROWSER_TEST_ALL_CELLS=1 runs every
cell of every notebook.

Needs Debian's chromium and chromium-driver (or CHROMIUM / CHROMEDRIVER pointing at a
Chromium and its matching driver) and the selenium package; without them the tests are
skipped and the reason is printed.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
import warnings
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
SCREENSHOTS = ROOT / "results" / "screenshots"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
LIVE_NOTEBOOKS = ("02", "03", "04", "05")   # each has a widget that measures when moved
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--window-size=1400,1800"]
LAB_SETTINGS = {  # no windowing (every cell stays in the page), no news or update checks
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings":
        {"checkForUpdates": False, "fetchNews": "false"},
}


def _widget_cells(path: Path) -> list[int]:
    """Indices (among code cells) of the cells that show an interactive widget."""
    code = [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
    return [i for i, c in enumerate(code)
            if any(WIDGET_VIEW in o.get("data", {}) for o in c.get("outputs", []))
            or "widget(" in c.source or "interact" in c.source]


# The browser test is about widgets: a notebook without one (some deep dives) is executed by
# nbval and has nothing a browser would add.
ALL_NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]-*.ipynb"))
NOTEBOOKS = [p for p in ALL_NOTEBOOKS if _widget_cells(p)]


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
    """The repository's layout with a copy of notebooks/ and links to everything else, so
    notebooks find ../data while the browser's edits and autosaves stay out of the repo."""
    repo = into / "repo"
    repo.mkdir()
    for entry in ROOT.iterdir():
        if entry.name in {"notebooks", ".git", ".venv", "results", "site"}:
            continue
        (repo / entry.name).symlink_to(entry)
    shutil.copytree(ROOT / "notebooks", repo / "notebooks",
                    ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    # As in a fresh clone, each .py twin is as recent as its .ipynb: JupyterLab's jupytext
    # refuses to open a paired notebook whose .ipynb is newer than its .py.
    for ipynb in (repo / "notebooks").rglob("*.ipynb"):
        twin = ipynb.parent / "py_src" / f"{ipynb.stem}.py"
        if twin.exists():
            stamp = ipynb.stat().st_mtime
            os.utime(twin, (stamp, stamp))
    return repo


@contextlib.contextmanager
def jupyterlab_server():
    """A JupyterLab on 127.0.0.1 over a mirror of the repository: {base, token, tmp}."""
    tmp = Path(tempfile.mkdtemp(prefix="browser-test-"))
    repo = _mirror_repository(tmp)
    for name, values in LAB_SETTINGS.items():
        path = tmp / "settings" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    port, token = _free_port(), uuid.uuid4().hex
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp / "config"),
           "JUPYTER_RUNTIME_DIR": str(tmp / "runtime")}
    log = open(tmp / "jupyterlab.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         f"--ServerApp.token={token}", "--ServerApp.port_retries=0", "--allow-root",
         f"--ServerApp.root_dir={repo}", "--LabApp.expose_app_in_browser=True",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
         f"--LabApp.user_settings_dir={tmp / 'settings'}",
         f"--LabApp.workspaces_dir={tmp / 'workspaces'}"],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
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
        yield {"base": base, "token": token, "tmp": tmp}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)      # the server and the kernels it started
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def lab():
    _skip_without_browser()
    with jupyterlab_server() as server:
        yield server


def _shutdown_kernels(lab) -> None:
    headers = {"Authorization": f"token {lab['token']}"}
    with urllib.request.urlopen(urllib.request.Request(f"{lab['base']}/api/kernels",
                                                       headers=headers)) as r:
        kernels = json.load(r)
    for k in kernels:
        urllib.request.urlopen(urllib.request.Request(
            f"{lab['base']}/api/kernels/{k['id']}", method="DELETE", headers=headers))


@pytest.fixture
def browser(lab):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver_path = BROWSER
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in CHROMIUM_FLAGS + [f"--user-data-dir={tempfile.mkdtemp(dir=lab['tmp'])}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        _shutdown_kernels(lab)


# ---------------------------------------------------------------- the notebook
def cells_to_run(path: Path) -> tuple[int, str]:
    """(code cells to run from the top, why), from the stored notebook."""
    code = [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
    widget = _widget_cells(path)
    if os.environ.get("BROWSER_TEST_ALL_CELLS") == "1" or not widget:
        return len(code), "every cell"
    return widget[-1] + 1, f"cells up to the last widget ({widget[-1] + 1} of {len(code)})"


JS_PANEL = """
const panelOf = path => window.jupyterapp && Array.from(window.jupyterapp.shell.widgets('main'))
    .find(w => w.context && w.context.path === path && w.content && w.sessionContext);
"""

JS_STATE = JS_PANEL + """
const w = panelOf(arguments[1]);
if (!w) return null;
const k = w.sessionContext.session && w.sessionContext.session.kernel;
const code = w.content.widgets.filter(c => c.model.type === 'code');
const n = arguments[0] === null ? code.length : arguments[0];
const errors = code.slice(0, n).flatMap((c, i) => c.model.outputs.toJSON()
    .filter(o => o.output_type === 'error')
    .map(o => `${o.ename}: ${o.evalue} (code cell ${i}: ` + (c.model.sharedModel.getSource()
              .split('\\n').find(line => !line.startsWith('#')) || '') + ')'));
return {kernel: k ? k.status : 'none', cells: code.length,
        pending: code.slice(0, n).filter(c => c.model.executionCount === null).length, errors};
"""

JS_RUN = JS_PANEL + """
const [n, path, done] = [arguments[0], arguments[1], arguments[arguments.length - 1]];
const app = window.jupyterapp, panel = panelOf(path), nb = panel.content;
app.shell.activateById(panel.id);         // the commands act on the active notebook
app.commands.execute('notebook:clear-all-cell-outputs').then(() => {
  const code = nb.widgets.map((c, i) => [c, i]).filter(([c]) => c.model.type === 'code');
  code.forEach(([c]) => { c.model.executionCount = null; });   // "not run yet", for finished()
  if (n >= code.length) {
    app.commands.execute('notebook:run-all-cells');
  } else {
    nb.activeCellIndex = code[n][1];      // run everything above the first cell not wanted
    app.commands.execute('notebook:run-all-above');
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


def move(driver, control) -> str:
    """Change one control as a student would; returns what was done."""
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
        ActionChains(driver).click(control).send_keys(Keys.ARROW_RIGHT * 3).perform()
        if control.get_attribute("aria-valuetext") != before:
            break
        time.sleep(1)
    return f"slider {before} -> {control.get_attribute('aria-valuetext') or ''} (3 x arrow right)"


def test_every_core_notebook_is_tested_in_the_browser():
    tested = {p.stem[:2] for p in NOTEBOOKS}
    assert {"01", "02", "03", "04", "05"} <= tested, tested
    assert set(LIVE_NOTEBOOKS) <= tested


@pytest.mark.timeout(420)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_and_its_widgets_respond(path, lab, browser):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    n_cells, why = cells_to_run(path)
    start = time.monotonic()
    print(f"{path.name}: running {why}")
    where = f"notebooks/{path.name}"
    # ?reset: a fresh workspace, without the tabs of the notebooks tested before
    browser.get(f"{lab['base']}/lab/tree/{where}?reset&token={lab['token']}")
    wait_for(browser, "JupyterLab to open the notebook and start its kernel", 90,
             lambda: (browser.execute_script(JS_STATE, None, where) or {}).get("kernel") == "idle")
    browser.set_script_timeout(10)
    assert browser.execute_async_script(JS_RUN, n_cells, where) == "ok"

    def finished():
        state = browser.execute_script(JS_STATE, n_cells, where)
        if state["errors"]:
            browser.save_screenshot(str(SCREENSHOTS / f"{path.stem}-error.png"))
            raise AssertionError(f"{path.name}: a cell raised {state['errors'][0]}")
        return state["pending"] == 0 and state["kernel"] == "idle"

    opened = time.monotonic()
    wait_for(browser, f"{path.name} to run ({why})", 200, finished)
    print(f"  opened in {opened - start:.0f} s, ran in {time.monotonic() - opened:.0f} s")
    browser.save_screenshot(str(SCREENSHOTS / f"{path.stem}-ran.png"))

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
            tried.append(move(browser, control))
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
