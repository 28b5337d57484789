"""Lab plumbing: what every script in ``labs/`` shares, kept out of the lessons.

* ``labargs``: the labs' common command line, checked before any process starts (one
  clear line for a bad setting);
* ``labkit``: running a lab's worker on its ranks, timing it honestly (warm-up, medians)
  and writing its record, one JSON shape for every lab;
* ``results``: those records (and ``labs/sweep.py``'s tables) read back as flat rows for a
  table or a plot.

Import from the defining module: ``from lessonlib.lab import labkit``.
"""
