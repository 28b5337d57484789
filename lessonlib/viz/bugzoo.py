"""Plots for the bug zoo: for each bug, the check's largest difference with the bug off and
on, against the check's tolerance; a dropdown that shows one bug, its line of code and
its bars.

Each plot draws results that ``lessonlib.bug_checks.check`` already returned (``Check`` records);
nothing here launches processes, so the widget answers at once.

Laptop and GPU box alike:
``from lessonlib import bug_checks; from lessonlib.viz import bugzoo as viz``
``viz.plot_checks({"pipeline_loss_unscaled": {"off": bug_checks.check("pipeline_loss_unscaled", False),
"on": bug_checks.check("pipeline_loss_unscaled", True)}})``
"""
from __future__ import annotations

import math
import textwrap

import matplotlib.pyplot as plt

from lessonlib import bug_switches
from lessonlib.bug_checks import Check
from lessonlib.viz.widgets import explorer

FLOOR, CEILING = 1e-18, 1e3   # log axis: 0 is drawn at the floor, inf (or NaN) at the ceiling
PASS, FAIL = "#55a868", "#c44e52"


def _shown(value: float) -> float:
    if not math.isfinite(value):
        return CEILING
    return min(max(value, FLOOR), CEILING)


def _label(value: float) -> str:
    if not math.isfinite(value):
        return "inf"
    return "0" if value == 0 else f"{value:.1e}"


def plot_check(off: Check, on: Check, ax=None):
    """Two bars (bug off, bug on) of one check's largest difference, log scale, coloured
    by pass or fail, with the tolerance as a dashed line (on the floor when it is 0)."""
    ax = ax or plt.subplots(figsize=(3.4, 3.2))[1]
    for x, r in enumerate((off, on)):
        ax.bar(x, _shown(r.max_diff) - FLOOR, bottom=FLOOR, width=0.6,
               color=PASS if r.passed else FAIL, hatch="" if r.passed else "//",
               edgecolor="black", lw=0.6)
        ax.text(x, _shown(r.max_diff) * 3, _label(r.max_diff), ha="center", fontsize=8)
    tol = off.tolerance
    ax.axhline(max(tol, FLOOR), color="black", ls="--", lw=1)
    ax.set_xlabel(f"dashed: tolerance {tol:g}" + (" (exact)" if tol == 0 else ""), fontsize=8)
    ax.set(yscale="log", ylim=(FLOOR, CEILING * 100), xlim=(-0.6, 1.6), xticks=[0, 1],
           xticklabels=["bug off", "bug on"], title=off.bug.replace("_", " "))
    ax.title.set_fontsize(9)
    ax.set_ylabel("largest difference", fontsize=8)
    return ax


def plot_checks(results: dict):
    """One panel per bug: ``results`` maps bug name -> {"off": check(...), "on": check(...)}."""
    n = len(results)
    fig, axes = plt.subplots(1, n, figsize=(3.1 * n, 3.4), sharey=True, squeeze=False)
    for ax, (name, pair) in zip(axes[0], results.items()):
        plot_check(pair["off"], pair["on"], ax)
        ax.set_title("\n".join(name.split("_", 1)), fontsize=9)
        ax.set_ylabel("largest difference" if ax is axes[0][0] else "")
    fig.suptitle("each check: bug off (should pass) vs bug on (should fail); green = passed, "
                 "red hatched = failed", fontsize=9)
    fig.tight_layout()
    return fig


def describe(name: str, pair: dict | None = None) -> str:
    """One bug in words: what, where (and its switched line), symptom, check, test, and the
    messages of the checks already run."""
    bug, (where, code) = bug_switches.BUGS[name], bug_switches.hook_line(name)
    rows = [("what", bug.what), ("where", f"{bug.where} ({where})"),
            ("symptom", bug.symptom), ("check", bug.check), ("test", bug.test)]
    rows += [(f"bug {state}", pair[state].message) for state in ("off", "on") if pair]
    text = [textwrap.fill(text, 96, initial_indent=f"  {label + ':':9s}",
                          subsequent_indent=" " * 11, break_long_words=False,
                          break_on_hyphens=False) for label, text in rows]
    text.insert(2, "  switch:  " + textwrap.indent(code, " " * 11).lstrip())  # keep its lines
    return bug.name + "\n" + "\n".join(text) + "\n"


def bug_widget(results: dict, name: str | None = None):
    """A dropdown over the bugs; shows the chosen bug's off/on bars and its description
    (with the lines its switch changes, read from the source now), from ``results``: moving
    it launches nothing."""
    import ipywidgets as w

    def draw(bug):
        fig, ax = plt.subplots(figsize=(4.2, 3.2))
        plot_check(results[bug]["off"], results[bug]["on"], ax)
        return fig, describe(bug, results[bug])

    return explorer(draw, bug=w.Dropdown(options=list(results), value=name or next(iter(results)),
                                         layout=w.Layout(width="420px")))
