"""Plots and widgets: thin layers over the pure cost model and over measured results."""

from lessonlib.viz import figure_check as _figure_check

_figure_check.install_if_asked()     # the test suite's check of every figure drawn
