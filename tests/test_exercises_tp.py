"""The checkers of lessons 03 (layer split), 04 and 14 (tensor and sequence parallelism):
right answers are "Correct", the common slips get a hint that names them, untouched stubs
are "your turn".

In process, except the last test, which runs a student's stub and answer on 2 CPU ranks."""
from __future__ import annotations

import pytest
import torch

from lessonlib import comm
from lessonlib.exercises import sp, tp as ex
from lessonlib.instruments.spans import Span
from lessonlib.model_parallel.line import LineResult


def test_stage_split_accepts_a_balanced_split_and_names_an_unbalanced_one():
    def balanced(n, p):
        base, extra = divmod(n, p)
        starts = [s * base + min(s, extra) for s in range(p + 1)]
        return [list(range(starts[s], starts[s + 1])) for s in range(p)]

    def lopsided(n, p):
        return [list(range(n - p + 1))] + [[i] for i in range(n - p + 1, n)]

    def stub(n, p):
        raise NotImplementedError

    assert ex.check_stage_split(balanced)
    verdict = ex.check_stage_split(lopsided)
    assert verdict.ok is False and "not balanced" in str(verdict)
    assert ex.check_stage_split(stub).ok is None


def test_idle_share_checker_runs_the_function_on_timelines():
    timeline = [Span("F", 0, 0, 0.0, 1.0), Span("RECV_B", 0, 0, 1.0, 3.0),
                Span("B", 0, 0, 3.0, 4.0)]
    results = [LineResult(rank=0, stage=0, p=1, timeline=timeline)]
    assert ex.check_idle_share(lambda tl, wall: 1 - sum(
        s.end - s.start for s in tl if s.kind in ("F", "B", "OPT")) / wall, results)
    verdict = ex.check_idle_share(lambda tl, wall: 0.0, results)
    assert verdict.ok is False and "Waiting and sending count as idle" in str(verdict)


def test_unbalanced_idle_wants_the_share_of_the_whole_step():
    assert ex.check_unbalanced_idle(5 / 6)
    assert ex.check_unbalanced_idle(0.833)
    for answer, words in ((0.75, "holds for equal stages"), (0.5, "the slow one"),
                          (83.3, "percentage"), (0.2, "1 - its work"), ("x", "share")):
        verdict = ex.check_unbalanced_idle(answer)
        assert verdict.ok is False and words in str(verdict), (answer, str(verdict))
    assert ex.check_unbalanced_idle(2 / 3, stage_ms=(1, 2), stage=0)
    assert ex.check_unbalanced_idle(None).ok is None


def test_tp_traffic_ratio_hardly_changes_with_t():
    assert ex.check_tp_traffic_ratio(7 / 6)                 # (7/8) / (3/4)
    assert ex.check_tp_traffic_ratio(1.5, t_from=2, t_to=4)
    for answer, words in ((0.5, "weights per rank"), (2, "does not grow as t"),
                          (1, "hardly changes"), (3, "b, s and h cancel"), (None, "Your turn")):
        verdict = ex.check_tp_traffic_ratio(answer)
        assert words in str(verdict), (answer, str(verdict))


@pytest.mark.timeout(120)
def test_gather_sequence_on_two_ranks():
    def stub(x, group):
        raise NotImplementedError

    def gather(x, group, dim=1):
        parts = [torch.empty_like(x) for _ in range(2)]
        comm.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=dim)

    def keep_my_rows(grad, group):                  # no sum: each rank's own gradient only
        return grad.chunk(2, dim=1)[torch.distributed.get_rank()].contiguous()

    def reduce_scatter(grad, group):
        stacked = torch.cat(grad.chunk(2, dim=1), dim=0)
        mine = stacked.new_empty(grad.shape[0], grad.shape[1] // 2, grad.shape[2])
        comm.reduce_scatter_tensor(mine, stacked, group=group)
        return mine

    assert sp.check_gather_sequence(stub, stub).ok is None
    verdict = sp.check_gather_sequence(lambda x, g: gather(x, g, dim=-1), reduce_scatter)
    assert verdict.ok is False and "hidden dim" in str(verdict), verdict
    verdict = sp.check_gather_sequence(gather, keep_my_rows)
    assert verdict.ok is False and "sum over ranks" in str(verdict), verdict
    assert sp.check_gather_sequence(gather, reduce_scatter)
