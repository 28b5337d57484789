"""The lesson's 1-trillion-parameter question: the layout t=8, p=16, d=8 does not fit without
sharding, fits with ZeRO-1 over its 8 replicas, and p=64 fits too; ``check_design`` says so
with the cost model's numbers."""
import pytest

from lessonlib.costmodel import BYTES_PER_PARAM, CLUSTERS, MODELS, Layout, estimate
from lessonlib.exercises.hybrid import check_design

ONE_T, DGX = MODELS["megatron-1T"], CLUSTERS["dgx-a100"]


def _estimate(**layout):
    return estimate(ONE_T, Layout(b=1, global_batch=2048, **layout), DGX)


def test_the_lessons_answer_needs_sharding_or_a_longer_pipeline():
    # 1.0 T parameters over t*p = 128 GPUs, 16 bytes each: about 126 GB before activations
    assert BYTES_PER_PARAM * ONE_T.params() / 128 / 1e9 == pytest.approx(126, abs=1)
    plain = _estimate(t=8, p=16, d=8)
    zero1 = _estimate(t=8, p=16, d=8, zero_stage=1)
    longer = _estimate(t=8, p=64, d=2)
    assert not plain.fits and plain.memory.model_state / 1e9 == pytest.approx(129, abs=1)
    assert zero1.fits and zero1.memory.total / 1e9 == pytest.approx(59, abs=0.5)
    # ZeRO-1: the 12 bytes of Adam state per parameter are split 8 ways, nothing else
    assert zero1.memory.optimizer == pytest.approx(plain.memory.optimizer / 8)
    assert zero1.memory.weights == plain.memory.weights
    assert zero1.time == plain.time  # same bytes as the all-reduce it replaces
    assert longer.fits and longer.step_time_s > zero1.step_time_s  # a little slower


def test_check_design_explains_zero1(capsys):
    assert check_design(t=8, p=16, d=8, b=1, m=256, zero_stage=1)
    text = capsys.readouterr().out
    assert text.startswith("Correct.") and "ZeRO-1" in text and "d=8 replicas" in text
    assert "97.0 -> 12.1 GB" in text and "143.8 GB becomes 59.0 GB" in text


def test_check_design_without_zero_points_at_it(capsys):
    assert not check_design(t=8, p=16, d=8, b=1, m=256)
    text = capsys.readouterr().out
    assert "144 GB" in text and "zero_stage=1: 59.0 GB per GPU, it fits" in text
    assert check_design(t=8, p=64, d=2, b=1, m=1024)


@pytest.mark.parametrize("stage", [5, -1, True, "1"])
def test_check_design_bad_zero_stage(capsys, stage):
    assert not check_design(t=8, p=16, d=8, b=1, m=256, zero_stage=stage)
    assert f"zero_stage={stage!r}" in capsys.readouterr().out
