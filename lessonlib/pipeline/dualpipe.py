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

from lessonlib.pipeline.actions import (B, F, Schedule, W, add_communication, check_schedule_args,
                                        describe, overlapped)


def dualpipev_order(p: int, m: int, stage: int) -> list:
    """Device ``stage``'s compute order under DualPipeV (steps 1-8 of the module docstring,
    as PyTorch 2.13's ``ScheduleDualPipeV._calculate_single_rank_operations``)."""
    check_schedule_args(p, m, 2, stage=stage)
    d, order, queue = stage, [], []              # queue: split B's whose W is still to run
    nxt = {(kind, c): 0 for kind in "FB" for c in (0, 1)}

    def take(kind, chunk):                       # the next micro-batch's F or B of a chunk
        nxt[kind, chunk] += 1
        return (F if kind == "F" else B)(nxt[kind, chunk] - 1, chunk)

    def split(chunk):                            # a B whose W is held back
        b = take("B", chunk)
        queue.append(W(b.microbatch, chunk))
        return b

    def fb(f_chunk, b_chunk):                    # one F&B slot
        return overlapped(take("F", f_chunk), take("B", b_chunk))

    order += [take("F", 0) for _ in range(2 * (p - 1 - d))]
    for _ in range(d + 1):
        order += [take("F", 0), take("F", 1)]
    def weight():                                # the oldest held-back W, if any
        return [queue.pop(0)] if queue else []

    for _ in range(p - 1 - d):
        order += [split(1), *weight(), take("F", 1)]
    for i in range(m - 2 * p + d + 1):
        first = [take("F", 0), take("B", 1)] if i == 0 and d == p - 1 else fb(0, 1)
        order += first + fb(1, 0)
    for _ in range(p - 1 - d):
        order += [take("B", 1), *fb(1, 0)]
    zb = False                                   # from the middle on, W split off
    for i in range(d + 1):
        zb = zb or (i == (d + 1) // 2 and d % 2 == 1)
        order.append(split(1) if zb else take("B", 1))
        zb = zb or (i == (d + 1) // 2 and d % 2 == 0)
        order.append(split(0) if zb else take("B", 0))
    for _ in range(p - 1 - d):
        order += [*weight(), split(0)]
    return order + queue


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
