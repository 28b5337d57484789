"""DualPipeV: a V of two chunks per device whose steady state overlaps a forward with a backward.

What it teaches: DeepSeek-V3 trains with DualPipe (DeepSeek-V3, Table 2), whose steady
state pairs the forward of one micro-batch with the backward of another in one slot, F&B:
while one of them waits on its communication (the expert all-to-alls, the pipeline's
messages) the other computes, so the communication hides behind the compute. DualPipeV is
DualPipe "cut in half" (DeepSeek's DualPipe repository, README, after Sea AI Lab): the same
slots on half the devices, each holding two chunks in a V as ZBV does (device d runs
virtual stages d and 2p-1-d). Per device, in the order PyTorch's ``ScheduleDualPipeV``
and DeepSeek's ``dualpipev.py`` build (chunk 0 is the way down, chunk 1 the way up):

1. 2(p-1-d) forwards of chunk 0;  2. d+1 pairs F chunk 0, F chunk 1;
3. p-1-d rounds B, W, F of chunk 1 (the gradient turns round; zero-bubble: W at once);
4. the steady state, m-2p+d+1 rounds of two slots, F&B = (F chunk 0 beside B chunk 1) and
   (F chunk 1 beside B chunk 0), the backwards whole (B and W in one); on the last device
   the very first pair runs unoverlapped, one after the other;
5. p-1-d rounds B chunk 1, (F chunk 1 & B chunk 0);  6. d+1 pairs B chunk 1, B chunk 0,
   the later half with W split off; 7. p-1-d rounds W, B chunk 0 (split); 8. the last W's.

Bubble, as DeepSeek's DualPipe README states it for DualPipeV on PP stages (PP/2 devices):
(PP/2 - 1)(F&B + B - 3W), i.e. (p-1)(F&B + B - 3W) on p devices, with F, B, W the times
of one chunk's forward, *full* backward and weight-gradient part, and F&B the time of one
overlapped slot; 2x a stage's parameters and PP + 1 activations per device (the same
table). ``bubble_formula`` is that formula; ``readme_times`` turns those times into
``validate.simulate``'s (a split B takes B - W, a whole one B, a slot F&B), e.g.
``simulate(dualpipev(4, 10), **readme_times(1, 2, 1, 3))``.

Laptop:  ``python -m lessonlib.pipeline.dualpipe`` prints DualPipeV for p=4, m=10 (the
         README's figure) and the README's bubble at F=1, B=2, W=1, F&B=3.
GPU box: the same; a schedule does not depend on the hardware it runs on.
"""
from __future__ import annotations

from lessonlib.pipeline.actions import (MicrobatchCursor, Schedule, add_communication,
                                        check_schedule_args, describe, overlapped)


def dualpipev_order(p: int, m: int, stage: int) -> list:
    """Device ``stage``'s compute order under DualPipeV (steps 1-8 of the module docstring,
    as PyTorch 2.13's ``ScheduleDualPipeV._calculate_single_rank_operations``)."""
    check_schedule_args(p, m, 2, stage=stage)
    d, nxt = stage, MicrobatchCursor()
    order = nxt.take(*["F0"] * (2 * (p - 1 - d)))
    for _ in range(d + 1):
        order += nxt.take("F0", "F1")
    for _ in range(p - 1 - d):
        order += nxt.split("B1") + nxt.held_w() + nxt.take("F1")
    for i in range(m - 2 * p + d + 1):
        first = nxt.take("F0", "B1")
        order += (first if i == 0 and d == p - 1 else overlapped(*first))
        order += overlapped(*nxt.take("F1", "B0"))
    for _ in range(p - 1 - d):
        order += nxt.take("B1") + overlapped(*nxt.take("F1", "B0"))
    zb = False                                   # from the middle on, W split off
    for i in range(d + 1):
        zb = zb or (i == (d + 1) // 2 and d % 2 == 1)
        order += nxt.split("B1") if zb else nxt.take("B1")
        zb = zb or (i == (d + 1) // 2 and d % 2 == 0)
        order += nxt.split("B0") if zb else nxt.take("B0")
    for _ in range(p - 1 - d):
        order += nxt.held_w() + nxt.split("B0")
    return order + nxt.held


def dualpipev(p: int, m: int) -> Schedule:
    """DualPipeV on p devices (2p virtual stages in a V) with m >= 2p micro-batches (what
    PyTorch's ``ScheduleDualPipeV`` requires: the steady state needs every device full)."""
    check_schedule_args(p, m, 2)
    if m < 2 * p:
        raise ValueError(f"DualPipeV needs at least as many micro-batches as virtual stages: "
                         f"m >= 2p = {2 * p}; got m={m}")
    return add_communication([dualpipev_order(p, m, d) for d in range(p)], v=2, placement="v")


def bubble_formula(p: int, forward: float, backward: float, weight: float,
                   overlapped: float) -> float:
    """DualPipeV's bubble per device as DeepSeek's DualPipe README states it for PP = 2p
    stages on p devices, (PP/2 - 1)(F&B + B - 3W) = (p-1)(F&B + B - 3W): ``backward`` is
    one chunk's *full* backward, ``weight`` its weight-gradient part, ``overlapped`` one
    F&B slot. ``validate.simulate`` reproduces it (the most idle device) where the
    chunk's F, input gradient and W take equal times, F = B - W = W, and
    max(F, B) <= F&B <= F + B; elsewhere the README's formula is an estimate
    (tests/test_pipeline_dualpipe.py shows both)."""
    return (p - 1) * (overlapped + backward - 3 * weight)


def readme_times(forward: float = 1.0, backward: float = 2.0, weight: float = 1.0,
                 overlapped: float | None = None) -> dict:
    """``validate.simulate``'s keyword times for the README's F, B (full), W and F&B: a B
    with its W split off takes B - W, a whole one B, an F&B slot ``overlapped`` (None: F + B,
    the two computes one after the other, as one CPU thread runs them)."""
    return {"forward": forward, "backward": backward - weight, "whole": backward,
            "weight": weight, "overlapped": overlapped}


if __name__ == "__main__":
    print(describe(dualpipev(4, 10)))
    print(f"bubble per device at F=1, B=2, W=1, F&B=3: {bubble_formula(4, 1, 2, 1, 3)}")
