"""The straggler detector: a rank slowed on purpose is named, an even run names none; the
cost model prices a straggler in a synchronous step. 4 ranks, 5 steps each run."""
import pytest

from lessonlib.costmodel.resilience import straggler_step
from lessonlib.faults import stragglers
from lessonlib.faults.stragglers import StepTimes, detect, relative_scores

pytestmark = pytest.mark.timeout(90)


def test_the_relative_score_is_the_fastest_time_over_each_ranks():
    assert relative_scores({0: 0.1, 1: 0.2, 2: 0.1}) == {0: 1.0, 1: 0.5, 2: 1.0}
    times = [StepTimes(r, (0.05, 0.05, 0.3 if r == 1 else 0.05), (0.0,) * 3) for r in range(3)]
    assert detect(times).named == ()                       # one slow step: the median ignores it
    times = [StepTimes(r, (0.15 if r == 1 else 0.05,) * 3, (0.0,) * 3) for r in range(3)]
    assert detect(times).named == (1,)


def test_a_straggler_costs_every_rank_its_extra_compute():
    step = straggler_step(t_compute=0.05, t_comm=0.01, slowdown=3.0)
    assert step.even_s == pytest.approx(0.06) and step.slowed_s == pytest.approx(0.16)
    assert step.healthy_wait_s == pytest.approx(0.11)
    assert step.throughput_lost == pytest.approx(1 - 0.06 / 0.16)
    with pytest.raises(ValueError, match="slowdown=0.5"):
        straggler_step(0.05, 0.01, 0.5)


def test_the_slowed_rank_is_named_and_an_even_run_names_none():
    slowed = detect(stragglers.measure(slow_rank=2, steps=5))
    assert slowed.named == (2,), slowed
    healthy = [r for r in slowed.wait if r != 2]
    assert all(slowed.wait[r] > slowed.wait[2] for r in healthy), slowed   # they wait for it
    even = detect(stragglers.measure(slow_rank=None, steps=5))
    assert even.named == (), even


def test_bad_settings_are_refused_before_any_rank_starts():
    with pytest.raises(ValueError, match="slow_rank=4 is not a rank of 4"):
        stragglers.measure(slow_rank=4)
    with pytest.raises(ValueError, match="slowdown=0.5 must be at least 1"):
        stragglers.measure(slow_rank=1, slowdown=0.5)

