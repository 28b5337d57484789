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
* ``zbv(p, m)`` (ZBV): two chunks per device in a V (device d runs virtual stages d and
  2p-1-d), so the first and the last virtual stage are on device 0 and the gradient turns
  round on device p-1 without a message. The order is the one a greedy list scheduler finds
  with equal times for F, B and W: a B first (someone waits for it), else a forward (the
  deeper chunk first; a new micro-batch only while fewer than 2p chunk-activations are held),
  else a W. About zero bubble at equal times once m >= 2p (the V-shaped schedules of Qi et
  al., arXiv 2405.15362), at 1F1B's memory (p micro-batches of activations).

Both are pure functions like ``one_f_one_b``; ``make("zb-h1", p, m)`` and
``make("zbv", p, m, v=2)`` reach them too.

Laptop:  ``python -m lessonlib.pipeline.zero_bubble`` prints ZB-H1 and ZBV for p=4, m=8.
GPU box: the same; a schedule does not depend on the hardware it runs on.
"""
from __future__ import annotations

from lessonlib.pipeline.actions import (B, F, Schedule, W, add_communication, check_settings,
                                        describe, place, virtual_stage)


def zero_bubble_h1_order(p: int, m: int, stage: int) -> list:
    """Stage ``stage``'s compute order under ZB-H1.

    1F1B's warm-up (min(p - stage - 1, m) forwards), then F(next), B(oldest); each B's W
    waits in a queue, and the stage runs the oldest W whenever more than ``stage`` are
    waiting; the last ``stage`` W's fill the end of the step."""
    check_settings(p, m, stage=stage)
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
    check_settings(p, m)
    return add_communication([zero_bubble_h1_order(p, m, s) for s in range(p)])


def zbv_orders(p: int, m: int) -> list[list]:
    """Every device's compute order under ZBV, found by playing the V with unit times.

    Each tick every device starts one ready action: a B (oldest micro-batch first), else an
    F (chunk 1 before chunk 0), else the oldest W. A device holding 2p chunk-activations
    (each held from its F to its W) runs a W first and takes no new micro-batch."""
    check_settings(p, m, 2)
    last = 2 * p - 1
    done: dict[tuple, int] = {}                  # (kind, mb, vstage) -> tick it finished
    todo = {(kind, k): 0 for kind in "FB" for k in range(last + 1)}  # next micro-batch
    orders: list[list] = [[] for _ in range(p)]
    held, waiting = [0] * p, [[] for _ in range(p)]

    def ready(kind, k, now):
        """The micro-batch whose ``kind`` on virtual stage k can start now, or None."""
        mb = todo[kind, k]
        need = ("F", mb, k - 1) if kind == "F" else ("F", mb, k) if k == last else \
            ("B", mb, k + 1)
        if mb < m and (kind == "F" and k == 0 or done.get(need, now + 1) <= now):
            return mb
        return None

    now = 0
    while any(n < m for n in todo.values()) or any(waiting):
        for d in range(p):
            ks = [virtual_stage(d, c, p, "v") for c in (1, 0)]          # the deeper first
            full = held[d] >= 2 * p
            backs = [(mb, -k) for k in ks if (mb := ready("B", k, now)) is not None]
            fronts = [k for k in ks if ready("F", k, now) is not None and (k or not full)]
            if full and waiting[d] or not (backs or fronts):
                if waiting[d]:
                    orders[d].append(waiting[d].pop(0))
                    held[d] -= 1
                continue
            kind, k = ("B", -min(backs)[1]) if backs else ("F", fronts[0])
            mb, chunk = todo[kind, k], place(k, p, "v")[1]
            todo[kind, k] += 1
            done[kind, mb, k] = now + 1
            orders[d].append(F(mb, chunk) if kind == "F" else B(mb, chunk))
            held[d] += kind == "F"
            if kind == "B":
                waiting[d].append(W(mb, chunk))
        now += 1
    return orders


def zbv(p: int, m: int) -> Schedule:
    """ZBV: two chunks per device in a V, B and W split, about zero bubble at equal times."""
    return add_communication(zbv_orders(p, m), v=2, placement="v")


if __name__ == "__main__":
    print("ZB-H1\n" + describe(zero_bubble_h1(4, 8)))
    print("ZBV\n" + describe(zbv(4, 8)))
