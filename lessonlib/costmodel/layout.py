"""A layout: how one training step is split over t*p*d GPUs, and what it must satisfy.

``Layout(t, p, d, b, m or global_batch, v, ...)`` in Megatron-LM 2021's notation (Narayanan
et al.): t-way tensor, p-way pipeline with v chunks per stage, d-way data parallelism,
micro-batches of b sequences, m of them per step, so the global batch is B = b*m*d. Every
setting is checked when the layout is built, and ``check(model)`` checks it against a
model's shape, so a bad value fails at once with one line naming it, before any estimate.

Try ``python -c "from lessonlib.costmodel import Layout; print(Layout(t=8, p=12, d=4,
global_batch=1536).describe())"``.
"""
import math
from dataclasses import dataclass

from lessonlib.argcheck import positive_int

from .bubble import SCHEDULES
from .memory import RECOMPUTE_MODES
from .model import MAX, divisors


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class Layout:
    """How a step is split: t-way tensor, p-way pipeline (v chunks each), d-way data
    parallelism; micro-batches of b sequences, m per step, global batch B = b*m*d.

    Give either ``m`` or ``global_batch``; the other follows.
    """

    t: int = 1
    p: int = 1
    d: int = 1
    b: int = 1
    m: int = None
    global_batch: int = None
    v: int = 1
    recompute: str = "full"
    sequence_parallel: bool = False
    scatter_gather: bool = True
    schedule: str = "1f1b"
    zero_stage: int = 0

    def __post_init__(self):
        for name in ("t", "p", "d", "b", "v", "m", "global_batch"):
            value = getattr(self, name)
            if value is None and name in ("m", "global_batch"):
                continue
            positive_int(name, value, most=MAX)
        if not isinstance(self.recompute, str) or self.recompute not in RECOMPUTE_MODES:
            raise ValueError(f"recompute={self.recompute!r} must be one of "
                             f"{', '.join(RECOMPUTE_MODES)}")
        if not isinstance(self.schedule, str) or self.schedule not in SCHEDULES:
            raise ValueError(f"schedule={self.schedule!r} must be one of {', '.join(SCHEDULES)}")
        if not _is_int(self.zero_stage) or self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_stage={self.zero_stage!r} must be 0, 1, 2 or 3")
        if self.m is None and self.global_batch is None:
            raise ValueError("give m (micro-batches per step) or global_batch")
        per_step = self.b * self.d
        if self.m is None:
            if self.global_batch % per_step:
                raise ValueError(
                    f"global_batch={self.global_batch} is not divisible by d*b = {self.d}*"
                    f"{self.b} = {per_step}; use a multiple of {per_step}, e.g. "
                    f"{max(1, round(self.global_batch / per_step)) * per_step}")
            object.__setattr__(self, "m", self.global_batch // per_step)
        elif self.global_batch is None:
            object.__setattr__(self, "global_batch", self.m * per_step)
        if self.m < 1 or self.m * per_step != self.global_batch:
            raise ValueError(f"m={self.m} does not match global_batch={self.global_batch} "
                             f"= b*m*d with b={self.b}, d={self.d}")
        if self.v > 1 and self.schedule != "1f1b":
            raise ValueError(f"v={self.v} (interleaving) needs schedule='1f1b'")
        if self.v > 1 and self.m % self.p:
            raise ValueError(f"m={self.m} must be a multiple of p={self.p} for the "
                             f"interleaved schedule (v={self.v}); use v=1 or change the batch")

    @property
    def n_gpus(self):
        return self.t * self.p * self.d

    def check(self, model):
        """Raise ValueError, naming the setting, if this layout cannot run ``model``."""
        if self.p > model.L:
            raise ValueError(f"p={self.p} exceeds layers={model.L}: every stage needs a "
                             f"layer; use p <= {model.L}")
        if model.a % self.t or model.h % self.t:
            ok = divisors(math.gcd(model.a, model.h))
            shown = ", ".join(map(str, ok[:12])) + (", ..." if len(ok) > 12 else "")
            raise ValueError(f"t={self.t} must divide heads={model.a} and hidden={model.h}; "
                             f"use one of [{shown}]")
        if self.v > 1 and (model.L % self.p or (model.L // self.p) % self.v):
            raise ValueError(f"v={self.v} needs layers={model.L} to split into p*v = "
                             f"{self.p * self.v} equal chunks; use v=1 or a v dividing "
                             f"{model.L // self.p if model.L % self.p == 0 else 'L/p'}")

    def describe(self):
        extras = [f"v={self.v}"] if self.v > 1 else []
        extras += [f"recompute={self.recompute}"]
        extras += ["SP"] if self.sequence_parallel else []
        extras += [f"ZeRO-{self.zero_stage}"] if self.zero_stage else []
        return (f"t={self.t} p={self.p} d={self.d} b={self.b} m={self.m} "
                f"B={self.global_batch} " + " ".join(extras))
