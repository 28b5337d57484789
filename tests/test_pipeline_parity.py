"""Real pipeline runs train exactly like one process: GPipe, 1F1B and interleaved 1F1B
(lessonlib) and ScheduleGPipe / Schedule1F1B (PyTorch), for p = 2, 3, 4 and m in
{1, p, 2p+1} (interleaved, v = 2: m = p and 2p; PyTorch's 1F1B: m >= p).

One launch per world size runs every case (a tiny GPT, 2 SGD steps); the single-process
reference runs here. Checked: per-micro-batch losses, the first step's gradients and the
weights after the steps, the peak stash per stage, and that every message one stage sends
is received (ledger counts equal the schedule's)."""
import pytest

import lessonlib
from lessonlib.pipeline import schedule_runs
from lessonlib.pipeline.schedules import make


@pytest.fixture(scope="module", params=[2, 3, 4])
def run(request):
    p = request.param
    cases = schedule_runs.parity_cases(p)
    return p, cases, lessonlib.launch(schedule_runs.rank_parity, p, cases, timeout=240)


@pytest.mark.timeout(300)
def test_every_schedule_matches_one_process(run, no_children_left):
    p, cases, per_rank = run
    rows = schedule_runs.compare_parity(per_rank)          # raises, naming the case, on a mismatch
    assert {(r.engine, r.schedule, r.m, r.v) for r in rows} == set(cases)
    for row in rows:
        assert row.max_grads_diff < 1e-5 and row.max_weights_diff < 1e-5


@pytest.mark.timeout(300)
def test_the_peak_stash_is_min_p_minus_stage_m_for_1f1b_and_m_for_gpipe(run):
    p, cases, per_rank = run
    for case in cases:
        engine, schedule, m, v = case
        if engine != "lessonlib" or schedule == "interleaved":
            continue
        got = [r[case].stash for r in per_rank]
        want = [min(p - s, m) for s in range(p)] if schedule == "1f1b" else [m] * p
        assert got == want, case


@pytest.mark.timeout(300)
def test_every_message_is_sent_and_received_through_the_ledger(run):
    p, cases, per_rank = run
    for case in cases:
        engine, schedule, m, v = case
        if engine != "lessonlib":
            continue
        actions = make(schedule, p, m, v)
        for s, result in enumerate(per_rank):
            assert result[case].sends == sum(a.kind.startswith("SEND") for a in actions[s])
            assert result[case].recvs == sum(a.kind.startswith("RECV") for a in actions[s])
        assert sum(r[case].sends for r in per_rank) == sum(r[case].recvs for r in per_rank)
