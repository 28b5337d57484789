"""The planner earns trust: no context parallelism where a sequence fits whole and CP buys
nothing; what separates two layouts is named as a term of the step."""
import pytest

from lessonlib.costmodel import CLUSTERS, MODELS
from lessonlib.costmodel.planner import name_separating_term, separating_terms
from lessonlib.costmodel.search import CP_MIN_GAIN, explain_axes, plan_job


@pytest.mark.parametrize("seq", [2048, 4096])
def test_gpt3_175b_at_2k_and_4k_is_planned_without_context_parallelism(seq):
    """Megatron-LM 2021 (1,024 A100, batch 1,536) and MegaScale ran GPT-3 175B with none."""
    plan = plan_job(MODELS["gpt3-175B"], CLUSTERS["dgx-a100"], 1024, 1536, seq=seq)
    assert plan.best.layout.c == 1
    with_cp = [e for e in plan.ranked if e.layout.c > 1]
    assert all(e.step_time_s > (1 - CP_MIN_GAIN) * plan.best.step_time_s for e in with_cp)
    assert "whole (CP is taken only where" in explain_axes(plan)


def test_explain_names_the_term_that_separates_two_layouts():
    plan = plan_job(MODELS["gpt3-175B"], CLUSTERS["dgx-a100"], 1024, 1536)
    best, other = plan.ranked[0], next(e for e in plan.ranked if e.layout.p != plan.best.layout.p)
    terms = separating_terms(other, best)
    assert abs(terms[0][1]) == max(abs(v) for _, v in terms)
    assert sum(v for _, v in terms) == pytest.approx(other.step_time_s - best.step_time_s,
                                                     abs=1e-6)
    assert name_separating_term(other, best).startswith(terms[0][0])
    assert "what separates them most: " in explain_axes(plan)
