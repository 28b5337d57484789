# Two commands matter (see README):  make course   and   make test
# Both create .venv and install everything on first use; later runs reuse it.

PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed

.PHONY: setup course test test-cpus test-alone test-fast durations notebooks bench site clean class-setup class-test hub

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
PYTEST = PYTHONDONTWRITEBYTECODE= OMP_NUM_THREADS=1 $(PY) -m pytest
NBVAL = --nbval-lax --nbval-cell-timeout=600 -q -rs \
  $(if $(filter 1,$(TEST_WORKERS)),-p no:xdist,-n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder)
# ALONE: tests that run by themselves after the suite (make test-alone, which .ci/run calls);
# none now (torchft's kill-and-recover run is back in the suite: its restart no longer beats
# the Lighthouse's join timeout, lessonlib/faults/replicas.py).
ALONE =
SUITE = $(PYTEST) tests notebooks --ignore=tests/classroom $(addprefix --deselect ,$(ALONE)) $(NBVAL)
test: setup
	$(SUITE) --durations=15

test-alone: setup
	$(if $(ALONE),$(PYTEST) -q -rs $(ALONE),@echo "no test runs alone (Makefile, ALONE)")

# Every notebook once more as another CPU computes. PyTorch picks its CPU kernels by the CPU's
# capability (DEFAULT, AVX2, AVX512; ATEN_CPU_CAPABILITY forces one, never above what the CPU
# has) and MKL its matrix code by the CPU's instructions (MKL_ENABLE_INSTRUCTIONS), and the
# last bits of a float change with them: a checked output (# NBVAL_CHECK_OUTPUT) that depends
# on them passes here and fails on a student's laptop. This runs the notebooks with the plain,
# unvectorised kernels (AVX2's where this CPU's own are the plain ones) and MKL's SSE4.2 code,
# so such an output fails here first; .ci/run calls it after make test.
OTHER_CPU = ATEN_CPU_CAPABILITY=$(if $(filter default,$(shell $(PY) -c "import torch; \
  print(torch.backends.cpu.get_cpu_capability().lower())")),avx2,default) MKL_ENABLE_INSTRUCTIONS=SSE4_2
test-cpus: setup
	$(OTHER_CPU) $(PYTEST) notebooks $(NBVAL)

# The whole suite, writing each scope's seconds to tests/durations.json (the order of
# the next runs); commit the file when it has changed much.
durations: setup
	$(SUITE) --store-durations

# Library tests only (no notebooks), for quick iteration.
test-fast: setup
	$(PY) -m pytest tests -q --ignore=tests/classroom

# Rebuild every notebook from its paired .py file and execute it (for authors).
notebooks: setup
	$(PY) tools/notebooks.py build

# A static HTML site of the executed course, in site/.
site: setup
	$(PY) tools/build_site.py --out site

# The class (docs/instructor.md): JupyterHub and the grader's kernels (pyproject's [class]),
# the Hub's proxy from npm into hub/node_modules, and lessonlib compiled once (the students'
# kernels only read the shared copy).
CLASS_STAMP = $(VENV)/.class-installed
class-setup: $(CLASS_STAMP) hub/node_modules/.package-lock.json
$(CLASS_STAMP): $(STAMP)
	$(PY) -m uv pip install --quiet --python $(PY) -e ".[test,class]" \
	  || $(PY) -m pip install --quiet --no-compile -e ".[test,class]"
	$(PY) -m compileall -q lessonlib
	touch $(CLASS_STAMP)
hub/node_modules/.package-lock.json: hub/package.json hub/package-lock.json
	npm ci --prefix hub --no-audit --no-fund

# The class's tests: a real JupyterHub with two students, and the grading path
class-test: class-setup
	OMP_NUM_THREADS=1 $(PY) -m pytest tests/classroom -q -rs --durations=5

# The class's JupyterHub on http://127.0.0.1:8000 with the student versions of the notebooks;
# JupyterHub's options go in HUB_ARGS, e.g. make hub HUB_ARGS="--Spawner.cpu_limit=2"
hub: class-setup
	$(PY) tools/grade.py release
	$(VENV)/bin/jupyterhub -f hub/jupyterhub_config.py $(HUB_ARGS)

bench: setup
	$(PY) labs/launch_overhead.py

clean:
	rm -rf $(VENV) build site results .pytest_cache
