"""Sequence parallelism and recomputation are the dense layer, keep the bytes the formula says
and send what tensor parallelism sends.

* Parity (float64): every mode (TP, TP+SP, TP+selective, TP+SP+selective, full, TP+SP+full)
  of a transformer layer, and the tiny GPT with TP+SP (replicated or vocabulary-parallel
  head), equal the dense one-process model at t = 1, 2, 3, 4: outputs, input and weight
  gradients, weights after 3 SGD steps; PyTorch's own plan (``SequenceParallel`` with
  ``ColwiseParallel``/``RowwiseParallel``) on the same weights agrees with both.
* Activation bytes: measured by ``saved_bytes`` equal
  ``costmodel.memory.course_layer_activation_bytes`` to the byte for every mode at t = 1, 2,
  4; TP+SP keeps 1/t of the dense layer's bytes on each rank.
* Ledger: TP+SP's all-gathers and reduce-scatters move exactly the ring bytes of TP's
  all-reduces; on top come the re-gathers of the column layers' inputs in backward and the
  LayerNorm/bias gradient sums (6 all-reduces of h elements); full recompute repeats the
  forward's collectives in backward, all but the last (nothing needs the MLP's summed output).
* A sequence that t does not divide, or a TP+SP layer fed the whole sequence instead of its
  s/t rows: one error naming s and t, nothing sent.

* Pipeline stages whose blocks recompute ("selective", "full", set with
  ``models.set_recompute`` before the model is cut) train through 1F1B on 4 stages exactly
  as the one-process model without recompute (first-step gradients, float32, 1e-6).
* The layers' constructors fill this rank's slice of the dense layer a seed gives.

One 4-rank launch (groups of t = 1, 2, 4 consecutive ranks) and one 3-rank launch (t = 3).
Shapes: parity b=2, s=12, h=48, 12 heads; bytes and ledger b=2, s=16, h=32, 4 heads. A 2-rank
launch checks every mode's parity again where the group of t = 2 is the whole world, with
small shapes (b=2, s=4, h=16, 2 heads): the smallest test that sees a LayerNorm gradient
left unsummed (the bug zoo names it)."""
import pytest
import torch
import torch.distributed as dist

import lessonlib
from lessonlib.baseline import corpus_batches, flat
from lessonlib.costmodel.memory import course_layer_activation_bytes
from lessonlib.models import PARITY_CONFIG, GPTConfig, TinyGPT, lm_loss, set_recompute
from lessonlib.pipeline import schedule_runs
from lessonlib.pipeline.runner import make_runner
from lessonlib.pipeline.stages import stage_parameters
from lessonlib.tensor_parallel import layer_runs as tp_runs
from lessonlib.tensor_parallel.parallelize import parallelize_gpt
from lessonlib.tensor_parallel import sequence_runs as sp

TOL = 1e-12                 # float64
MODES = list(sp.MODES)


def recompute_worker(modes=("selective", "full"), m: int = 2, micro: int = 2) -> dict:
    p, stage, cfg = dist.get_world_size(), dist.get_rank(), PARITY_CONFIG
    ref_model, first_grads, _ = schedule_runs.reference(m, steps=1, micro=micro)
    want = flat(first_grads[q] for q in stage_parameters(ref_model, p, 1, stage))
    out = {}
    for mode in modes:
        model = set_recompute(TinyGPT(cfg, 0), mode)
        chunks, runner = make_runner("lessonlib", "1f1b", model, p, m, 1, stage, lm_loss,
                                          (micro, cfg.seq, cfg.hidden))
        x, y = corpus_batches(cfg, micro * m, 0)(0)
        runner.step(x, y)
        got = flat(q.grad for c in chunks for q in c.parameters())
        out[mode] = ((got - want).abs().max() / want.abs().max()).item()
        out[mode + " blocks"] = sorted({b.recompute for c in chunks for b in c.modules()
                                        if hasattr(b, "recompute")})
    return out


def four_worker():
    return {"parity": {t: sp.parity_report(t) for t in (1, 2, 4)},
            "bytes": {t: sp.activation_report(t) for t in (1, 2, 4)},
            "ledger": {t: sp.ledger_report(t) for t in (2, 4)},
            "bad": sp.bad_sequence_report(),
            "constructors": {t: tp_runs.constructor_report(t) for t in (2, 4)},
            "pipeline": recompute_worker()}


@pytest.fixture(scope="module")
def four():
    return lessonlib.launch(four_worker, 4, timeout=200)


@pytest.fixture(scope="module")
def three():
    return lessonlib.launch(sp.parity_report, 3, 3, timeout=200)


@pytest.fixture(scope="module")
def two():
    return lessonlib.launch(sp.parity_report, 2, 2, s=4, h=16, heads=2, models=(), timeout=60)


def _parity(ranks, t):
    return [r["parity"][t] for r in ranks]


def _assert_equal_to_dense(reports, name, t):
    for r in reports:
        got = r.vs_dense[name]
        for what in ("output", "input_grad", "grads", "weights_after_steps"):
            error = getattr(got, what)
            if error is not None:
                assert error < TOL, (f"rank {r.rank} t={t} {name}: {what} off by "
                                     f"{error:.2e} ({got.worst_grad}, {got.worst_weight})")
    losses = [r.vs_dense[name].losses for r in reports]
    assert all(x == losses[0] for x in losses)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("t", (1, 2, 4))
@pytest.mark.parametrize("mode", MODES)
def test_every_mode_equals_the_dense_layer(four, mode, t):
    _assert_equal_to_dense(_parity(four, t), mode, t)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", MODES)
def test_on_two_ranks_every_mode_equals_the_dense_layer(two, mode):
    _assert_equal_to_dense(two, mode, 2)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("t", (1, 2, 4))
@pytest.mark.parametrize("name", ["gpt+sp", "gpt+sp+vocab"])
def test_the_sequence_parallel_gpt_equals_the_dense_gpt(four, name, t):
    _assert_equal_to_dense(_parity(four, t), name, t)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("t", (1, 2, 4))
def test_pytorch_sequence_parallel_plan_agrees_on_the_same_weights(four, t):
    for r in _parity(four, t):
        theirs = r.torch
        assert theirs.largest() < TOL, theirs


@pytest.mark.timeout(300)
def test_at_t3_every_mode_the_gpt_and_pytorch_plan_equal_the_dense_model(three):
    for name in [*MODES, "gpt+sp", "gpt+sp+vocab"]:
        _assert_equal_to_dense(three, name, 3)
    for r in three:
        assert r.torch.largest() < TOL, r.torch


@pytest.mark.timeout(300)
def test_pipeline_stages_that_recompute_equal_one_process(four):
    for r in four:
        for mode in ("selective", "full"):
            assert r["pipeline"][mode] < 1e-6, r["pipeline"]
            assert r["pipeline"][mode + " blocks"] == [mode], r["pipeline"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("t", (1, 2, 4))
def test_saved_bytes_equal_the_formula_to_the_byte(four, t):
    for r in four:
        kept = r["bytes"][t].kept
        for mode in ["dense", *MODES]:
            assert kept[mode].measured == kept[mode].formula, (mode, kept[mode])
        # TP+SP keeps 1/t of the dense layer on each rank; so does full recompute with SP
        assert kept["tp+sp"].measured * t == kept["dense"].measured
        assert kept["tp+sp+full"].measured * t == kept["full"].measured
        if t > 1:
            assert (kept["full"].measured < kept["tp+sp+selective"].measured
                    < kept["tp+sp"].measured < kept["tp"].measured
                    < kept["dense"].measured)


def test_the_formula_by_hand():
    # b=2, s=16, h=32, a=4, float64: 16*sbh + 4*sb + abs elements
    assert course_layer_activation_bytes(2, 16, 32, 4) == 8 * (16 * 1024 + 4 * 32 + 128)
    assert course_layer_activation_bytes(2, 16, 32, 4, 2, True) == 8 * (16 * 1024 + 4 * 32
                                                                        + 128) // 2
    assert course_layer_activation_bytes(2, 16, 32, 4, 4, False, "selective", 4) == \
        4 * (4 * 1024 + 4 * 32 + 12 * 1024 // 4)
    assert course_layer_activation_bytes(2, 16, 32, 4, 4, False, "full", 2) == 2 * 1024
    with pytest.raises(ValueError, match="recompute='some'"):
        course_layer_activation_bytes(2, 16, 32, 4, recompute="some")


def _ring(events, op):
    return [size for kind, size in events if kind == op]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("t", (2, 4))
def test_sequence_parallelism_sends_the_bytes_tensor_parallelism_sends(four, t):
    for r in four:
        ledger = r["ledger"][t]
        e, bsh, h = ledger.element_size, ledger.b * ledger.s * ledger.h, ledger.h
        tp, sp_ = ledger.sent["tp"], ledger.sent["tp+sp"]
        assert [(k, n) for k, n in tp.forward.events] == [("all_reduce", bsh * e)] * 2
        assert [(k, n) for k, n in tp.backward.events] == [("all_reduce", bsh * e)] * 2
        fwd, bwd = sp_.forward.events, sp_.backward.events
        # forward: g (all-gather of s/t rows) before each column layer, g-bar after each row
        assert fwd == [("all_gather", bsh * e // t), ("reduce_scatter", bsh * e)] * 2
        assert _ring(fwd, "all_reduce") == []
        # backward: the conjugates (2 reduce-scatters, 2 all-gathers), the 2 re-gathers of
        # the column layers' inputs, and 6 gradient sums of h elements (LN weights, biases)
        assert sorted(_ring(bwd, "reduce_scatter")) == [bsh * e] * 2
        assert _ring(bwd, "all_gather") == [bsh * e // t] * 4
        assert _ring(bwd, "all_reduce") == [h * e] * 6
        ring = lambda k, n: (t - 1) / t * n * (2 if k == "all_reduce" else 1) * (  # noqa: E731
            t if k == "all_gather" else 1)
        tp_bytes = sum(ring(k, n) for k, n in tp.forward.events + tp.backward.events)
        conjugates = fwd + [(k, n) for k, n in bwd if k == "reduce_scatter"] + \
            [("all_gather", bsh * e // t)] * 2
        assert sum(ring(k, n) for k, n in conjugates) == pytest.approx(tp_bytes)
        assert tp_bytes == pytest.approx(8 * bsh * (t - 1) / t * e)   # Megatron 2021 §3.2


@pytest.mark.timeout(300)
@pytest.mark.parametrize("t", (2, 4))
def test_full_recompute_repeats_the_forward_collectives_in_backward(four, t):
    for r in four:
        sent = r["ledger"][t].sent
        for plain, full in (("tp", "full"), ("tp+sp", "tp+sp+full")):
            again = [x for x in sent[full].backward.events]
            for event in sent[plain].backward.events:
                again.remove(event)
            # all but the last: PyTorch's checkpoint stops recomputing once it has rebuilt every
            # tensor backward needs, and nothing keeps the MLP's output, whose sum is the last
            assert sorted(again) == sorted(sent[plain].forward.events[:-1]), again
            assert sent[full].forward.events == sent[plain].forward.events


@pytest.mark.timeout(300)
def test_a_sequence_t_does_not_divide_fails_naming_s_and_t(four):
    bad = four[0]["bad"]
    assert bad["messages_sent"] == 0
    for message in bad["messages"].values():
        assert message and "s=6" in message and "t=4" in message, bad
    assert bad["messages"]["whole sequence into an SP block"] == (
        "a sequence-parallel layer takes this rank's s/t rows, but got 6 rows: 6 x t=4 is more "
        "than the model's sequence s=6 (the whole sequence? feed it split_sequence(x, group) or a "
        "SequenceScatter's output)")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("t", (2, 4))
def test_constructors_fill_the_slice_of_the_dense_layer(four, t):
    for r in four:
        assert r["constructors"][t] == {"column": 0.0, "row": 0.0}


def shorter_sequence_worker(s: int = 6) -> dict:
    """The TP+SP GPT (a model of s = 8) fed ``s`` tokens, as the dense and plain TP GPTs
    accept: float64 parity with the dense GPT (a maximum length, not an exact one)."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        ctx, cfg = tp_runs.tp_context(dist.get_world_size()), GPTConfig(vocab=16, seq=8,
                                                                      hidden=16, heads=2)
        batches = [(x[:, :s], y[:, :s]) for x, y in tp_runs.token_batches(2, cfg, 2, 1, "cpu")]
        return tp_runs.compare_with_dense(TinyGPT(cfg, 0), lambda m: parallelize_gpt(
            m, ctx.axis("tp").group, sequence_parallel=True), batches, lm_loss)
    finally:
        torch.set_default_dtype(before)


@pytest.mark.timeout(60)
def test_the_sequence_parallel_gpt_takes_a_sequence_shorter_than_its_own():
    for r in lessonlib.launch(shorter_sequence_worker, 2, timeout=60):
        for what in ("output", "grads", "weights_after_steps"):
            assert getattr(r, what) < TOL, r
