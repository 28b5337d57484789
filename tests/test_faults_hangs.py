"""The flight recorder and the hang analyzer: each planted hang named from the dumps
(collective, group, missing ranks), from our ring and from PyTorch's own Flight Recorder.
3 ranks, a 2 s timeout per planted hang."""
import pytest

from lessonlib import bug_switches
from lessonlib.faults import hangs
from lessonlib.faults.hang_analysis import analyze, analyze_torch
from lessonlib.instruments.flight_recorder import Entry, FlightRecorder, read

pytestmark = pytest.mark.timeout(60)
WORLD = (0, 1, 2)


def _ring(rank, calls):
    """A rank's entries from (group, seq, shape, state) tuples."""
    return [Entry(rank, i, "all_reduce", g, WORLD, seq, 4 * shape[0], shape, "torch.float32",
                  state=state) for i, (g, seq, shape, state) in enumerate(calls)]


# ---------------------------------------------------------------- pure
def test_the_ring_keeps_the_last_n_entries_in_order(tmp_path):
    ring = FlightRecorder(tmp_path / "rank0.flight", size=4, rank=0)
    for _ in range(6):
        ring.done(ring.post("all_reduce", "0", WORLD, 16, (4,), "torch.float32", None), None, False)
    last, _ = ring.post("broadcast", "1", WORLD, 8, (2,), "torch.float32", None)
    entries = read(tmp_path / "rank0.flight")
    assert [e.record for e in entries] == [3, 4, 5, 6]
    assert [e.seq for e in entries] == [4, 5, 6, 1]        # counted per group
    assert entries[-1] == last and last.state == "posted"
    assert {e.state for e in entries[:-1]} == {"completed"}


def test_records_that_agree_name_nothing():
    calls = [("0", 1, (1,), "completed"), ("1", 1, (4,), "completed")]
    assert analyze({r: _ring(r, calls) for r in WORLD}) is None


def test_a_missing_rank_that_waits_nowhere_skipped_the_call():
    done = [("0", 1, (1,), "completed"), ("1", 1, (4,), "completed")]
    dumps = {0: _ring(0, done + [("1", 2, (4,), "posted")]),
             1: _ring(1, done + [("1", 2, (4,), "posted")]), 2: _ring(2, done)}
    f = analyze(dumps)
    assert (f.kind, f.group, f.seq, f.posted, f.missing) == ("skipped", "1", 2, (0, 1), (2,))


# ---------------------------------------------------------------- the planted hangs, run
@pytest.mark.parametrize("plant,kind,group", [("skipped", "skipped", "1"),
                                              ("reordered", "out_of_order", "0"),
                                              ("size", "size_mismatch", "1")],
                         ids=list(hangs.HANGS))
def test_each_planted_hang_is_named(plant, kind, group):
    d = hangs.diagnose(plant, timeout=2.0)
    f = d.finding
    assert (f.kind, f.op, f.group, f.seq, f.ranks) == (kind, "all_reduce", group, 3, WORLD), f
    assert f.missing == ((2,) if plant != "size" else ()), f
    if plant == "size":
        assert "rank 2: [3]" in f.detail and "rank 0: [4]" in f.detail
    assert set(d.dumps) == set(WORLD) and all(d.dumps.values())


def test_pytorchs_own_flight_recorder_dumps_name_the_same_collective(tmp_path, monkeypatch):
    """gloo in torch 2.13 keeps PyTorch's Flight Recorder too (``TORCH_FR_BUFFER_SIZE``):
    its dumps, read by the same analyzer, name the same collective and missing rank. Ours
    does not record the launcher's own closing barrier; PyTorch's does, and sees rank 2
    waiting there: so a skipped call reads as an order disagreement."""
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "64")
    f = hangs.diagnose_torch("skipped", tmp_path, timeout=2.0)
    assert (f.op, f.group, f.seq, f.posted, f.missing) == ("all_reduce", "1", 3, (0, 1), (2,)), f
    assert f.kind == "out_of_order" and "barrier #4 on group 0" in f.detail, f


@pytest.mark.parametrize("world", [3])
def test_the_loop_finishes_with_records_that_agree(world):
    """The bug zoo's test of its three hangs: with no switch on, the loop ends well inside
    the timeout and nothing is stuck (each hang's switch makes it fail)."""
    d = hangs.diagnose(None, world=world)
    assert d.finding is None and d.dumps == {}, d.finding


def test_each_hang_is_a_bug_of_the_zoo_switched_in_the_loop():
    for plant, name in hangs.HANGS.items():
        bug = bug_switches.BUGS[name]
        assert bug.where == "lessonlib.faults.hangs.rank_steps" and plant in hangs.PLANTS
        assert bug.test == ("tests/test_faults_hangs.py::"
                            "test_the_loop_finishes_with_records_that_agree[3]")
        assert bug_switches.hook_line(name)[0].startswith("lessonlib/faults/hangs.py:")


def test_pytorch_dump_format_is_read_with_its_group_members():
    dump = {"pg_config": {"0": {"ranks": "[0, 1]"}},
            "pg_status": {"0": {"last_completed_collective": 1}},
            "entries": [{"process_group": ("0", "default_pg"), "collective_seq_id": s,
                         "p2p_seq_id": 0, "profiling_name": "nccl:all_reduce",
                         "input_sizes": [[8]], "input_dtypes": ["Float"], "state": "scheduled",
                         "is_p2p": False} for s in (1, 2)]}
    short = {**dump, "entries": dump["entries"][:1]}
    f = analyze_torch({0: dump, 1: short})
    assert (f.kind, f.group, f.ranks, f.seq, f.missing) == ("skipped", "0", (0, 1), 2, (1,))


def test_the_exercise_checker_names_the_waiting_ranks_slip():
    from lessonlib.exercises.faults import check_stuck_rank
    done = [("0", 1, (1,), "completed"), ("1", 1, (4,), "completed")]
    dumps = {0: _ring(0, done + [("1", 2, (4,), "posted")]), 1: _ring(1, done),
             2: _ring(2, done + [("1", 2, (4,), "posted")])}
    assert check_stuck_rank(1, dumps) and check_stuck_rank([1], dumps)
    assert "they are the ones waiting" in check_stuck_rank(0, dumps)
    assert not check_stuck_rank("two", dumps) and check_stuck_rank(None, dumps).ok is None
