"""Naive model parallelism: a model's layers split over p ranks, run as an assembly line.

What it teaches: when a model does not fit on one device, the simplest split gives each of
p ranks a contiguous run of layers (a *stage*, a room of the castle). The forward pass is an
assembly line: stage 0 runs its layers and sends the activation to stage 1, which waits for
it, runs, sends on; the last stage computes the loss and the backward pass runs the line in
reverse, each stage sending the gradient of its input back upstream. Memory per rank drops
to about 1/p of the parameters, but only one rank works at a time: with balanced stages each
rank idles (p-1)/p of the step. Pipeline parallelism (GPipe, Huang et al. 2019) fixes that
by cutting the batch into micro-batches; this module is the m = 1 case it starts from.

``assembly_line`` runs on the ranks and records, per rank, a timeline of ``Span`` s (forward
F, backward B, waiting for a message RECV_F / RECV_B, sending SEND_F / SEND_B, optimizer OPT)
in seconds from a barrier that lines the ranks up, the bytes of parameters it holds, and the
bytes of activations autograd kept for its backward pass. All ranks measure from one origin
on the wall clock (the earliest rank's time after the barrier), so on one machine their
timelines line up exactly; across machines, as well as their clocks agree.
``single_process`` trains the same model on the same batches in one process;
``compare_parity`` compares the two.

Every message goes through ``lessonlib.comm`` (p2p ``dst``/``src`` are global ranks). With a
world of n ranks and p dividing n, ranks form n/p independent lines of p consecutive ranks;
``lines=k`` runs only the first k lines (k x p <= n) and the other ranks sit the run out, so
one launch can measure every p from 1 to n without idle lines competing for the cores.
``line_record`` turns one line's results into the numbers ``labs/mp.py`` stores.

Read in this order, each file one idea:

* ``line``: the assembly line: the model and its batches, ``stage_step`` (one batch through
  one stage: receive, forward, send on; receive the gradient, backward, send it back) and
  ``assembly_line``, which trains with it on every rank;
* ``recorder``: ``LineRecorder``, what the line measures, handed to ``stage_step`` from
  outside: each phase one span on a clock all ranks share, and the activations the forward
  keeps for backward;
* ``line_runs``: the same training in one process, ``compare_parity`` against it, and the
  line's idle share, step time and bytes per stage (``summarize``, ``line_record``).

Laptop:  ``python -c "from lessonlib import model_parallel as mp;
         print(mp.summarize(mp.run_assembly_line(4, model='mlp')))"``
GPU box: the same call runs one stage per GPU over NCCL; under torchrun use ``lessonlib.run``.
"""
from lessonlib.model_parallel.line import (MODEL_KINDS, assembly_line, boundary_shape,
                                          check_line, loss_of, make_batch, make_model,
                                          run_assembly_line, stage_step)
from lessonlib.model_parallel.recorder import LineRecorder
from lessonlib.model_parallel.line_runs import (compare_parity, idle_fraction, line_record,
                                                single_process, summarize)

__all__ = ["MODEL_KINDS", "assembly_line", "boundary_shape", "check_line", "loss_of",
           "make_batch", "make_model", "run_assembly_line", "stage_step", "LineRecorder",
           "idle_fraction", "line_record", "compare_parity", "single_process",
           "summarize"]
