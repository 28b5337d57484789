"""The MoE cost model: published totals, hand-computed shapes, the all-to-all's terms.
Pure: no process, no torch."""
import pytest

from lessonlib.costmodel import CLUSTERS, MODELS
from lessonlib.costmodel.memory import usable_memory_bytes
from lessonlib.costmodel.moe import (MOE_MODELS, PUBLISHED, MoEModel, active_params,
                                     alltoall_terms, alltoall_time_s, choose_e, ep_memory_per_gpu,
                                     ep_vs_tp, expert_params, one_trillion, total_params,
                                     training_flops_per_token)


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_presets_match_the_published_totals(name):
    total, active = PUBLISHED[name]
    m = MOE_MODELS[name]
    assert abs(total_params(m) - total) <= 0.5e9                      # stated to the billion
    assert active_params(m) == pytest.approx(active, rel=0.02)       # 37.6 B vs "37 B"
    assert training_flops_per_token(m) == 6 * active_params(m)


def test_a_small_shape_by_hand():
    # 2 layers, the second MoE: 4 experts of two h x 8 matrices, top-1, 1 shared, tied
    m = MoEModel("toy", L=2, h=4, V=10, attention=64, ffn=16, E=4, k=1, expert_ffn=8,
                 moe_layers=1, shared=1, ffn_matrices=2, tied_embeddings=True)
    assert expert_params(m) == 64
    dense = 2 * (64 + 8) + 2 * 4 * 16 + (64 + 4 * 4) + 10 * 4 + 4
    assert total_params(m) == dense + 4 * 64
    assert active_params(m) == dense + 64
    mem = ep_memory_per_gpu(m, 2)
    assert mem.experts == 16 * 4 * 64 / 2 and mem.dense == 16 * dense
    zero = ep_memory_per_gpu(m, 2, d=4, zero1=True)
    assert zero.experts == (4 + 12 / 2) * 4 * 64 / 2 and zero.dense == (4 + 12 / 4) * dense
    with pytest.raises(ValueError, match="e=3 must divide E=4"):
        ep_memory_per_gpu(m, 3)
    with pytest.raises(ValueError, match="k=5 <= E=4"):
        MoEModel("bad", L=2, h=4, V=10, attention=64, ffn=16, E=4, k=5, expert_ffn=8,
                 moe_layers=1)


def test_the_all_to_all_pays_e_minus_1_latencies_and_its_off_rank_share():
    assert alltoall_terms(4, 4000) == (3, 3000)                 # busiest link: (e-1)/e
    assert alltoall_terms(4, 4000, links="shared") == (3, 12000)   # all ranks' slices
    assert alltoall_time_s(4, 4000, 1000, 0.5) == pytest.approx(1.5 + 3)
    assert alltoall_terms(1, 4000) == (0, 0)


def test_expert_parallelism_moves_n_over_k_times_less_than_tensor_parallelism():
    m, c = MOE_MODELS["mixtral-8x7B"], CLUSTERS["dgx-h100"]
    inside = ep_vs_tp(m, 8, 1, 4096, c)
    assert not inside.across_servers and inside.ep_comm_s < inside.tp_comm_s
    bandwidth = c.link(False)[0]
    assert inside.ep_comm_s == pytest.approx(
        4 * (7 * c.nvlink_latency_s + 4096 * 2 * 4096 * 2 * 7 / 8 / bandwidth))
    assert ep_vs_tp(m, 64, 1, 4096, c).across_servers


def test_choose_e_is_the_smallest_that_fits():
    c = CLUSTERS["dgx-h100"]
    usable = usable_memory_bytes(c.gpu)           # the GPU's memory less the named reserves
    pick = choose_e(MOE_MODELS["deepseek-v3"], 2048, c, p=16)
    assert pick.fits and pick.memory_per_gpu <= usable
    smaller = ep_memory_per_gpu(MOE_MODELS["deepseek-v3"], pick.e // 2, 16, 128, True)
    assert smaller.total > usable
    assert not choose_e(MOE_MODELS["deepseek-v3"], 8, c).fits   # 8 GPUs cannot hold 671 B


def test_the_trillion_question_for_an_moe():
    answer = one_trillion(MODELS["megatron-1T"].params())
    assert answer.moe_total == pytest.approx(1.0e12, rel=0.01)
    assert answer.moe_active < 40e9
    # the same ~16 TB of state to hold, about 27 times fewer FLOPs per token
    assert answer.moe_state_bytes == pytest.approx(answer.dense_state_bytes, rel=0.02)
    assert 25 < answer.flops_ratio_dense_over_moe < 28


def test_across_servers_only_the_off_server_share_crosses_the_network():
    from lessonlib.costmodel.moe import dispatch_bytes, moe_layer_comm_s
    m, c = MOE_MODELS["deepseek-v3"], CLUSTERS["dgx-h100"]
    size = dispatch_bytes(1, 4096, m.h, m.k)
    network, latency = c.link(True)
    assert moe_layer_comm_s(m, 64, 1, 4096, c, True) == pytest.approx(
        4 * (63 * latency + size * 56 / 64 / network))


def test_the_smallest_e_exercise_knows_the_slips():
    from lessonlib.exercises.moe import check_smallest_e

    assert check_smallest_e(None).ok is None
    assert check_smallest_e(4).ok          # 71.4 GB of model state in the usable 72 GB
    assert "over the" in str(check_smallest_e(2)) and "smaller e fits" in str(check_smallest_e(8))
    assert "must divide" in str(check_smallest_e(3))
