"""Instruments: what the course measures, kept out of the algorithms they measure.

A core (DDP's hooks, the executor's step, a TP layer) calls none of these inline; it is
handed a recorder, or its messages are recorded by ``comm``. Each file one instrument:

* ``ledger``: every message a rank sends, with its bytes, group and seconds (``Event``,
  ``Ledger``; ``exposed_seconds`` is the time communication held the rank);
* ``spans``: named intervals of a rank's step on one clock (``Timeline``, ``no_record``),
  the raw material of every Gantt chart;
* ``breadcrumbs``: where each rank is now, so a hang names the rank and the step
  (``progress``);
* ``flight_recorder``: each rank's last N calls (op, group, sequence number, sizes, posted
  or completed) in a ring the launcher reads when a launch times out (``dump``);
* ``activations``: what autograd saves for backward, weights left out (``ActivationMeter``):
  the bytes of one forward pass (``saved_bytes``), and the live and peak bytes and
  micro-batches a pipeline stage holds (``Metered`` wraps a stage); the recomputation that
  keeps only a layer's input (``checkpoint``);
* ``placement``: an audit that a GPU run really computes on the GPU (what ran on the CPU
  instead is named, ``LeftOnCpu``);
* ``nccl_trace``, ``nccl_replay``, ``nccl_inflight``, ``nccl_rules``: the collectives each
  rank issued, replayed against NCCL's rules (communicators created in one order, calls
  matched in one order, at most one communicator in flight at once) to find what would
  hang on GPUs (``nccl_hazards``);
* ``claims``: a notebook's sentence about a result as a check that fails the notebook
  when it stops being true (``claim``, ``at_least``, ``at_most``, ``within``, ``every``).

Import from the defining module: ``from lessonlib.instruments.ledger import Ledger``.
"""
