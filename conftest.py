"""Under nbval, each notebook with a widget that the browser test does not open ends with one
more item, "widgets respond": its widgets are moved in the kernel that ran its cells
(tests/widget_moves.py says why, and which notebooks the browser takes). The suite's scopes
then run longest first (tests/scope_order.py); ``--store-durations`` measures them again."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent / "tests"

sys.path.insert(0, str(TESTS))
import scope_order  # noqa: E402
from widget_moves import BROWSER_NOTEBOOKS, widget_cells  # noqa: E402


class WidgetsRespond(pytest.Item):
    """Moves every widget in the notebook's nbval kernel, after its last cell."""

    def runtest(self):
        kernel = self.parent.kernel
        if kernel is None or not kernel.is_alive():
            raise RuntimeError("the notebook's kernel is not running")
        code = (f"import sys; sys.path.insert(0, {str(TESTS)!r}); import json, widget_moves\n"
                "print(json.dumps(widget_moves.move_every_widget()))")
        printed, errors = [], []

        def hook(msg):
            if msg["msg_type"] == "stream":
                printed.append(msg["content"]["text"])
            elif msg["msg_type"] == "error":
                errors.append(f"{msg['content']['ename']}: {msg['content']['evalue']}")

        kernel.kc.execute_interactive(code, store_history=False, timeout=300,
                                      output_hook=hook, allow_stdin=False)
        if errors:
            raise AssertionError(f"{self.parent.name}: {errors[0]}")
        for line in json.loads("".join(printed).strip().splitlines()[-1]):
            print(line)

    def reportinfo(self):
        return self.path, None, f"{self.parent.name}: widgets respond"


def pytest_addoption(parser):
    parser.addoption("--store-durations", action="store_true",
                     help=f"write each scope's seconds to {scope_order.DURATIONS.name}, "
                          "the order the next runs take the scopes in")


def pytest_configure(config):
    # every figure drawn in the suite (the notebooks' kernels inherit it) is checked for
    # hidden data and unexplained series (lessonlib/viz/figure_check.py)
    os.environ.setdefault("LESSONLIB_CHECK_FIGURES", "1")
    if config.getoption("--store-durations") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(scope_order.Recorder(), "scope-durations")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    _add_widget_items(items)
    items[:] = scope_order.ordered(items, scope_order.load())


def _add_widget_items(items):
    """After each such notebook's last cell (the kernel is still up: nbval stops it when
    the notebook's last item is done)."""
    try:
        from nbval.plugin import IPyNbFile
    except ImportError:
        return
    last = {}
    for index, item in enumerate(items):
        if isinstance(item.parent, IPyNbFile):
            last[item.parent] = index
    for notebook, index in sorted(last.items(), key=lambda kv: -kv[1]):
        if notebook.name[:2] in BROWSER_NOTEBOOKS or not widget_cells(notebook.nb):
            continue
        items.insert(index + 1, WidgetsRespond.from_parent(notebook, name="widgets respond"))
