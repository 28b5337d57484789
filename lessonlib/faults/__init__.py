"""When things go wrong at scale: a hung rank found, a straggler named.

What it teaches: at the scale the course teaches, something always fails (Llama 3's 405B
pre-training logged 466 job interruptions in 54 days: the Llama 3 paper, section 3.3.4). The
questions are "which rank is stuck", "which rank is slow" and "how do we go on". The files:

- ``hang_analysis``: every rank's flight record lined up by group and sequence number; the
  stuck collective, its group and the ranks that never came (``analyze``); PyTorch's own
  Flight Recorder dumps read into the same records (``from_torch_dump``);
- ``hangs``: three hangs planted in a synchronous step (a skipped collective, collectives
  in another order, a size that differs), each diagnosed from the launcher's dumps;
- ``stragglers``: each rank's compute and wait per step, and the rank that sets the pace,
  named by NVIDIA's Resiliency Extension's relative performance score.

The ring each rank keeps is ``lessonlib.instruments.flight_recorder``; the launcher dumps
every rank's ring when a launch times out (``LaunchTimeout.flight``).

Laptop:  ``python -c "from lessonlib.faults import hangs; print(hangs.diagnose('skipped'))"``
GPU box: the same.
"""
