/*
 * The course's JupyterLab extension: an exercise's solution stays folded, source and output,
 * through Run All, a kernel restart and every save, until the student opens it.
 *
 * Why it is needed: JupyterLab unfolds a cell's output whenever the cell runs (CodeCell.execute
 * sets outputHidden = false), so Run All would print "Correct: ... 4.5 B parameters" right
 * under the student's empty answer cell, and the next autosave would store it unfolded; and a
 * folded output shows its first line in the fold. Here, while a solution's source is folded
 * (a code cell tagged "solution", as the notebooks ship it), its output is folded again each
 * time it changes, and the fold says what it hides instead of showing it. A solution the
 * student opened (its source unfolded) is left alone.
 *
 * Plain JavaScript, no build step: it is a JupyterLab "federated extension" by hand, the
 * container that JupyterLab loads from static/remoteEntry.js (init receives the modules
 * JupyterLab shares, get returns this module's factory). tools/course.py and
 * tests/test_browser.py put the folder above it on JupyterLab's labextensions path.
 */
(function () {
  "use strict";
  const NAME = "course-solutions";
  const OUTPUT_LABEL = "The solution's output, hidden until you open the solution";
  let shared = null;

  function sharedModule(name) {
    const versions = shared[name];
    return versions[Object.keys(versions)[0]].get().then(factory => factory());
  }

  function foldedSolution(cell) {
    const tags = cell.model.getMetadata("tags") || [];
    return cell.model.type === "code" && tags.includes("solution") && cell.inputHidden;
  }

  function keepFolded(cell) {
    if (cell.isDisposed || !foldedSolution(cell)) {
      return;
    }
    cell.outputHidden = true;
    if (cell._outputPlaceholder) {
      cell._outputPlaceholder.text = OUTPUT_LABEL;
    }
  }

  function watch(cell) {
    if (cell.model.type !== "code" || cell.courseSolutionWatched) {
      return;
    }
    cell.courseSolutionWatched = true;
    keepFolded(cell);
    cell.model.outputs.changed.connect(() => keepFolded(cell));
    cell.model.stateChanged.connect(() => keepFolded(cell));
  }

  function watchNotebook(panel) {
    const notebook = panel.content;
    const all = () => notebook.widgets.forEach(watch);
    panel.context.ready.then(() => {
      all();
      notebook.model.cells.changed.connect(() => setTimeout(all));
    });
  }

  function plugin(notebookModule) {
    return {
      id: NAME + ":plugin",
      description: "Exercise solutions stay folded until the student opens them",
      autoStart: true,
      requires: [notebookModule.INotebookTracker],
      activate: (app, tracker) => {
        tracker.forEach(watchNotebook);
        tracker.widgetAdded.connect((_, panel) => watchNotebook(panel));
      }
    };
  }

  const jupyterlab = (window._JUPYTERLAB = window._JUPYTERLAB || {});
  jupyterlab[NAME] = {
    init: scope => {
      shared = scope;
    },
    get: module => {
      if (module !== "./extension") {
        return Promise.reject(new Error(NAME + " has no module " + module));
      }
      return sharedModule("@jupyterlab/notebook").then(notebookModule => () => ({
        __esModule: true,
        default: plugin(notebookModule)
      }));
    }
  };
})();
