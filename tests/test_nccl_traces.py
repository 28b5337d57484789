"""The NCCL checker cannot crash and cannot be fooled: hand-made traces of the hazards a
review found it blind to (a collective meeting a batch on one communicator, groups with the
same members, broadcasts from different roots, groups created in different orders, the
eager mode's shared communicator), and any well-formed trace Hypothesis makes (the checker
returns sentences, never raises). Recorded traces are replayed in tests/test_nccl_rules.py."""
import ast
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lessonlib.instruments.ledger import Event
from lessonlib.instruments.nccl_rules import ENTRY_POINTS, MODES, nccl_hazards
from lessonlib.instruments.nccl_trace import OPS

ROOT = Path(__file__).resolve().parent.parent
PREFIXES = ("hang:", "mismatch:", "order:", "race:", "trace:")


def rank(*calls) -> list:
    """One rank's calls, in order: (op, fields); every call waited on after the last."""
    return [Event(op, 2, f.pop("bytes", 16), order=i,
                  **{"dtype": "torch.float32", "waited": len(calls), **f})
            for i, (op, f) in enumerate((op, dict(f)) for op, f in calls)]


def ar(**f):
    return ("all_reduce", f)


def p2p(op, peer, **f):
    return (op, {"peer": peer, **f})


# ---------------------------------------------------------------- a collective meets a batch
def test_a_collective_queued_against_a_batch_is_a_hang_not_a_crash():
    """Rank 0: all-reduce, then a batched send; rank 1: the batched receive, then the
    all-reduce. One communicator, one stream each: neither call can start."""
    trace = [rank(ar(), p2p("send", 1, batch=0)), rank(p2p("recv", 0, batch=0), ar())]
    for mode in MODES:
        hazards = nccl_hazards(trace, mode=mode)
        assert hazards and all(h.startswith("hang:") for h in hazards), hazards
        assert any("all_reduce" in h and "batched" in h for h in hazards), hazards


def test_a_batch_between_two_ranks_then_an_all_reduce_of_three_passes():
    trace = [rank(p2p("send", 1, batch=0), p2p("recv", 1, batch=0), ar()),
             rank(p2p("send", 0, batch=0), p2p("recv", 0, batch=0), ar()),
             rank(ar())]
    for mode in MODES:
        assert nccl_hazards(trace, mode=mode) == [], mode


# ---------------------------------------------------------------- groups known by creation
def _opposite_orders(waited_at_end: bool) -> list:
    """The world and new_group([0, 1]) on 2 ranks, used in opposite orders."""
    world, twin = {"group": "0", "ranks": (0, 1)}, {"group": "1", "ranks": (0, 1)}
    made = ("new_group", {"ranks": (0, 1), "group": "1", "bytes": 0})
    trace = [rank(made, ar(**world), ar(**twin)), rank(made, ar(**twin), ar(**world))]
    if not waited_at_end:                      # synchronous calls: each waited on at once
        for line in trace:
            for e in line:
                e.waited = e.order + 1
    return trace


@pytest.mark.parametrize("waited_at_end", [True, False])
def test_groups_with_the_same_members_used_in_opposite_orders_are_flagged(waited_at_end):
    trace = _opposite_orders(waited_at_end)
    lazy = nccl_hazards(trace, mode="lazy")
    assert lazy and "creating" in lazy[0] and "group #1" in lazy[0], lazy
    eager = nccl_hazards(trace, mode="eager")
    assert eager and eager[0].startswith(("order:", "hang:")), eager
    same = [trace[0], [*trace[0]]]             # both ranks in rank 0's order: fine, unless
    lazy, eager = (nccl_hazards(same, mode=m) for m in MODES)   # both are in flight at once
    for hazards in (lazy, eager):
        assert len(hazards) == 2 * waited_at_end, hazards
        assert all("two communicators at once" in h for h in hazards), hazards


def test_groups_created_in_different_orders_are_flagged():
    a = ("new_group", {"ranks": (0, 1), "bytes": 0})
    b = ("new_group", {"ranks": (1, 2), "bytes": 0})
    hazards = nccl_hazards([rank(a, b), rank(a, b), rank(b, a)])
    assert len(hazards) == 1 and hazards[0].startswith("order:"), hazards
    assert "creation #0" in hazards[0] and "rank 2: [1, 2]" in hazards[0]
    assert nccl_hazards([rank(a, b)] * 3) == []


def test_one_group_name_with_two_member_lists_is_flagged():
    hazards = nccl_hazards([rank(ar(group="3", ranks=(0, 1))), rank(ar(group="3", ranks=(0, 1))),
                            rank(ar(group="3", ranks=(1, 2)))])
    assert hazards and hazards[0].startswith("order:") and "group #3" in hazards[0], hazards


def test_eager_new_group_is_a_call_on_the_world_every_rank_makes():
    """In eager mode new_group splits the world's communicator: a rank that reaches it
    after a world all-reduce the others make after it hangs them."""
    made = ("new_group", {"ranks": (0, 1), "group": "1", "bytes": 0})
    trace = [rank(made, ar(group="0", ranks=(0, 1))), rank(ar(group="0", ranks=(0, 1)), made)]
    assert nccl_hazards(trace, mode="eager")
    assert nccl_hazards([trace[0], trace[0]], mode="eager") == []


# ---------------------------------------------------------------- roots, barriers, objects
def test_a_broadcast_from_different_sources_is_a_mismatch():
    hazards = nccl_hazards([rank(("broadcast", {"root": 0})), rank(("broadcast", {"root": 1}))])
    assert len(hazards) == 1 and hazards[0].startswith("mismatch:") and "root" in hazards[0]
    assert nccl_hazards([rank(("broadcast", {"root": 1}))] * 2) == []


def test_barriers_and_object_collectives_line_up_like_collectives():
    calls = [("barrier", {"bytes": 0}), ("gather_object", {"bytes": 0, "root": 0})]
    assert nccl_hazards([rank(*calls), rank(*calls)]) == []
    skipped = nccl_hazards([rank(*calls), rank(calls[1])])
    assert skipped and skipped[0].startswith("order:"), skipped
    # all-to-all splits differ between ranks: not a mismatch
    assert nccl_hazards([rank(("all_to_all", {"bytes": 8})), rank(("all_to_all", {"bytes": 24}))]) == []


# ---------------------------------------------------------------- the two modes
def test_unbatched_send_and_receive_share_the_groups_stream_in_eager_mode():
    """Rank 0 sends before an all-reduce, rank 1 receives after it: lazy mode puts the pair
    on its own communicator, so rank 0's send is in flight there during its second
    all-reduce (two communicators busy, rule 8); eager mode puts it on the group's one
    stream, behind which rank 0's all-reduce waits (a hang)."""
    trace = [rank(ar(), p2p("send", 1), ar()), rank(ar(), ar(), p2p("recv", 0))]
    lazy, eager = nccl_hazards(trace, mode="lazy"), nccl_hazards(trace, mode="eager")
    assert lazy and all("two communicators at once" in h for h in lazy), lazy
    assert eager and "stuck" in eager[0], eager


def test_every_init_process_group_call_has_its_mode_stated():
    found = {}
    for path in [*ROOT.glob("lessonlib/**/*.py"), *ROOT.glob("labs/**/*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(
                    node.func, "id", None)) == "init_process_group":
                eager = any(k.arg == "device_id" for k in node.keywords)
                found[path.relative_to(ROOT).as_posix()] = "eager" if eager else "lazy"
    assert found == ENTRY_POINTS
    doc = nccl_hazards.__module__
    assert re.search(r"every one is lazy", __import__(doc, fromlist=["x"]).__doc__) or \
        "eager" in set(found.values())


# ---------------------------------------------------------------- it never raises
def test_traces_it_cannot_read_get_a_sentence():
    assert nccl_hazards(5)[0].startswith("trace:")
    assert nccl_hazards([[SimpleNamespace(op="send")], []])[0].startswith("trace:")
    assert nccl_hazards([[SimpleNamespace(op="teleport", order=0)]])[0].startswith("trace:")
    assert nccl_hazards([rank(p2p("send", 7))], mode="lazy")[0].startswith("trace:")
    assert nccl_hazards([rank(ar())], mode="sideways")[0].startswith("trace:")
    assert nccl_hazards([[SimpleNamespace(op="all_reduce", order=0, ranks=[[0]])]])[0].startswith("trace:")


@st.composite
def traces(draw):
    n = draw(st.integers(1, 4))
    groups = [("0", tuple(range(n)))] + [
        (str(i + 1), tuple(sorted(draw(st.sets(st.integers(0, n - 1), min_size=1)))))
        for i in range(draw(st.integers(0, 3)))]
    per_rank = []
    for r in range(n):
        mine = [g for g in groups if r in g[1]]
        events = []
        for i in range(draw(st.integers(0, 7))):
            op = draw(st.sampled_from(OPS))
            name, members = draw(st.sampled_from(mine))
            if op == "new_group":
                name, members = draw(st.sampled_from(groups))
            events.append(SimpleNamespace(
                op=op, peer=draw(st.sampled_from(members)) if op in ("send", "recv") else None,
                bytes=draw(st.sampled_from([0, 4, 16])), order=i,
                dtype=draw(st.sampled_from(["torch.float32", "torch.bfloat16"])),
                ranks=members if draw(st.booleans()) or name != "0" else (),
                group=draw(st.sampled_from([name, None])),
                batch=draw(st.sampled_from([None, 0, 1])) if op in ("send", "recv") else None,
                waited=draw(st.sampled_from([None, i + 1, i + 2, 99])),
                root=draw(st.sampled_from([None, *members])) if "broadcast" in op or
                "gather" in op else None))
        per_rank.append(events)
    return per_rank, draw(st.sampled_from([None, *MODES]))


@settings(max_examples=300, deadline=None)
@given(traces())
def test_any_well_formed_trace_gets_sentences_never_an_exception(case):
    trace, mode = case
    hazards = nccl_hazards(trace, mode=mode)
    assert isinstance(hazards, list)
    assert all(isinstance(h, str) and h.startswith(PREFIXES) for h in hazards), hazards
