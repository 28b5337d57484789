"""The language pipeline schedules are written in: actions, where the chunks sit, messages.

What it teaches: a schedule is, for every stage (device), the order of its compute actions,
F (forward), B (backward) and, once the backward is split in two (Qi et al., ICLR 2024), W:

* F(i): run the chunk on micro-batch i and keep what autograd saved;
* B(i): the backward. Alone it is the whole backward; with a W(i) later on the same stage it
  is only the *input* gradient, the part the previous stage is waiting for;
* W(i): the *weight* gradient of micro-batch i, from what B kept; nobody waits for it, so a
  schedule may put it wherever the stage would otherwise be idle.

``add_communication`` inserts the messages those need: the forward of virtual stage k first
receives stage k-1's output (RECV_F) and then sends its own to stage k+1 (SEND_F); the
backward receives the gradient from k+1 (RECV_B) and sends one to k-1 (SEND_B). A W sends
nothing. Where two neighbouring virtual stages sit on the same device (the bottom of a V),
the tensor is handed over in memory, with no message.

One slot may hold two computes: DualPipe's F&B (DeepSeek-V3, Table 2), the forward of one
micro-batch beside the backward of another, so that one's communication hides behind the
other's compute. It is written as an F marked ``overlap`` followed at once by its B
(``overlapped``; printed ``F4&B1c1``); both its receives come before the slot and both its
sends after it.

Where the chunks sit (``Schedule.placement``): ``"loop"`` (Megatron-LM 2021 §2.2.2) puts
virtual stage c*p + d on device d, so the model loops over the devices v times; ``"v"``
(the V-shaped zero-bubble schedule) puts chunk 0 of device d at virtual stage d and chunk 1
at 2p-1-d, so the model goes down the devices and back up.

Laptop:  ``python -m lessonlib.pipeline.actions`` prints a 2-stage schedule with its messages.
GPU box: the same; pure Python.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum

from lessonlib.argcheck import positive_int


class Kind(str, Enum):
    """What an action does. A ``str`` too, so ``Kind.F == "F"`` and spans stay plain text."""
    F = "F"
    B = "B"
    W = "W"
    SEND_F = "SEND_F"
    RECV_F = "RECV_F"
    SEND_B = "SEND_B"
    RECV_B = "RECV_B"

    __str__ = str.__str__

    @property
    def is_compute(self) -> bool:
        return self in (Kind.F, Kind.B, Kind.W)

    @property
    def is_send(self) -> bool:
        return self in (Kind.SEND_F, Kind.SEND_B)

    @property
    def is_recv(self) -> bool:
        return self in (Kind.RECV_F, Kind.RECV_B)

    @property
    def direction(self) -> str:
        """"F" for activations (forward), "B" for gradients (backward)."""
        return self.value[-1]


COMPUTE = (Kind.F, Kind.B, Kind.W)
COMM = (Kind.SEND_F, Kind.RECV_F, Kind.SEND_B, Kind.RECV_B)
KINDS = COMPUTE + COMM
PLACEMENTS = ("loop", "v")


@dataclass(frozen=True)
class Action:
    """One step of one stage: ``kind`` in KINDS, for ``microbatch`` of model ``chunk``.

    ``peer`` is the pipeline stage (device index, not a global rank) a SEND goes to or a
    RECV comes from; None for F, B and W. ``overlap``: this F shares one slot with the
    next action of its stage, a B (DualPipe's F&B). A kind given as text ("F") becomes a
    ``Kind``; one that is not a kind stays text, for the validator to reject by name."""
    kind: Kind
    microbatch: int
    chunk: int = 0
    peer: int | None = None
    overlap: bool = False

    def __post_init__(self):
        if isinstance(self.kind, str) and self.kind in Kind._value2member_map_:
            object.__setattr__(self, "kind", Kind(self.kind))

    def __str__(self) -> str:
        chunk = f"c{self.chunk}" if self.chunk else ""
        if self.peer is None:
            return f"{self.kind}{self.microbatch}{chunk}" + "&" * self.overlap
        arrow = "->" if self.kind in (Kind.SEND_F, Kind.SEND_B) else "<-"
        return f"{self.kind}{self.microbatch}{chunk}{arrow}{self.peer}"


def F(mb: int, chunk: int = 0) -> Action:
    return Action(Kind.F, mb, chunk)


def B(mb: int, chunk: int = 0) -> Action:
    return Action(Kind.B, mb, chunk)


def W(mb: int, chunk: int = 0) -> Action:
    return Action(Kind.W, mb, chunk)


class MicrobatchCursor:
    """The next micro-batch of each kind and chunk, for orders that count per chunk (ZBV,
    DualPipeV): ``take("F0", "B1")`` is [F(i, 0), B(j, 1)], i and j the first micro-batches
    not yet taken; ``split("B1")`` takes a B whose W waits in ``held`` until ``held_w()``
    takes the oldest; ``taken["W1"]`` counts what was taken."""

    def __init__(self):
        self.taken = {f"{kind}{chunk}": 0 for kind in "FBW" for chunk in (0, 1)}
        self.held: list[Action] = []

    def take(self, *names: str) -> list[Action]:
        actions = []
        for name in names:
            actions.append(Action(Kind(name[0]), self.taken[name], int(name[1:])))
            self.taken[name] += 1
        return actions

    def split(self, name: str) -> list[Action]:
        b = self.take(name)
        self.held.append(W(b[0].microbatch, b[0].chunk))
        return b

    def held_w(self) -> list[Action]:
        return [self.held.pop(0)] if self.held else []


def overlapped(forward: Action, backward: Action) -> list[Action]:
    """One F&B slot: ``forward`` (an F) marked to run beside ``backward`` (a B)."""
    if forward.kind != Kind.F or backward.kind != Kind.B:
        raise ValueError(f"an overlapped slot is an F beside a B; got {forward} and {backward}")
    return [replace(forward, overlap=True), backward]


def slots(order: list[Action]) -> list[tuple[Action, ...]]:
    """A stage's compute order in slots: each action alone, an F& with the B after it."""
    out, i = [], 0
    while i < len(order):
        a = order[i]
        pair = a.overlap and i + 1 < len(order) and order[i + 1].kind == Kind.B
        if a.overlap and not (a.kind == Kind.F and pair):
            raise ValueError(f"{a} is marked overlapped but is not an F followed by a B")
        out.append(tuple(order[i:i + 1 + pair]))
        i += 1 + pair
    return out


class Schedule(list):
    """Every stage's action list (``schedule[d]``), plus where the chunks sit
    (``placement``: "loop" or "v"). A plain list of lists is read as "loop"."""

    def __init__(self, stages=(), placement: str = "loop"):
        super().__init__(stages)
        if placement not in PLACEMENTS:
            raise ValueError(f"placement={placement!r} must be one of {', '.join(PLACEMENTS)}")
        self.placement = placement


def placement_of(schedule) -> str:
    return getattr(schedule, "placement", "loop")


# ---------------------------------------------------------------- virtual stages
def virtual_stage(stage: int, chunk: int, p: int, placement: str = "loop") -> int:
    """The virtual stage device ``stage`` runs as its chunk ``chunk``."""
    if placement == "v" and chunk % 2:
        return (chunk + 1) * p - 1 - stage
    return chunk * p + stage


def place(vstage: int, p: int, placement: str = "loop") -> tuple[int, int]:
    """(device, chunk) that runs virtual stage ``vstage``."""
    device, chunk = vstage % p, vstage // p
    if placement == "v" and chunk % 2:
        device = p - 1 - device
    return device, chunk


def add_communication(orders: list[list[Action]], v: int = 1,
                      placement: str = "loop") -> Schedule:
    """Insert the receive before and the send after every F and B of every stage.

    ``orders[d]`` is device d's compute order (F, B and W actions). Activations flow from
    virtual stage k to k+1, gradients from k+1 back to k; the first virtual stage reads its
    input from the data and the last computes the loss, so they have no RECV_F / SEND_B;
    neighbours on the same device hand over in memory."""
    p = len(orders)
    last = p * v - 1
    schedule = []
    for d, order in enumerate(orders):
        actions = []

        def message(kind, a, k):
            peer = place(k, p, placement)[0]
            if 0 <= k <= last and peer != d:
                actions.append(Action(kind, a.microbatch, a.chunk, peer))

        for a in order:
            if a.kind not in COMPUTE:
                raise ValueError(f"add_communication takes only F, B and W actions; got {a}")
        for slot in slots(order):      # an F&B slot: both receives, both computes, both sends
            for a in slot:
                k = virtual_stage(d, a.chunk, p, placement)
                if a.kind == Kind.F:
                    message(Kind.RECV_F, a, k - 1)
                elif a.kind == Kind.B:
                    message(Kind.RECV_B, a, k + 1)
            actions.extend(slot)
            for a in slot:
                k = virtual_stage(d, a.chunk, p, placement)
                if a.kind == Kind.F:
                    message(Kind.SEND_F, a, k + 1)
                elif a.kind == Kind.B:
                    message(Kind.SEND_B, a, k - 1)
        schedule.append(actions)
    return Schedule(schedule, placement)


def compute_only(actions: list[Action]) -> list[Action]:
    """The F, B and W actions of one stage, in order (drop the messages)."""
    return [a for a in actions if a.kind in COMPUTE]


def parse(order) -> list[Action]:
    """'F0 F1 B0 W0 ...' (or a list of such strings; 'F3c1' for chunk 1, 'F4&B1c1' for an
    F&B slot) -> list of Actions."""
    words = order.split() if isinstance(order, str) else list(order)
    actions = []
    for word in words:
        if isinstance(word, Action):
            actions.append(word)
            continue
        text = str(word).strip()
        if "&" in text:
            first, _, second = text.partition("&")
            (f,), (b,) = parse([first]), parse([second])
            actions += overlapped(f, b)
            continue
        kind, rest = text[:1].upper(), text[1:]
        mb, _, chunk = rest.partition("c")
        if kind not in COMPUTE or not mb.isdigit() or (chunk and not chunk.isdigit()):
            raise ValueError(f"cannot read {word!r}: write a forward as 'F<micro-batch>' and a "
                             f"backward as 'B<micro-batch>', e.g. 'F0', 'B3' ('F2c1' for chunk "
                             f"1, 'W3' for a weight gradient split off B3)")
        actions.append(Action(kind, int(mb), int(chunk or 0)))
    return actions


def describe(schedule: list[list[Action]], messages: bool = False) -> str:
    """One line per stage, e.g. 'stage 0: F0 F1 B0 F2 B1 B2'."""
    lines = []
    for s, actions in enumerate(schedule):
        shown = actions if messages else compute_only(actions)
        lines.append(f"stage {s}: " + " ".join(str(a) for a in shown).replace("& ", "&"))
    return "\n".join(lines)


# ---------------------------------------------------------------- settings
# The most compute actions one stage may list: schedules are for reading, drawing and
# simulating, and a million is far past any of those.
MAX_ACTIONS = 10**6


def check_schedule_args(p, m, v=1, stage=None) -> None:
    """p stages, m micro-batches, v chunks per device (and a stage in 0..p-1), or ValueError."""
    for name, value, what in (("p", p, "pipeline stages"), ("m", m, "micro-batches"),
                              ("v", v, "chunks per device")):
        positive_int(name, value, what=what)
    if p * 3 * m * v > MAX_ACTIONS:
        raise ValueError(f"p={p}, m={m}, v={v} give {p * 3 * m * v:.3g} compute actions, more "
                         f"than the {MAX_ACTIONS:,} a schedule may list; use smaller p, m or v")
    if stage is not None and not (isinstance(stage, int) and not isinstance(stage, bool)
                                  and 0 <= stage < p):
        raise ValueError(f"stage must be an integer in 0..{p - 1} for p={p}; got {stage!r}")


if __name__ == "__main__":
    print(describe(add_communication([[F(0), B(0), W(0)], [F(0), B(0), W(0)]]), messages=True))
