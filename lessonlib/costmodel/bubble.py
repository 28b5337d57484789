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

Splitting the backward removes most of it (Qi et al., ICLR 2024): B (the input gradient)
goes upstream at once, W (the weight gradient) fills the idle time. Per stage, with T_F,
T_B (input gradient) and T_W (weight gradient) per micro-batch (``bubble_time``): 1F1B
(p-1)(T_F + T_B + T_W), ZB-H1 (p-1)(T_F + T_B - T_W) (Table 2), at 1F1B's memory; at equal
times a third: ``schedule="zb-h1"`` gives (p-1)/(3m) of ideal time. ZB-V (two chunks per
device in a V, §6) leaves only the start-up, one chunk's forward per hop: (p-1) T_F / 2, or
(p-1)/(6m) of ideal time at equal times once m >= 2p-1 (fewer micro-batches never fill the
V: 2(2p-1-m) chunk forwards); its busiest stage holds min(p, m) micro-batches like ZB-H1.

DualPipe (DeepSeek-V3, DeepSeek-AI 2024, Table 2) feeds the pipeline from both ends, each
device holding two stages (2x parameters, PP + 1 micro-batches of activations): bubble
(PP/2 - 1)(F&B + B - 3W), where F&B is a forward and a backward chunk run side by side, their
communication hidden behind each other's compute. DeepSeek's B is the *whole* backward (its
1F1B row reads (PP - 1)(F + B)), the course's T_B + T_W: at T_F = T_B = T_W and F&B = F + B
the bubble is (PP/2 - 1) x 2 T_F, a third of a micro-batch's slot per hop less than ZB-H1's.

Try ``python -c "from lessonlib.costmodel import bubble_fraction as f; print(f(4, 8),
f(4, 8, convention='ideal'))"``.
"""
from lessonlib.argcheck import positive_int, positive_number

CONVENTIONS = ("wall", "ideal")
SCHEDULES = ("gpipe", "1f1b", "zb-h1", "zbv", "dualpipe")
# Micro-batch slots of ideal time the bubble lasts, per unit of (p-1), at T_F = T_B = T_W
# (a slot = T_F + T_B + T_W): 1F1B 1, ZB-H1 1/3. ZBV's depends on m (``_idle_slots``).
_SLOTS = {"gpipe": 1.0, "1f1b": 1.0, "zb-h1": 1 / 3}


def _idle_slots(schedule, p, m):
    """Micro-batch slots each stage idles at T_F = T_B = T_W (simulated, ``zero_bubble``)."""
    if schedule == "zbv":   # in chunk forwards, 6 to a slot: (p-1)/6 once m >= 2p-1
        return max(p - 1, 2 * (2 * p - 1 - m)) / 6
    if schedule == "dualpipe":   # DeepSeek-V3 Table 2 at T_F = T_B = T_W, F&B = F + B
        return bubble_time("dualpipe", p, 1, 1, 1) / 3
    return (p - 1) * _SLOTS[schedule]


def _check(p, m, v):
    for name, value in (("p", p), ("m", m), ("v", v)):
        positive_int(name, value)


def bubble_fraction(p, m, v=1, convention="wall", schedule="1f1b"):
    """Pipeline bubble for p stages, m micro-batches, v chunks per stage.

    "wall": (p-1)/(v*m + p-1), share of the step's wall time (GPipe §2.3 for v=1).
    "ideal": (p-1)/(v*m), relative to bubble-free compute time (Megatron-LM 2021 §2.2).
    ``schedule="zb-h1"`` or ``"zbv"``: the zero-bubble schedules at T_F = T_B = T_W, whose
    bubble is 1/3 (ZB-H1) or 1/6 (ZBV, m >= 2p-1) of 1F1B's; v must then be 1.
    """
    _check(p, m, v)
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule={schedule!r} must be one of {', '.join(SCHEDULES)}")
    if v > 1 and schedule not in ("1f1b", "gpipe"):
        raise ValueError(f"v={v}: interleaving is a 1F1B schedule; {schedule!r} takes v=1")
    idle = _idle_slots(schedule, p, m)
    if convention == "wall":
        return idle / (v * m + idle)
    if convention == "ideal":
        return idle / (v * m)
    raise ValueError(f"convention={convention!r} must be one of {', '.join(CONVENTIONS)}")


def bubble_time(schedule, p, forward, backward, weight):
    """Idle time per stage per step for balanced stages: ``forward`` T_F, ``backward`` T_B
    (the input gradient only) and ``weight`` T_W per micro-batch. "1f1b"/"gpipe":
    (p-1)(T_F + T_B + T_W); "zb-h1": (p-1)(T_F + T_B - T_W) (Qi et al. 2024, Table 2,
    for T_W <= T_F); "zbv": (p-1) T_F / 2, the start-up alone (at T_F = T_B = T_W and
    m >= 2p-1; otherwise ``lessonlib.pipeline.validate.simulate`` the schedule);
    "dualpipe": (p/2 - 1)(F&B + B - 3W) (DeepSeek-V3 Table 2), with DeepSeek's B the whole
    backward (T_B + T_W) and F&B taken as F + B, a forward and a backward chunk run side by
    side without gaining on each other: (p/2 - 1)(T_F + 2 T_B - T_W)."""
    positive_int("p", p)
    f, b, w = (positive_number(n, x) for n, x in (("forward", forward), ("backward", backward),
                                                 ("weight", weight)))
    per_hop = {"gpipe": f + b + w, "1f1b": f + b + w, "zb-h1": f + b - w, "zbv": f / 2,
               "dualpipe": max(0.0, (f + (b + w)) + (b + w) - 3 * w)}
    if schedule not in per_hop:
        raise ValueError(f"schedule={schedule!r} must be one of {', '.join(per_hop)}")
    hops = max(0.0, p / 2 - 1) if schedule == "dualpipe" else p - 1
    return hops * per_hop[schedule]


def stashed_microbatches(schedule, p, m, stage=0):
    """Micro-batches whose activations ``stage`` (0-based) holds at its peak.

    "1f1b": min(p - stage, m); "gpipe": m; "zb-h1": min(p, m) on every stage (a
    micro-batch is held until its W); "zbv": min(2p, m + stage + 1, 2m) half-size chunks,
    each one half: min(p, m) on the last stage, the busiest.
    """
    _check(p, m, 1)
    if not isinstance(stage, int) or not 0 <= stage < p:
        raise ValueError(f"stage={stage!r} must be an integer in 0..{p - 1} for p={p}")
    if schedule == "1f1b":
        return min(p - stage, m)
    if schedule == "gpipe":
        return m
    if schedule == "zb-h1":
        return min(p, m)
    if schedule == "zbv":
        return min(2 * p, m + stage + 1, 2 * m) / 2
    if schedule == "dualpipe":   # DeepSeek-V3 Table 2: PP + 1 micro-batches' activations
        return min(p + 1, m)
    raise ValueError(f"schedule={schedule!r} must be one of {', '.join(SCHEDULES)}")
