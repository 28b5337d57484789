"""One interval on one stage's timeline: what the course's Gantt charts are drawn from.

What it teaches: a timeline is a list of spans (what ran, which micro-batch and chunk, from
when to when), whether simulated (``lessonlib.pipeline.validate.simulate``) or measured on
real ranks (the assembly line of ``lessonlib.model_parallel``, the pipeline executor,
PyTorch's pipelining); one record for all of them lets the same plots and checks read each.

Laptop:  ``python -c "from lessonlib.spans import Span; print(Span('F', 0, 0, 0.0, 1.0))"``
GPU box: the same (pure Python).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Span:
    """One interval on one stage's timeline (simulated cost units, or measured seconds).
    The assembly line of ``lessonlib.model_parallel`` records its spans with it too (one
    batch per step: micro-batch 0, and the training ``step`` it belongs to)."""
    kind: str          # F, B, W, OPT, RECV_F/RECV_B (waiting for data), SEND_F/SEND_B,
                       # RECV/SEND (a pipeline batch that receives / only sends)
    microbatch: int
    chunk: int
    start: float
    end: float
    step: int = 0
