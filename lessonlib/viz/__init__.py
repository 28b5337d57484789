"""Plots and widgets: thin layers over the pure cost model and over measured results."""
