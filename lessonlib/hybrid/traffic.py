"""Lesson 05's counts: how many parameters and messages each rank of a (dp, pp, tp) run should have.

What it teaches: on lesson 05's grid every number a rank sends is predictable from the layout.
``expected_param_count`` says how many parameters a rank of each pipeline stage holds;
``expected_traffic`` how many messages and bytes it sends per step (TP's all-reduces inside
the stage, PP's activations and gradients between stages, DP's one all-reduce of the
gradients, Megatron-LM 2021 §3.2), which ``measured_traffic`` reads from the step's ledgers
(``runs.RankRun.traffic``) so the two compare with ``==``.

Laptop:  ``python -c "from lessonlib.hybrid import traffic; from lessonlib.models import
         HYBRID_CONFIG; print(traffic.expected_traffic(HYBRID_CONFIG, 2, 2, 2, 8, 2, 0, 100))"``
GPU box: the same (pure: no process, no device).
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from lessonlib.hybrid.build import stage_counts
from lessonlib.hybrid.checks import check_layout
from lessonlib.hybrid.recorder import StepTraffic
from lessonlib.models import GPTConfig


@dataclass(frozen=True)
class Messages:
    """How many messages of one kind a rank sent in a step, and their payload bytes."""
    calls: int
    bytes: int


@dataclass(frozen=True)
class StepMessages:
    """One rank's messages in one step, per axis: TP's all-reduces, PP's sends, DP's
    all-reduce. ``expected_traffic`` predicts it, ``measured_traffic`` reads it; the two
    compare with ``==``."""
    tp_all_reduce: Messages
    pp_send: Messages
    dp_all_reduce: Messages

    def items(self) -> list[tuple[str, Messages]]:
        """(kind, messages) in the order above."""
        return [(f.name, getattr(self, f.name)) for f in fields(self)]


def expected_param_count(cfg: GPTConfig, pp: int, tp: int, stage: int) -> int:
    """Parameters on one rank of pipeline stage ``stage``: per layer, the split matrices and
    their biases (12h^2 + 7h) / t and the replicated LayerNorms and row-parallel biases (6h);
    the embeddings (V + s) h on the first stage, the head's LayerNorm and V x h on the last."""
    h = cfg.hidden
    layers = stage_counts(cfg.layers, pp)[stage] - (stage == 0) - (stage == pp - 1)
    count = layers * ((12 * h * h + 7 * h) // tp + 6 * h)
    count += (cfg.vocab + cfg.seq) * h if stage == 0 else 0
    return count + (2 * h + cfg.vocab * h if stage == pp - 1 else 0)


def expected_traffic(cfg: GPTConfig, dp: int, pp: int, tp: int, global_batch: int, m: int,
                     stage: int, param_count: int) -> StepMessages:
    """Messages one rank of pipeline stage ``stage`` sends per step, and their payload bytes
    (float32). TP: 4 all-reduces of b*s*h per layer per micro-batch (g twice forward, f
    twice backward; Megatron-LM 2021 §3.2). PP: one (b, s, h) activation forward and one
    gradient backward per micro-batch and boundary. DP: one all-reduce of the stage's grads."""
    b = check_layout(cfg, dp=dp, pp=pp, tp=tp, global_batch=global_batch, m=m)
    layers = stage_counts(cfg.layers, pp)[stage] - (stage == 0) - (stage == pp - 1)
    act = 4 * b * cfg.seq * cfg.hidden
    boundaries = (stage > 0) + (stage < pp - 1)
    tp_calls = 4 * layers * m if tp > 1 else 0
    return StepMessages(tp_all_reduce=Messages(tp_calls, tp_calls * act),
                        pp_send=Messages(boundaries * m, boundaries * m * act),
                        dp_all_reduce=Messages(int(dp > 1), 4 * param_count * (dp > 1)))


def measured_traffic(book: StepTraffic) -> StepMessages:
    """The same three numbers read from one step's ledgers (``RankRun.traffic[i]``)."""
    pipe, dp = book.pipe, book.dp
    zero = {"calls": 0, "bytes": 0}
    keep = lambda d: Messages(d["calls"], d["bytes"])  # noqa: E731
    return StepMessages(tp_all_reduce=keep(pipe.get("all_reduce", zero)),
                        pp_send=keep(pipe.get("send", zero)),
                        dp_all_reduce=keep(dp.get("all_reduce", zero)))
