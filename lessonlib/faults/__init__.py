"""When things go wrong at scale: a hung rank found, a straggler named, a replica lost and
recovered, and training across datacenters.

What it teaches: at the scale the course teaches, something always fails (Llama 3's 405B
pre-training logged 466 job interruptions in 54 days: the Llama 3 paper, section 3.3.4). The
questions are "which rank is stuck", "which rank is slow", "how do we go on" and, beyond one
datacenter, "how do we talk less". The files:

- ``hang_analysis``: every rank's flight record lined up by group and sequence number; the
  stuck collective, its group and the ranks that never came (``analyze``); PyTorch's own
  Flight Recorder dumps read into the same records (``from_torch_dump``);
- ``hangs``: three hangs planted in a synchronous step (a skipped collective, collectives
  in another order, a size that differs), each diagnosed from the launcher's dumps;
- ``stragglers``: each rank's compute and wait per step, and the rank that sets the pace,
  named by NVIDIA's Resiliency Extension's relative performance score;
- ``torchft_setup``: torchft's Lighthouse and replica managers, on loopback only (and what
  still listens on every interface);
- ``replicas``: three replica groups under torchft; one killed with SIGKILL, the others go
  on, it is restarted and recovers live from a peer; the one-process replay they equal;
- ``diloco``: DiLoCo and Streaming DiLoCo in a few lines (``StreamingDiLoCo``);
- ``diloco_runs``: it against torchft's ``DiLoCo`` and against data parallelism, with the
  ledger's bytes per token.

The ring each rank keeps is ``lessonlib.instruments.flight_recorder``; the launcher dumps
every rank's ring when a launch times out (``LaunchTimeout.flight``).

Laptop:  ``python -c "from lessonlib.faults import hangs; print(hangs.diagnose('skipped').finding)"``
GPU box: the same.
"""
