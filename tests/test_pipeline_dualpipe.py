"""DualPipeV: the order PyTorch builds, F&B slots in the action language, the bubble the
DualPipe README states, and parity (float64) with one process and with PyTorch's
``ScheduleDualPipeV`` on 2 CPU ranks, both engines in one launch.

Without processes: the schedule against ``ScheduleDualPipeV``'s own order (p = 1..4), the
validator and simulation (every F/B/W once, PP + 1 activations per device, the formula
where it holds), the slot's rules. One launch: ``dualpipe_runs.run_parity`` (p=2, m=4, 2 steps).
"""
from types import SimpleNamespace

import pytest
from torch.distributed.pipelining.schedules import ScheduleDualPipeV, _ComputationType

from lessonlib.pipeline import dualpipe_runs, schedules as S
from lessonlib.pipeline.actions import (Action, B, F, Kind, W, add_communication, compute_only,
                                       describe, parse)
from lessonlib.pipeline.dualpipe import bubble_formula, dualpipev, dualpipev_order, readme_times
from lessonlib.pipeline.validate import ScheduleError, check, lockstep, simulate, validate

KIND = {_ComputationType.FORWARD: "F", _ComputationType.FULL_BACKWARD: "B",
        _ComputationType.BACKWARD_INPUT: "B", _ComputationType.BACKWARD_WEIGHT: "W"}


def torch_order(p: int, m: int, rank: int) -> list[str]:
    """``ScheduleDualPipeV``'s compute actions for one rank, written as lessonlib prints them
    (its OVERLAP_F_B as 'F<i>&B<j>'), built without processes."""
    state = SimpleNamespace(pp_group_size=p, _n_microbatches=m)
    words = []
    for action in ScheduleDualPipeV._calculate_single_rank_operations(state, rank):
        subs = action.sub_actions or (action,)
        for i, a in enumerate(subs):
            chunk = "c1" if a.stage_index != rank else ""
            slot = "&" if action.sub_actions and i == 0 else ""
            words.append(f"{KIND[a.computation_type]}{a.microbatch_index}{chunk}{slot}")
    return words


@pytest.mark.parametrize("p", [1, 2, 3, 4])
def test_dualpipev_is_the_order_pytorch_builds(p):
    for m in (2 * p, 2 * p + 1, 2 * p + 3):
        for d in range(p):
            mine = [str(a) for a in dualpipev_order(p, m, d)]
            assert mine == torch_order(p, m, d), (p, m, d)


@pytest.mark.parametrize("p", [2, 3, 4])
def test_dualpipev_runs_every_f_and_b_once_and_holds_pp_plus_1_activations(p):
    for m in (2 * p, 2 * p + 3):
        sched = S.make("dualpipev", p, m)
        sim = validate(sched)                    # check, simulate, blocking batches
        assert (sim.p, sim.m, sim.v) == (p, m, 2)
        for actions in sched:
            done = [(a.kind, a.microbatch, a.chunk) for a in actions if a.kind in "FB"]
            assert sorted(done) == sorted((k, i, c) for k in (Kind.F, Kind.B)
                                          for i in range(m) for c in (0, 1))
        # DualPipe README: PP + 1 activations per device, PP = 2p stages
        assert sim.peak_stash == [2 * p + 1] * p


def test_an_f_and_b_slot_has_both_receives_before_it_both_sends_after_and_one_time():
    sched = dualpipev(2, 4)
    assert describe(sched).splitlines()[1].split()[8:12] == ["F2c1&B0", "F3&B1c1",
                                                             "F3c1&B1", "B2c1"]
    line = " ".join(str(a) for a in sched[1])
    assert "RECV_F3<-0 RECV_B1c1<-0 F3& B1c1 F3c1& B1 SEND_F3c1->0 SEND_B1->0" in line
    assert parse(describe(sched).splitlines()[1].split(": ")[1]) == compute_only(sched[1])
    for actions, units in zip(sched, lockstep(sched)):   # no batch inside a slot
        for i, u in enumerate(units):
            if isinstance(u, Action) and u.overlap:
                assert units[i + 1].kind == Kind.B
    sim = simulate(sched, forward=1, backward=2, overlapped=2.5)
    line = [x for x in sim.timelines[1] if x.kind in "FBW"]
    pairs = [(x, y) for x, y in zip(line, line[1:]) if (x.start, x.end) == (y.start, y.end)]
    assert [(x.kind, y.kind, x.end - x.start) for x, y in pairs] == [("F", "B", 2.5)] * 3
    busy = sum(x.end - x.start for x in line)
    assert sim.idle[1] == pytest.approx(sim.makespan - busy + 2.5 * 3)   # a slot counts once


def test_the_simulated_bubble_is_the_readme_formula_where_its_times_hold():
    """F, B (full backward), W per chunk and F&B per slot; the formula is for the most
    idle device. It holds at F = B - W = W for max(F, B) <= F&B <= F + B (the default
    F&B is F + B); at other times it is an estimate (W = 0.8: 0.2 (p-1) high)."""
    rows = dualpipe_runs.bubble_rows()
    assert len(rows) == 3 * 2 * 5
    for row in rows:
        if row.W != 0.8:
            assert row.idle_simulated == pytest.approx(row.idle_formula), row
        else:
            gap = row.idle_formula - row.idle_simulated
            assert gap == pytest.approx(0.2 * (row.p - 1)), row
        assert row.peak_stash == [row.peak_stash_readme] * row.p
    default = simulate(dualpipev(3, 7), **readme_times(1, 2, 1))
    assert max(default.idle) == pytest.approx(bubble_formula(3, 1, 2, 1, 3)) == 4


@pytest.mark.parametrize("order, words", [
    ([Action(Kind.F, 0, overlap=True), W(0), B(0)], "followed by W0"),
    ([F(0), Action(Kind.B, 0, overlap=True)], "only an F is overlapped"),
    ([F(0), B(0), Action(Kind.F, 1, overlap=True)], "followed by nothing"),
    ([Action(Kind.F, 1, overlap=True), B(1), F(0), B(0)], "its own backward"),
])
def test_the_validator_rejects_a_slot_that_is_not_an_f_beside_another_b(order, words):
    with pytest.raises(ScheduleError, match=words):
        check([order])


def test_bad_dualpipev_settings_are_refused():
    with pytest.raises(ValueError, match="m >= 2p = 4"):
        S.make("dualpipev", 2, 3)
    with pytest.raises(ValueError, match="two chunks per device"):
        S.make("dualpipev", 2, 4, v=1)
    with pytest.raises(ValueError, match="not an F followed by a B"):
        add_communication([[Action(Kind.F, 0, overlap=True), F(1), B(0), B(1)]])


@pytest.mark.timeout(120)
def test_dualpipev_equals_one_process_and_pytorchs_schedule(no_children_left):
    run = dualpipe_runs.run_parity(p=2, m=4, steps=2)
    assert [r.engine for r in run.rows] == ["lessonlib", "torch"]
    for row in run.rows:
        assert max(row.max_grads_diff, row.max_weights_diff, row.max_losses_diff) < 1e-12
    assert run.max_engine_diff < 1e-12
    assert run.peak_stash == [5, 5]


def test_the_gantt_chart_draws_each_f_and_b_slot_as_one_bordered_cell():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from lessonlib.viz import pipeline as vp

    ax = vp.gantt_schedule("dualpipev", 2, 4)
    cells = [r for r in ax.patches if not r.get_fill() and r.get_edgecolor()[:3] == (0, 0, 0)]
    halves = [r for r in ax.patches if r.get_fill() and r.get_height() == pytest.approx(0.4)]
    slots = sum(a.overlap for actions in dualpipev(2, 4) for a in actions)
    assert (len(cells), len(halves)) == (slots, 2 * slots)
    assert "F&B slot (F above, B below)" in [t.get_text() for t in ax.get_legend().texts]
    plt.close(ax.figure)
