"""Pipeline schedules as data: GPipe, 1F1B and interleaved 1F1B, one list of actions per stage.

What it teaches: a pipeline schedule is nothing but, for every stage (device), the order in
which it runs the forward (F) and backward (B) of each micro-batch, plus the messages those
need (the language is ``actions``: ``F``, ``B``, ``W``, ``add_communication``). These
functions are pure (no torch, no processes): the validator checks and simulates their
output, the executor runs it, the plots draw it. The zero-bubble schedules, which split
the backward into B and W, are in ``zero_bubble``, DualPipeV (F&B slots) in ``dualpipe``;
``make`` builds any of them by name.

* ``gpipe(p, m)``: all m forwards, then all m backwards (Huang et al. 2019). Every stage
  keeps the activations of all m micro-batches until their backward.
* ``one_f_one_b(p, m)``: PipeDream-Flush (Narayanan et al. 2021, §3.2): stage s runs
  p - s - 1 warm-up forwards, then alternates one forward and one backward, then drains the
  remaining backwards. Same bubble as GPipe, but stage s holds at most min(p - s, m)
  micro-batches.
* ``interleaved_one_f_one_b(p, m, v)``: Megatron-LM 2021 §2.2.2: each device holds v model
  chunks (device d runs virtual stages d, d + p, ..., d + (v-1)p), which shrinks the bubble
  to (p-1)/(v m) of ideal time at v times the messages. m must be a multiple of p.

Micro-batches fewer than stages (m < p) are allowed for GPipe and 1F1B (the pipeline never
fills; the bubble formulas still hold).

Laptop:  ``python -m lessonlib.pipeline.schedules`` prints 1F1B for p=4, m=8.
GPU box: the same; a schedule does not depend on the hardware it runs on.
"""
from __future__ import annotations

from lessonlib.pipeline.actions import (Action, B, F, Schedule, add_communication, check_schedule_args,
                                        describe)
from lessonlib.pipeline.dualpipe import dualpipev
from lessonlib.pipeline.zero_bubble import zbv, zero_bubble_h1


# ---------------------------------------------------------------- the schedules
def gpipe(p: int, m: int) -> Schedule:
    """GPipe: every stage runs F0..F(m-1), then B0..B(m-1) (the order PyTorch's ScheduleGPipe
    uses). Peak stash: m micro-batches on every stage."""
    check_schedule_args(p, m)
    order = [F(i) for i in range(m)] + [B(i) for i in range(m)]
    return add_communication([list(order) for _ in range(p)])


def one_f_one_b_order(p: int, m: int, stage: int) -> list[Action]:
    """Stage ``stage``'s compute order under 1F1B (PipeDream-Flush).

    warm-up: min(p - stage - 1, m) forwards; steady state: F(next), B(oldest); cool-down:
    the remaining backwards. At most min(p - stage, m) micro-batches are in flight."""
    check_schedule_args(p, m, stage=stage)
    warmup = min(p - stage - 1, m)
    order = [F(i) for i in range(warmup)]
    for i in range(m - warmup):
        order += [F(warmup + i), B(i)]
    order += [B(i) for i in range(m - warmup, m)]
    return order


def one_f_one_b(p: int, m: int) -> Schedule:
    """1F1B (PipeDream-Flush, Narayanan et al. 2021): same bubble as GPipe, stage s stashes
    at most min(p - s, m) micro-batches instead of m."""
    check_schedule_args(p, m)
    return add_communication([one_f_one_b_order(p, m, s) for s in range(p)])


def interleaved_order(p: int, m: int, v: int, stage: int) -> list[Action]:
    """Device ``stage``'s compute order under Megatron-LM 2021's interleaved 1F1B.

    The k-th forward on a device is of chunk (k // p) % v and micro-batch
    (k // (p v)) p + k % p: groups of p micro-batches go through chunk 0, then chunk 1, ...
    Backwards visit the chunks in reverse. Warm-up: 2(p - stage - 1) + (v - 1) p forwards
    (all of them when m = p), then one forward one backward, then the cool-down."""
    check_schedule_args(p, m, v, stage=stage)
    total = m * v

    def unit(k, forward):
        chunk = (k // p) % v
        mb = (k // (p * v)) * p + k % p
        return F(mb, chunk) if forward else B(mb, v - 1 - chunk)

    warmup = total if m == p else min(2 * (p - stage - 1) + (v - 1) * p, total)
    order = [unit(k, True) for k in range(warmup)]
    for k in range(total - warmup):
        order += [unit(warmup + k, True), unit(k, False)]
    order += [unit(k, False) for k in range(total - warmup, total)]
    return order


def interleaved_one_f_one_b(p: int, m: int, v: int = 2) -> Schedule:
    """Interleaved 1F1B with v chunks per device (Megatron-LM 2021 §2.2.2).

    m must be a multiple of p (micro-batches travel in groups of p); v = 1 is plain 1F1B."""
    check_schedule_args(p, m, v)
    if v == 1:
        return one_f_one_b(p, m)
    if m % p:
        lower, upper = (m // p) * p, (m // p + 1) * p
        hint = f"{lower} or {upper}" if lower else f"{upper}"
        raise ValueError(f"interleaved 1F1B needs m to be a multiple of p (micro-batches move "
                         f"in groups of p); got m={m}, p={p}: use m={hint}")
    return add_communication([interleaved_order(p, m, v, s) for s in range(p)], v)


SCHEDULES = {"gpipe": gpipe, "1f1b": one_f_one_b, "interleaved": interleaved_one_f_one_b,
             "zb-h1": zero_bubble_h1, "zbv": zbv, "dualpipev": dualpipev}
V_SHAPED = ("zbv", "dualpipev")


def make(name: str, p: int, m: int, v: int | None = None) -> Schedule:
    """Build a schedule by name: 'gpipe', '1f1b', 'interleaved' (v chunks per device),
    'zb-h1', 'zbv' or 'dualpipev' (the last two: two chunks per device in a V, v=2, the
    default for them)."""
    if not isinstance(name, str) or name not in SCHEDULES:
        raise ValueError(f"schedule={name!r} is not one of {', '.join(SCHEDULES)}")
    v = (2 if name in V_SHAPED else 1) if v is None else v
    check_schedule_args(p, m, v)
    if name == "interleaved":
        return interleaved_one_f_one_b(p, m, v)
    if name in V_SHAPED:
        if v != 2:
            raise ValueError(f"v={v}: schedule={name!r} runs exactly two chunks per device (the "
                             f"two arms of the V); use v=2")
        return SCHEDULES[name](p, m)
    if v != 1:
        raise ValueError(f"v={v} chunks per device needs schedule='interleaved' (or 'zbv' or "
                         f"'dualpipev', v=2); {name!r} runs one chunk per device (v=1)")
    return SCHEDULES[name](p, m)


if __name__ == "__main__":
    print(describe(one_f_one_b(4, 8)))
