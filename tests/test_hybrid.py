"""TP x PP x DP together equals one process: the 8-rank 2x2x2 run (one launch, which also
checks the grid against DeviceMesh), three 4-rank layouts (one launch), the traffic each rank
sends, and bad input rejected before any process."""
import pytest

import lessonlib
from lessonlib.hybrid import (check_layout, compare_parity, expected_param_count,
                              expected_traffic, measured_traffic, run, stage_counts, train_layout,
                              train_layouts)
from lessonlib.models import HYBRID_CONFIG
from lessonlib.grid import demo_grid
from lessonlib.hybrid.traffic import Messages
from lessonlib.models import GPTConfig

TOL = 1e-5  # float32 rounding of a different summation order


def assert_equals_one_process(per_rank, cfg=HYBRID_CONFIG, global_batch=8, m=2):
    summary = compare_parity(per_rank)
    assert summary.max_loss_diff < TOL, summary
    assert summary.max_grad_diff < TOL and summary.max_weight_diff < TOL, summary
    for r in per_rank:
        dp, pp, tp = (max(q.coords[i] for q in per_rank) + 1 for i in range(3))
        want = expected_traffic(cfg, dp, pp, tp, global_batch, m, r.coords[1], r.param_count)
        for step in r.traffic:  # every step sends exactly this, DP once after the backwards
            assert measured_traffic(step) == want, (r.coords, step)
    return summary


def grid_then_train():
    """One 8-rank launch: the grid against PyTorch's DeviceMesh, then the 3-D training run."""
    return demo_grid(2, 2, 2), train_layout(dp=2, pp=2, tp=2, steps=3, timeline=True)


@pytest.mark.timeout(240)
def test_2x2x2_on_8_ranks_equals_one_process(no_children_left):
    results = lessonlib.launch(grid_then_train, 8, timeout=200)
    assert all(g.agrees_with_torch for g, _ in results)
    assert [g.sums["tp"] for g, _ in results] == [1, 1, 5, 5, 9, 9, 13, 13]
    per_rank = [r for _, r in results]
    assert [r.coords for r in per_rank] == [(i, j, k) for i in (0, 1) for j in (0, 1)
                                               for k in (0, 1)]
    summary = assert_equals_one_process(per_rank)
    assert summary.losses[-1] < summary.losses[0]  # it trains
    # 1F1B: stage 0 holds min(p, m) = 2 micro-batches, stage 1 holds 1
    assert [r.peak_stash for r in per_rank] == [2, 2, 1, 1, 2, 2, 1, 1]
    # TP halves the layers' weights: 12h^2 + 7h split, 6h replicated per layer
    h, blocks = HYBRID_CONFIG.hidden, 2
    layer = 12 * h * h // 2 + 7 * h // 2 + 6 * h
    first = blocks * layer + (HYBRID_CONFIG.vocab + HYBRID_CONFIG.seq) * h
    last = blocks * layer + 2 * h + HYBRID_CONFIG.vocab * h
    assert [r.param_count for r in per_rank[:4]] == [first, first, last, last]
    assert [expected_param_count(HYBRID_CONFIG, 2, 2, s) for s in (0, 1)] == [first, last]
    assert all(0 <= r.idle_share < 1 for r in per_rank)


LAYOUTS = [(1, 2, 2), (2, 1, 2), (2, 2, 1)]


@pytest.mark.timeout(180)
def test_three_4_rank_layouts_equal_one_process(no_children_left):
    per_layout = lessonlib.launch(train_layouts, 4, LAYOUTS, steps=2, timeout=150)
    for i, layout in enumerate(LAYOUTS):
        per_rank = [ranks[i] for ranks in per_layout]
        assert max(r.coords for r in per_rank) == tuple(n - 1 for n in layout)
        assert_equals_one_process(per_rank)
        for r in per_rank:
            assert r.param_count == expected_param_count(HYBRID_CONFIG, layout[1], layout[2],
                                                         r.coords[1])


def test_stage_counts_put_embed_first_head_last_and_spread_layers():
    assert stage_counts(4, 2) == [3, 3]
    assert stage_counts(4, 4) == [2, 1, 1, 2]
    assert stage_counts(5, 2) == [4, 3]
    assert stage_counts(3, 1) == [5]


def test_expected_traffic_follows_megatron_counts():
    cfg = GPTConfig(vocab=27, seq=16, hidden=32, heads=4, layers=4)
    t = expected_traffic(cfg, 2, 2, 2, global_batch=8, m=2, stage=0, param_count=100)
    act = 4 * 2 * 16 * 32  # b = 8 / (2 * 2) = 2 sequences of (s, h) float32
    assert t.tp_all_reduce == Messages(calls=4 * 2 * 2, bytes=16 * act)
    assert t.pp_send == Messages(calls=2, bytes=2 * act)
    assert t.dp_all_reduce == Messages(calls=1, bytes=400)
    middle = expected_traffic(cfg, 1, 4, 1, global_batch=8, m=4, stage=1, param_count=10)
    assert middle.tp_all_reduce.calls == 0 and middle.pp_send.calls == 8
    assert middle.dp_all_reduce.calls == 0


def test_fewer_layers_than_stages_is_rejected_before_any_process(no_children_left):
    with pytest.raises(ValueError, match=r"pp=8 stages but the model has layers=4.*pp <= 4"):
        run(pp=8)


def test_batch_not_divisible_by_d_times_m_is_rejected():
    with pytest.raises(ValueError, match=r"global_batch=10 is not divisible by dp\*m = 2\*2"):
        run(dp=2, pp=2, tp=2, global_batch=10)
    with pytest.raises(ValueError, match=r"global_batch=12 is not divisible.*use global_batch=16"):
        check_layout(HYBRID_CONFIG, dp=2, global_batch=12, m=4)


def test_tp_that_does_not_divide_heads_is_rejected():
    with pytest.raises(ValueError, match=r"tp=3 must divide heads=4.*\[1, 2, 4\]"):
        check_layout(HYBRID_CONFIG, tp=3)


@pytest.mark.parametrize("name,value", [("m", 0), ("dp", 1.5), ("global_batch", -8)])
def test_sizes_must_be_positive_integers(name, value):
    settings = {"dp": 1, "pp": 1, "tp": 1, "global_batch": 8, "m": 2, name: value}
    with pytest.raises(ValueError, match=f"{name}={value!r}"):
        check_layout(HYBRID_CONFIG, **settings)
