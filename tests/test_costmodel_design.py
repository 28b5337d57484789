"""The lesson's 1-trillion-parameter question: the layout t=8, p=16, d=8 does not fit without
sharding, fits with ZeRO-1 over its 8 replicas, and p=64 fits too; ``check_design`` says so
with the cost model's numbers. Also notebook 05's exercises: the grid's coordinates, the same
question for GPT-3 175 B, and the sweet spot on H100 servers."""
import pytest

from lessonlib.costmodel import BYTES_PER_PARAM, CLUSTERS, MODELS, Layout, estimate
from lessonlib.exercises.hybrid import (check_coords, check_design, check_gpt3_design,
                                        check_h100_best_t, design_best, design_plan)

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
    # same bytes as the all-reduce it replaces; the optimizer step runs on 1/8 of the state
    assert {k: v for k, v in zero1.time.items() if k != "optimizer"} == {
        k: v for k, v in plain.time.items() if k != "optimizer"}
    assert zero1.time["optimizer"] == pytest.approx(plain.time["optimizer"] / 8)
    assert longer.fits and longer.step_time_s > zero1.step_time_s  # a little slower


def test_check_design_explains_zero1_and_holds_it_to_the_planner_the_notebook_prints():
    verdict = check_design(t=8, p=16, d=8, b=1, m=256, zero_stage=1)
    text = str(verdict)
    assert "ZeRO-1" in text and "d=8 replicas" in text
    assert "97.0 -> 12.1 GB" in text and "143.8 GB becomes 59.0 GB" in text
    best = design_best(zero_stage=1)
    assert best is design_plan(zero_stage=1).best or best is design_plan(0).best
    assert f"The best layout the planner finds, {best.layout.describe()}" in text
    assert f"recompute={best.layout.recompute}" in best.layout.describe()   # printed
    if best.layout.recompute != "full":        # full recompute against the planner's choice
        assert verdict.ok is False and "recompute='full' where the best uses" in text
    answer = {k: getattr(best.layout, k) for k in ("t", "p", "d", "b", "m", "zero_stage",
                                                   "recompute")}
    assert "yours is that layout" in str(check_design(**answer))


def test_check_design_names_a_recompute_it_does_not_know():
    verdict = check_design(t=8, p=16, d=8, b=1, m=256, recompute="some")
    assert verdict.ok is False and "recompute='some' must be" in str(verdict)


def test_check_design_without_zero_points_at_it():
    verdict = check_design(t=8, p=16, d=8, b=1, m=256)
    text = str(verdict)
    assert verdict.ok is False and text.startswith("❌ Not yet: ")
    assert "144 GB" in text and "zero_stage=1: 59.0 GB per GPU, it fits" in text
    assert check_design(t=8, p=64, d=2, b=1, m=1024).ok is not None      # fits: judged


@pytest.mark.parametrize("stage", [5, -1, True, "1"])
def test_check_design_bad_zero_stage(stage):
    verdict = check_design(t=8, p=16, d=8, b=1, m=256, zero_stage=stage)
    assert verdict.ok is False and f"zero_stage={stage!r}" in str(verdict)


def test_check_design_waits_for_every_choice():
    verdict = check_design(t=8, p=None, d=8, b=1, m=None)
    assert verdict.ok is None and "p, m are still None" in str(verdict)


def test_coords_checker_tells_a_stub_a_slip_and_the_formula_apart():
    def stub(rank, dp, pp, tp):
        raise NotImplementedError

    assert check_coords(stub).ok is None and "NotImplementedError" in str(check_coords(stub))
    reversed_axes = check_coords(lambda r, dp, pp, tp: (r % tp, (r // tp) % pp, r // (pp * tp)))
    assert reversed_axes.ok is False and "tp is the innermost axis" in str(reversed_axes)
    assert check_coords(lambda r, dp, pp, tp: (r // (pp * tp), (r // tp) % pp, r % tp))


def test_gpt3_design_is_a_new_case_judged_by_the_same_rules():
    # 175 B x 16 bytes = 2.8 TB: t*p = 32 does not fit an 80 GB GPU, t*p = 64 does
    too_small = check_gpt3_design(t=8, p=4, d=8, b=1, m=128)
    assert too_small.ok is False and "94 GB" in str(too_small) and "ZeRO-1" in str(too_small)
    lessons_rule = dict(t=8, p=8, d=4, b=1, m=256)
    assert check_gpt3_design(**lessons_rule, recompute="selective")   # within a tenth
    assert "recompute='full' where the best uses" in str(check_gpt3_design(**lessons_rule))
    assert "yours is that layout" in str(check_gpt3_design(t=4, p=16, d=4, b=1, m=256,
                                                           recompute="selective"))
    copied = check_gpt3_design(t=8, p=16, d=8, b=1, m=256)   # the 1 T answer, copied
    assert copied.ok is False and "32 servers of 8 have 256" in str(copied)


def test_h100_moves_the_sweet_spot_to_smaller_t():
    verdict = check_h100_best_t(4)
    text = str(verdict)
    assert verdict and "compute 3.2x, NVLink 1.5x" in text
    assert "13% of the step on A100 and 16% on H100" in text and "from t=8 to t=4" in text
    assert "(1.9x for an all-reduce of the server's 8 GPUs" in text
    tie = check_h100_best_t(8)        # 3 % behind t = 4: inside the model's own error
    assert tie.ok and "cannot tell the two apart" in str(tie)
    assert "more or less?" in str(check_h100_best_t(16))
    assert "bubble" in str(check_h100_best_t(2)) and not check_h100_best_t(2)
    assert check_h100_best_t(3).ok is False and check_h100_best_t(True).ok is False
    assert check_h100_best_t(None).ok is None
