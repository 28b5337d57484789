"""Zero-bubble schedules: split each backward into B and W, and fill the bubble with the W's.

What it teaches: 1F1B's bubble is not a law of nature. The backward of a stage does two jobs:
the gradient with respect to its *input* (B), which the previous stage is waiting for, and
the gradient with respect to its *weights* (W), which nobody waits for. Run B at once and
send it upstream; keep what W needs and run W later, in the time the stage would otherwise
sit idle (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024).

* ``zero_bubble_h1(p, m)`` (ZB-H1): 1F1B's forwards and B's in 1F1B's order, the gradient
  travelling upstream at B's speed, and stage s holding back s of its W's to fill the end of
  the step. Bubble (p-1)(T_F + T_B - T_W) instead of 1F1B's (p-1)(T_F + T_B + T_W)
  (Qi et al., Table 2): a third of it when the three are equal; every stage holds at most p
  micro-batches (until their W), 1F1B's peak.
* ``zbv(p, m)`` (ZB-V, Qi et al. §6): two chunks per device in a V (device d runs virtual
  stages d and 2p-1-d), so the first and the last virtual stage are on device 0 and the
  gradient turns round on device p-1 without a message. Warm-up forwards of chunk 0, then
  of both chunks, then the steady state F B W of chunk 0 and F B W of chunk 1 per
  micro-batch, with the cool-down's W's held back to fill its waits (the order PyTorch's
  ``ScheduleZBVZeroBubble`` builds). At T_F = T_B = T_W per chunk and m >= 2p-1 every device
  idles only (p-1) T_F, the time the first micro-batch needs to reach the last device,
  which no schedule starting from an empty pipeline avoids: a sixth of 1F1B's bubble,
  whatever m (at unequal times more, but still not growing with m). It holds at most 2p
  half-size chunk activations per device: p micro-batches, 1F1B's peak on its first stage.
  Device d's order, step by step:

  1. warm-up: 2(p - d) - 1 forwards of chunk 0; then d pairs F(chunk 1), F(chunk 0); then
     p - d rounds F, B, W of chunk 1 (the gradient turns round);
  2. steady state, until every forward is out: F(chunk 0), B W (chunk 0), F B W (chunk 1):
     one micro-batch through both chunks, each B followed by its W;
  3. cool-down: d pairs B(chunk 0), B(chunk 1) with their W's held back, then p - d rounds
     B, W of chunk 0, and the held-back W's fill the wait at the end.

Both are pure functions like ``one_f_one_b``; ``make("zb-h1", p, m)`` and
``make("zbv", p, m, v=2)`` reach them too.

Laptop:  ``python -m lessonlib.pipeline.zero_bubble`` prints ZB-H1 and ZBV for p=4, m=8.
GPU box: the same; a schedule does not depend on the hardware it runs on.
"""
from __future__ import annotations

from lessonlib.pipeline.actions import (B, F, MicrobatchCursor, Schedule, W, add_communication,
                                        check_schedule_args, describe)


def zero_bubble_h1_order(p: int, m: int, stage: int) -> list:
    """Stage ``stage``'s compute order under ZB-H1.

    1F1B's warm-up (min(p - stage - 1, m) forwards), then F(next), B(oldest); each B's W
    waits in a queue, and the stage runs the oldest W whenever more than ``stage`` are
    waiting; the last ``stage`` W's fill the end of the step."""
    check_schedule_args(p, m, stage=stage)
    warmup = min(p - stage - 1, m)
    order = [F(i) for i in range(warmup)]
    waiting = []
    for i in range(m):
        if warmup + i < m:
            order.append(F(warmup + i))
        order.append(B(i))
        waiting.append(W(i))
        if len(waiting) > stage:
            order.append(waiting.pop(0))
    return order + waiting


def zero_bubble_h1(p: int, m: int) -> Schedule:
    """ZB-H1 (Qi et al. 2024): 1F1B's memory, a third of its bubble at T_F = T_B = T_W."""
    check_schedule_args(p, m)
    return add_communication([zero_bubble_h1_order(p, m, s) for s in range(p)])


def zbv_order(p: int, m: int, stage: int) -> list:
    """Device ``stage``'s compute order under ZB-V (steps 1-3 of the module docstring; the
    order PyTorch's ``ScheduleZBVZeroBubble`` builds). Chunk 0 is virtual stage ``stage``,
    chunk 1 virtual stage 2p-1-``stage``; n = max(m, 2p-1) micro-batches are laid out, then
    those >= m dropped."""
    check_schedule_args(p, m, 2, stage=stage)
    n, nxt = max(m, 2 * p - 1), MicrobatchCursor()
    order = nxt.take(*["F0"] * (2 * (p - stage) - 1))
    for _ in range(stage):
        order += nxt.take("F1", "F0")
    for _ in range(p - stage):
        order += nxt.take("F1", "B1", "W1")
    while nxt.taken["F1"] < nxt.taken["F0"] or nxt.taken["F0"] < n:
        if nxt.taken["F0"] < n:
            order += nxt.take("F0")
        order += nxt.take("B0", "W0", "F1", "B1", "W1")
    for _ in range(stage):
        order += nxt.take("B0", "B1")
    for _ in range(p - stage):
        order += nxt.take("B0", "W0")
    order += nxt.take(*["W1"] * (n - nxt.taken["W1"]), *["W0"] * (n - nxt.taken["W0"]))
    return [a for a in order if a.microbatch < m]


def zbv(p: int, m: int) -> Schedule:
    """ZB-V: two chunks per device in a V, B and W split. At T_F = T_B = T_W (per chunk) and
    m >= 2p-1 every device idles (p-1) T_F: only the time the first micro-batch takes to reach
    the last device, which no schedule can avoid; fewer micro-batches never fill the V and
    leave 2(2p-1-m) T_F. Each device holds at most 2p chunk activations (p micro-batches)."""
    check_schedule_args(p, m, 2)
    return add_communication([zbv_order(p, m, d) for d in range(p)], v=2, placement="v")


if __name__ == "__main__":
    print("ZB-H1\n" + describe(zero_bubble_h1(4, 8)))
    print("ZBV\n" + describe(zbv(4, 8)))
