"""Pipeline schedules as data: GPipe, 1F1B and interleaved 1F1B, one list of actions per stage.

What it teaches: a pipeline schedule is nothing but, for every stage (device), the order in
which it runs the forward (F) and backward (B) of each micro-batch, plus the messages those
need: the forward of micro-batch i on stage s first receives stage s-1's output (RECV_F) and
then sends its own to stage s+1 (SEND_F); the backward receives the gradient from s+1
(RECV_B) and sends one to s-1 (SEND_B). These functions are pure (no torch, no processes):
the validator checks and simulates their output, the executor runs it, the plots draw it.

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

from dataclasses import dataclass

COMPUTE = ("F", "B")
COMM = ("SEND_F", "RECV_F", "SEND_B", "RECV_B")
KINDS = COMPUTE + COMM


@dataclass(frozen=True)
class Action:
    """One step of one stage: ``kind`` in KINDS, for ``microbatch`` of model ``chunk``.

    ``peer`` is the pipeline stage (device index, not a global rank) a SEND goes to or a
    RECV comes from; None for F and B."""
    kind: str
    microbatch: int
    chunk: int = 0
    peer: int | None = None

    def __str__(self) -> str:
        chunk = f"c{self.chunk}" if self.chunk else ""
        if self.peer is None:
            return f"{self.kind}{self.microbatch}{chunk}"
        arrow = "->" if self.kind.startswith("SEND") else "<-"
        return f"{self.kind}{self.microbatch}{chunk}{arrow}{self.peer}"


def F(mb: int, chunk: int = 0) -> Action:
    return Action("F", mb, chunk)


def B(mb: int, chunk: int = 0) -> Action:
    return Action("B", mb, chunk)


# ---------------------------------------------------------------- virtual stages
def virtual_stage(stage: int, chunk: int, p: int) -> int:
    """Device ``stage`` runs chunk c as virtual stage c*p + stage (Megatron-LM 2021 §2.2.2)."""
    return chunk * p + stage


def place(vstage: int, p: int) -> tuple[int, int]:
    """(device, chunk) that runs virtual stage ``vstage``."""
    return vstage % p, vstage // p


def add_communication(orders: list[list[Action]], v: int = 1) -> list[list[Action]]:
    """Insert the receive before and the send after every F and B of every stage.

    ``orders[d]`` is device d's compute order (only F and B actions). Activations flow from
    virtual stage k to k+1, gradients from k+1 back to k; the first virtual stage reads its
    input from the data and the last computes the loss, so they have no RECV_F / SEND_B."""
    p = len(orders)
    last = p * v - 1
    schedule = []
    for d, order in enumerate(orders):
        actions = []
        for a in order:
            k = virtual_stage(d, a.chunk, p)
            if a.kind == "F":
                if k > 0:
                    actions.append(Action("RECV_F", a.microbatch, a.chunk, place(k - 1, p)[0]))
                actions.append(a)
                if k < last:
                    actions.append(Action("SEND_F", a.microbatch, a.chunk, place(k + 1, p)[0]))
            elif a.kind == "B":
                if k < last:
                    actions.append(Action("RECV_B", a.microbatch, a.chunk, place(k + 1, p)[0]))
                actions.append(a)
                if k > 0:
                    actions.append(Action("SEND_B", a.microbatch, a.chunk, place(k - 1, p)[0]))
            else:
                raise ValueError(f"add_communication takes only F and B actions; got {a}")
        schedule.append(actions)
    return schedule


def compute_only(actions: list[Action]) -> list[Action]:
    """The F and B actions of one stage, in order (drop the messages)."""
    return [a for a in actions if a.kind in COMPUTE]


def parse(order) -> list[Action]:
    """'F0 F1 B0 ...' (or a list of such strings; 'F3c1' for chunk 1) -> list of Actions."""
    words = order.split() if isinstance(order, str) else list(order)
    actions = []
    for word in words:
        if isinstance(word, Action):
            actions.append(word)
            continue
        text = str(word).strip()
        kind, rest = text[:1].upper(), text[1:]
        mb, _, chunk = rest.partition("c")
        if kind not in COMPUTE or not mb.isdigit() or (chunk and not chunk.isdigit()):
            raise ValueError(f"cannot read {word!r}: write a forward as 'F<micro-batch>' and a "
                             f"backward as 'B<micro-batch>', e.g. 'F0', 'B3' ('F2c1' for chunk 1)")
        actions.append(Action(kind, int(mb), int(chunk or 0)))
    return actions


# ---------------------------------------------------------------- the schedules
# The most F and B actions one stage may list: schedules are for reading, drawing and
# simulating, and a million is far past any of those.
MAX_ACTIONS = 10**6


def _check(p, m, v=1):
    for name, value in (("p", p), ("m", m), ("v", v)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer (p stages, m micro-batches, "
                             f"v chunks per device); got {name}={value!r}")
    if p * 2 * m * v > MAX_ACTIONS:
        raise ValueError(f"p={p}, m={m}, v={v} give {p * 2 * m * v:.3g} F and B actions, more "
                         f"than the {MAX_ACTIONS:,} a schedule may list; use smaller p, m or v")


def gpipe(p: int, m: int) -> list[list[Action]]:
    """GPipe: every stage runs F0..F(m-1), then B0..B(m-1) (the order PyTorch's ScheduleGPipe
    uses). Peak stash: m micro-batches on every stage."""
    _check(p, m)
    order = [F(i) for i in range(m)] + [B(i) for i in range(m)]
    return add_communication([list(order) for _ in range(p)])


def one_f_one_b_order(p: int, m: int, stage: int) -> list[Action]:
    """Stage ``stage``'s compute order under 1F1B (PipeDream-Flush).

    warm-up: min(p - stage - 1, m) forwards; steady state: F(next), B(oldest); cool-down:
    the remaining backwards. At most min(p - stage, m) micro-batches are in flight."""
    _check(p, m)
    if not (isinstance(stage, int) and not isinstance(stage, bool) and 0 <= stage < p):
        raise ValueError(f"stage must be an integer in 0..{p - 1} for p={p}; got {stage!r}")
    warmup = min(p - stage - 1, m)
    order = [F(i) for i in range(warmup)]
    for i in range(m - warmup):
        order += [F(warmup + i), B(i)]
    order += [B(i) for i in range(m - warmup, m)]
    return order


def one_f_one_b(p: int, m: int) -> list[list[Action]]:
    """1F1B (PipeDream-Flush, Narayanan et al. 2021): same bubble as GPipe, stage s stashes
    at most min(p - s, m) micro-batches instead of m."""
    _check(p, m)
    return add_communication([one_f_one_b_order(p, m, s) for s in range(p)])


def interleaved_order(p: int, m: int, v: int, stage: int) -> list[Action]:
    """Device ``stage``'s compute order under Megatron-LM 2021's interleaved 1F1B.

    The k-th forward on a device is of chunk (k // p) % v and micro-batch
    (k // (p v)) p + k % p: groups of p micro-batches go through chunk 0, then chunk 1, ...
    Backwards visit the chunks in reverse. Warm-up: 2(p - stage - 1) + (v - 1) p forwards
    (all of them when m = p), then one forward one backward, then the cool-down."""
    _check(p, m, v)
    if not (isinstance(stage, int) and not isinstance(stage, bool) and 0 <= stage < p):
        raise ValueError(f"stage must be an integer in 0..{p - 1} for p={p}; got {stage!r}")
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


def interleaved_one_f_one_b(p: int, m: int, v: int = 2) -> list[list[Action]]:
    """Interleaved 1F1B with v chunks per device (Megatron-LM 2021 §2.2.2).

    m must be a multiple of p (micro-batches travel in groups of p); v = 1 is plain 1F1B."""
    _check(p, m, v)
    if v == 1:
        return one_f_one_b(p, m)
    if m % p:
        lower, upper = (m // p) * p, (m // p + 1) * p
        hint = f"{lower} or {upper}" if lower else f"{upper}"
        raise ValueError(f"interleaved 1F1B needs m to be a multiple of p (micro-batches move "
                         f"in groups of p); got m={m}, p={p}: use m={hint}")
    return add_communication([interleaved_order(p, m, v, s) for s in range(p)], v)


SCHEDULES = {"gpipe": gpipe, "1f1b": one_f_one_b, "interleaved": interleaved_one_f_one_b}


def make(name: str, p: int, m: int, v: int = 1) -> list[list[Action]]:
    """Build a schedule by name: 'gpipe', '1f1b' or 'interleaved' (the last uses v)."""
    if not isinstance(name, str) or name not in SCHEDULES:
        raise ValueError(f"schedule={name!r} is not one of {', '.join(SCHEDULES)}")
    _check(p, m, v)
    if name == "interleaved":
        return interleaved_one_f_one_b(p, m, v)
    if v != 1:
        raise ValueError(f"v={v} chunks per device needs schedule='interleaved'; "
                         f"{name!r} runs one chunk per device (v=1)")
    return SCHEDULES[name](p, m)


def describe(schedule: list[list[Action]], messages: bool = False) -> str:
    """One line per stage, e.g. 'stage 0: F0 F1 B0 F2 B1 B2'."""
    lines = []
    for s, actions in enumerate(schedule):
        shown = actions if messages else compute_only(actions)
        lines.append(f"stage {s}: " + " ".join(str(a) for a in shown))
    return "\n".join(lines)


if __name__ == "__main__":
    print(describe(one_f_one_b(4, 8)))
