"""Stop `make setup` with one line when its Python is not one the course supports.

    python3 tools/check_python.py python3          # before .venv is made: the Python to use
    .venv/bin/python tools/check_python.py .venv   # a .venv made earlier

Run by the Makefile before it makes or reuses .venv, so a wrong Python (3.9, say) never
gets as far as pip's "ResolutionImpossible", and never leaves a .venv that a later run,
with the right Python, would reuse. Written for old Pythons too (no f-strings).
"""
import sys

LOWEST, HIGHEST = (3, 10), (3, 12)      # README: "Python 3.10-3.12"; pyproject: >=3.10
SUPPORTED = "{}.{}-{}.{}".format(*(LOWEST + HIGHEST))


def problem(version, what):
    """The one line to stop with, or None when ``version`` (sys.version_info) is supported."""
    if LOWEST <= tuple(version[:2]) <= HIGHEST:
        return None
    found = ".".join(str(part) for part in version[:3])
    if what.endswith("venv"):
        return ("{} was made with Python {}, and the course needs Python {}: remove it "
                "(rm -rf {}) and run make setup PYTHON=python3.11".format(
                    what, found, SUPPORTED, what))
    return ("make setup: {} is Python {}, and the course needs Python {} (tested with 3.11): "
            "run make setup PYTHON=python3.11 (or another {})".format(
                what, found, SUPPORTED, SUPPORTED))


if __name__ == "__main__":
    line = problem(sys.version_info, sys.argv[1] if len(sys.argv) > 1 else sys.executable)
    if line:
        sys.stderr.write(line + "\n")
        sys.exit(1)
