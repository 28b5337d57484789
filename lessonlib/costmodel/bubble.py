"""The pipeline bubble: the time stages wait for work at the start and end of every step.

With p balanced stages and m micro-batches, a flush schedule (GPipe or 1F1B) leaves each
stage idle for p-1 micro-batch slots. Two papers write the same fact two ways:

* ``convention="wall"``: idle share of the step's wall time, (p-1)/(m+p-1)
  (GPipe, Huang et al. 2019, §2.3). With v interleaved chunks: (p-1)/(v*m + p-1).
* ``convention="ideal"``: bubble time relative to the ideal (bubble-free) compute time,
  (p-1)/m, and (p-1)/(v*m) interleaved (Megatron-LM 2021, Narayanan et al., §2.2).

p=4, m=8: 3/11 = 27.3 % of wall time, or 3/8 = 37.5 % of ideal time; v=2: 18.75 %.
Always say which convention a number uses.

1F1B does not shrink the bubble; it caps memory: a stage holds activations for at most
min(p - stage, m) micro-batches instead of GPipe's m (PipeDream-Flush, Narayanan et al. 2021
ICML, §3.2; Megatron-LM 2021 §2.2.1).

Try ``python -c "from lessonlib.costmodel import bubble_fraction as f; print(f(4, 8),
f(4, 8, convention='ideal'))"``.
"""
from lessonlib.argcheck import positive_int

CONVENTIONS = ("wall", "ideal")


def _check(p, m, v):
    for name, value in (("p", p), ("m", m), ("v", v)):
        positive_int(name, value)


def bubble_fraction(p, m, v=1, convention="wall"):
    """Pipeline bubble for p stages, m micro-batches, v chunks per stage.

    "wall": (p-1)/(v*m + p-1), share of the step's wall time (GPipe §2.3 for v=1).
    "ideal": (p-1)/(v*m), relative to bubble-free compute time (Megatron-LM 2021 §2.2).
    """
    _check(p, m, v)
    if convention == "wall":
        return (p - 1) / (v * m + p - 1)
    if convention == "ideal":
        return (p - 1) / (v * m)
    raise ValueError(f"convention={convention!r} must be one of {', '.join(CONVENTIONS)}")


def stashed_microbatches(schedule, p, m, stage=0):
    """Micro-batches whose activations ``stage`` (0-based) holds at its peak.

    "1f1b": min(p - stage, m); "gpipe": m.
    """
    _check(p, m, 1)
    if not isinstance(stage, int) or not 0 <= stage < p:
        raise ValueError(f"stage={stage!r} must be an integer in 0..{p - 1} for p={p}")
    if schedule == "1f1b":
        return min(p - stage, m)
    if schedule == "gpipe":
        return m
    raise ValueError(f"schedule={schedule!r} must be '1f1b' or 'gpipe'")
