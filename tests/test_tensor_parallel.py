"""Tensor parallelism is the dense model: at t = 1, 2 and 4 the MLP, a transformer layer and
the whole tiny GPT (vocabulary-parallel embedding and head included) give the dense outputs,
input gradients, weight and bias gradients, and weights after 3 SGD steps; the ledger counts
exactly one all-reduce per MLP forward and one per backward, 8bsh(t-1)/t elements per layer
per rank (Megatron-LM 2021 §3.2); DTensor's ColwiseParallel/RowwiseParallel on the same
weights agree; each rank holds 1/t of the weight matrices; bad settings fail before anything
is sent.

One 4-rank launch checks everything: ranks form TP groups of t consecutive ranks, so t = 1,
2 and 4 run side by side. Shapes: b=4, s=32, h=128, 8 heads (the MLP's inner size 512).
A 2-rank launch checks the MLP's and the layer's parity and bytes again where the group of
t = 2 is the whole world, with small shapes (b=2, s=4, h=16, 2 heads): the smallest tests
that see a missing all-reduce or a layer left unsharded (the bug zoo names them)."""
import pytest

import lessonlib
from lessonlib.tensor_parallel import layer_runs as tp_runs
from lessonlib.costmodel import tp_elements_per_layer
from lessonlib.tensor_parallel.layers import check_divisible, check_pair, tp_size

B, S, H, HEADS = 4, 32, 128, 8
TS = (1, 2, 4)
TOL = 2e-6          # fp32; the sums run in a different order than in the dense layer


def everything_worker():
    return {"layers": tp_runs.layer_reports(TS, b=B, s=S, h=H, heads=HEADS, steps=3,
                                            kinds=("mlp", "block", "gpt"), with_torch=True),
            "ops": {t: tp_runs.ops_report(t) for t in (2, 4)},
            "gathered": tp_runs.gathered_mlp_report(2, b=B, s=S, h=H),
            "bad": tp_runs.bad_input_report()}


@pytest.fixture(scope="module")
def ranks():
    return lessonlib.launch(everything_worker, 4, timeout=280)


@pytest.fixture(scope="module")
def two_ranks():
    return lessonlib.launch(tp_runs.layer_report, 2, 2, b=2, s=4, h=16, heads=2,
                            kinds=("mlp", "block"), timeout=60)


def _assert_equal_to_dense(layer_reports, kind):
    """Every rank's ``layer_report``: ``kind`` equals the dense model, the same loss on all."""
    for layers in layer_reports:
        report = layers.layer(kind)
        for what in ("output", "input_grad", "grads", "weights_after_steps"):
            error = getattr(report, what)
            if error is not None:
                assert error < TOL, (
                    f"rank {layers.rank} t={layers.t} {kind}: {what} off by "
                    f"{error:.2e} (worst: {report.worst_grad}, {report.worst_weight})")
    losses = [layers.layer(kind).losses for layers in layer_reports]
    assert all(x == losses[0] for x in losses)     # every rank of every group: the same loss


@pytest.mark.timeout(300)
@pytest.mark.parametrize("t", TS)
@pytest.mark.parametrize("kind", ["mlp", "block", "gpt"])
def test_parity_with_the_dense_model(ranks, kind, t):
    _assert_equal_to_dense([r["layers"][t] for r in ranks], kind)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["mlp", "block"])
def test_on_two_ranks_parity_with_the_dense_model(two_ranks, kind):
    _assert_equal_to_dense(two_ranks, kind)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("t", TS)
def test_one_all_reduce_each_way_per_mlp_and_megatron_bytes_per_layer(ranks, t):
    payload = B * S * H * 4                                     # one (b, s, h) fp32 tensor
    for r in ranks:
        mlp, block = r["layers"][t].mlp, r["layers"][t].block
        per = 1 if t > 1 else 0                                 # t = 1 sends nothing
        assert (mlp.forward.all_reduce, mlp.backward.all_reduce) == (per, per)
        assert mlp.forward.payload_bytes == per * payload
        assert block.forward.all_reduce == block.backward.all_reduce == 2 * per
        assert block.forward.all_gather == block.backward.all_gather == 0
        # ring: 2(t-1)/t of each payload per rank; 4 payloads -> 8bsh(t-1)/t elements
        ring = block.forward.ring_bytes_per_rank + block.backward.ring_bytes_per_rank
        assert ring == pytest.approx(4 * tp_elements_per_layer(B, S, H, t))
        assert ring == pytest.approx(8 * B * S * H * (t - 1) / t * 4)


def _assert_one_t_th(layers, kind):
    """This rank's ``layer_report`` (its t and h): ``kind`` holds 1/t of the weight matrices."""
    t, h, report = layers.t, layers.h, layers.layer(kind)
    if kind == "mlp":
        # fc1 weight and bias, fc2 weight split; fc2's bias (h) is replicated
        inner = 4 * h
        sharded = (h * inner + inner + inner * h) * 4
        assert report.param_bytes == sharded // t + h * 4
        assert report.dense_param_bytes == sharded + h * 4
    else:
        # 12h^2 + 7h split (QKV, proj, fc1, fc2 and column biases); 6h replicated (LNs, 2 biases)
        assert report.param_bytes == ((12 * h * h + 7 * h) // t + 6 * h) * 4


@pytest.mark.timeout(300)
@pytest.mark.parametrize("t", TS)
def test_each_rank_holds_one_t_th_of_the_weight_matrices(ranks, t):
    for r in ranks:
        for kind in ("mlp", "block"):
            _assert_one_t_th(r["layers"][t], kind)
        mlp = r["layers"][t].mlp
        assert mlp.torch.param_bytes == mlp.param_bytes     # DTensor's split too


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", ["mlp", "block"])
def test_on_two_ranks_each_rank_holds_one_t_th_of_the_weight_matrices(two_ranks, kind):
    for layers in two_ranks:
        _assert_one_t_th(layers, kind)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("t", TS)
@pytest.mark.parametrize("kind", ["mlp", "block"])
def test_dtensor_on_the_same_weights_agrees(ranks, kind, t):
    for r in ranks:
        theirs = r["layers"][t].layer(kind).torch
        assert max(theirs.output, theirs.input_grad, theirs.grads) < TOL, theirs


@pytest.mark.timeout(300)
@pytest.mark.parametrize("t", (2, 4))
def test_f_g_gather_scatter(ranks, t):
    for r in ranks:
        for op, err in r["ops"][t].items():
            assert err == {"forward": 0.0, "grad": 0.0}, (op, err)


@pytest.mark.timeout(300)
def test_gather_then_scatter_pairing_is_right_but_sends_more(ranks):
    for r in ranks:
        g = r["gathered"]
        assert max(g.output, g.input_grad, g.grads) < TOL
        assert (g.forward.all_gather, g.forward.all_reduce) == (1, 1)
        assert (g.backward.all_gather, g.backward.all_reduce) == (1, 1)


@pytest.mark.timeout(300)
def test_bad_input_fails_clearly_before_anything_is_sent(ranks):
    bad = ranks[0]["bad"]
    assert bad["messages_sent"] == 0
    messages = bad["messages"]
    assert all(m is not None for m in messages.values()), messages
    assert ("heads=6 is not divisible by the tensor-parallel size t=4"
            in messages["heads not divisible by t"])
    assert "hidden=6" in messages["hidden not divisible by t"]
    assert "out_features=6" in messages["out_features not divisible by t"]
    assert "in_features=6" in messages["in_features not divisible by t"]
    assert "t=2 but the tensor-parallel group has 4 ranks" in messages["group size differs from t"]
    assert "gather_output=True" in messages["gather_output=True with input_is_parallel=True"]
    assert "input_is_parallel=True" in messages["gather_output=False with input_is_parallel=False"]


def test_checks_without_processes():
    with pytest.raises(ValueError, match="need a process group"):
        tp_size()
    with pytest.raises(ValueError, match=r"heads=6 is not divisible .* t=4; .*\[1, 2, 3, 6\]"):
        check_divisible("heads", 6, 4)
    check_divisible("heads", 8, 4)
    check_pair(False, True)
    check_pair(True, False)
    with pytest.raises(ValueError, match="gather_output=True"):
        check_pair(True, True)
    with pytest.raises(ValueError, match="input_is_parallel=False"):
        check_pair(False, False)
    with pytest.raises(ValueError, match="t=3 must be a positive divisor"):
        tp_runs.check_layer_settings(4, ts=(1, 3))
    with pytest.raises(ValueError, match="heads=4 is not divisible .* t=8"):
        tp_runs.check_layer_settings(8, ts=(8,), heads=4)
