# Two commands matter (see README):  make course   and   make test
# Both create .venv and install everything on first use; later runs reuse it.

PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed

.PHONY: setup course test test-fast durations notebooks bench site clean

setup: $(STAMP)

# torch comes from pip, which follows this machine's pip settings (an index for another CUDA
# version, a local wheel); the ~100 packages of JupyterLab and the test tools from uv, which
# fetches and installs them in parallel, or from pip where uv cannot reach its index (uv
# does not read pip's settings); then every module in .venv is compiled once, on all cores
# (Python would otherwise compile what it imports in every process that does not find it
# compiled). On the course's 2-core machine this takes 45 s; pip alone took 65 s.
# First the Python is checked (tools/check_python.py, one line and a stop when it is not
# 3.10-3.12): that of a .venv made earlier (one you made yourself, e.g. for another CUDA
# build of torch, is kept), else PYTHON, before any .venv is made.
$(STAMP): pyproject.toml
	@$(if $(wildcard $(PY)),$(PY) tools/check_python.py $(VENV),$(PYTHON) tools/check_python.py $(PYTHON))
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip uv
	$(PY) -m pip install --quiet --no-compile "torch==2.13.0"
	$(PY) -m uv pip install --quiet --python $(PY) -e ".[test]" \
	  || $(PY) -m pip install --quiet --no-compile -e ".[test]"
	$(PY) -c "import compileall, sysconfig; \
	  compileall.compile_dir(sysconfig.get_paths()['purelib'], quiet=2, workers=0)"
	touch $(STAMP)

# JupyterLab on notebooks/01-why-scale.ipynb with the course's settings (tools/course.py);
# extra JupyterLab options go in LAB_ARGS, e.g. make course LAB_ARGS=--ip=0.0.0.0
course: setup
	$(PY) tools/course.py $(LAB_ARGS)

# The whole suite: library tests and every notebook under nbval, on TEST_WORKERS processes
# (pytest-xdist; a notebook's cells, and each test file, stay on one worker); the slowest
# tests are printed at the end, so that the next slowdown is seen. TEST_WORKERS=1 runs it
# in one process.
# One compute thread per process: the workers, their kernels and their ranks share the
# cores, and torch's threads spinning against each other slow a step down 10x. Python writes
# its compiled modules (PYTHONDONTWRITEBYTECODE emptied, where the environment sets it):
# the suite starts a hundred interpreters (kernels, fork servers, labs), and each would
# otherwise compile lessonlib and pytest rewrite every test module again.
# Each worker takes a whole test file or notebook at a time, the longest first as last
# measured (tests/durations.json, tests/scope_order.py; xdist's own order, the files with
# the most tests first, left the slowest single tests to the end, one worker waiting).
TEST_WORKERS ?= 2
SUITE = PYTHONDONTWRITEBYTECODE= OMP_NUM_THREADS=1 $(PY) -m pytest tests notebooks --nbval-lax \
  --nbval-cell-timeout=600 -q -rs \
  $(if $(filter 1,$(TEST_WORKERS)),-p no:xdist,-n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder)
test: setup
	$(SUITE) --durations=15

# The whole suite, writing each scope's seconds to tests/durations.json (the order of
# the next runs); commit the file when it has changed much.
durations: setup
	$(SUITE) --store-durations

# Library tests only (no notebooks), for quick iteration.
test-fast: setup
	$(PY) -m pytest tests -q

# Rebuild every notebook from its paired .py file and execute it (for authors).
notebooks: setup
	$(PY) tools/notebooks.py build

# A static HTML site of the executed course, in site/.
site: setup
	$(PY) tools/build_site.py --out site

bench: setup
	$(PY) labs/launch_overhead.py

clean:
	rm -rf $(VENV) build site results .pytest_cache
