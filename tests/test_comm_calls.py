"""Every call comm wraps does what torch.distributed does and is recorded for the NCCL check:
the new wrappers (all-to-all, the object collectives, new_group), each event's group known
by its creation (a group with the world's members is another communicator), and a ledger
that nobody opened costs a call nothing but its breadcrumb."""
import dataclasses
from types import SimpleNamespace

import pytest
import torch

import comm_workers
import lessonlib
from lessonlib import comm
from lessonlib.instruments.nccl_rules import nccl_hazards


@pytest.fixture(scope="module")
def ranks():
    return lessonlib.launch(comm_workers.every_new_call, 2, timeout=60)


@pytest.mark.timeout(120)
def test_the_new_wrappers_return_what_torch_does(ranks):
    r0, r1 = ranks
    assert r0["a2a"] == [0.0, 10.0] and r1["a2a"] == [1.0, 11.0]
    assert r0["a2a_list"] == [0.0, 2.0] and r1["a2a_list"] == [1.0, 3.0]
    assert r0["gathered"] == [{"rank": 0}, {"rank": 1}] and r1["gathered"] is None
    assert r0["everyone"] == r1["everyone"] == [0, 1]
    assert r0["box"] == r1["box"] == ["from 1"]
    assert r0["x"] == r1["x"] == [4.0, 4.0, 4.0]


@pytest.mark.timeout(120)
def test_every_call_is_recorded_with_its_group_and_root(ranks):
    for r in ranks:
        ops = [e.op for e in r["events"] if e.op != "new_group"]
        # all_to_all_single as NCCL runs it: a batch of one send and one receive per member
        assert ops == ["send", "send", "recv", "recv", "all_to_all", "gather_object",
                       "all_gather_object", "broadcast_object", "all_reduce", "all_reduce",
                       "barrier"]
        assert len({e.batch for e in r["events"][:4]}) == 1
        made = [e.ranks for e in r["events"] if e.op == "new_group"]
        assert made == [(0, 1), (0,), (1,), (0,), (1,)]           # tp, then pp, then dp
        assert r["count"] == 11 and "new_group" not in r["summary"] and r["mode"] == "lazy"
        roots = {e.op: e.root for e in r["events"]}
        assert roots["gather_object"] == 0 and roots["broadcast_object"] == 1
        world, tp = (e for e in r["events"] if e.op == "all_reduce")
        made = next(e for e in r["events"] if e.op == "new_group")
        assert world.ranks == tp.ranks == made.ranks == (0, 1)
        assert world.group == "0" and tp.group == made.group != "0"
    assert nccl_hazards([r["events"] for r in ranks]) == []


@pytest.mark.timeout(120)
def test_groups_with_the_same_members_are_not_confused(ranks):
    """Rank 1 as if it had used the two groups in the other order: the checker sees it."""
    r0, r1 = ([dataclasses.replace(e) for e in r["events"]] for r in ranks)
    world, tp = (e for e in r1 if e.op == "all_reduce")
    world.group, tp.group = tp.group, world.group
    for mode in ("lazy", "eager"):
        hazards = nccl_hazards([r0, r1], mode=mode)
        assert hazards and all(h.startswith(("hang:", "order:")) for h in hazards), (mode, hazards)


def test_nothing_is_built_for_a_call_when_no_ledger_is_open(monkeypatch):
    built = []
    monkeypatch.setattr(comm, "_event", lambda *a, **k: built.append(a))
    monkeypatch.setattr(comm.dist, "all_reduce", lambda *a, **k: "work")
    monkeypatch.setattr(comm.dist, "batch_isend_irecv", lambda ops: ["w"] * len(ops))
    monkeypatch.setattr(comm.dist, "get_world_size", lambda group=None: 2)
    send = SimpleNamespace(op=comm.dist.isend, tensor=torch.ones(2), group=None, peer=1)
    assert comm.all_reduce(torch.ones(2), async_op=True) == "work"
    assert comm.batch_isend_irecv([send]) == ["w"]
    assert built == []


def test_every_process_group_is_created_through_comm():
    """So that the NCCL check sees every group's creation, in order: no module of the
    package or the labs calls torch.distributed's new_group itself."""
    import ast
    from pathlib import Path

    root = Path(lessonlib.__file__).resolve().parent
    direct = []
    for path in [*root.rglob("*.py"), *(root.parent / "labs").glob("*.py")]:
        if path.name == "comm.py" and path.parent == root:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and node.attr in ("new_group", "new_subgroups")
                    and not (isinstance(node.value, ast.Name) and node.value.id == "comm")):
                direct.append(f"{path.relative_to(root.parent)}:{node.lineno}")
    assert not direct, f"groups made around comm.new_group: {direct}"
