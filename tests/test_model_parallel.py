"""Naive model parallelism trains exactly like one process; only one rank works at a time;
each rank holds only its stage's parameters and sends one activation forward and one
gradient back per step; bad settings fail before any process starts.

One 4-rank launch runs the tiny GPT over 4 stages, then the MLP stack as two independent
lines of 2 ranks (0-1 and 2-3); the one-process references run here."""
import pytest

import lessonlib
from lessonlib import model_parallel as mp

SETTINGS = dict(steps=3, warmup=1, batch=8, lr=0.05, seed=0)
GPT = dict(model="gpt", layers=6, hidden=64)
MLP = dict(model="mlp", layers=8, width=128)


def two_lines_worker():
    return {"gpt": mp.assembly_line(p=4, **GPT, **SETTINGS),
            "mlp": mp.assembly_line(p=2, **MLP, **SETTINGS)}


@pytest.fixture(scope="module")
def runs():
    ranks = lessonlib.launch(two_lines_worker, 4, timeout=240)
    return {kind: [r[kind] for r in ranks] for kind in ("gpt", "mlp")}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind, settings, lines", [("gpt", GPT, [0]), ("mlp", MLP, [0, 2])])
def test_same_losses_and_weights_as_one_process(runs, kind, settings, lines):
    reference = mp.single_process(**settings, **SETTINGS)
    for first_rank in lines:
        diff = mp.compare_parity(runs[kind][first_rank:], reference)
        assert diff.loss_max_abs_diff < 1e-5, diff
        assert diff.weights_max_abs_diff < 1e-6, diff
    assert len(runs[kind][-1].losses) == SETTINGS["steps"] + SETTINGS["warmup"]


@pytest.mark.timeout(300)
def test_one_rank_works_at_a_time(runs):
    work = [(s.start, s.end, r.stage, s.kind, s.step)
            for r in runs["gpt"] for s in r.timeline if s.kind in ("F", "B")]
    work.sort()
    # The ranks' clocks share a zero only as well as they left one barrier together: on 2
    # loaded cores one rank may leave it microseconds late, so a span can seem to start a
    # little before the one it waited for ended (16 us of 2.5 ms spans was seen once). Two
    # ranks working at once would overlap by most of a span.
    for (s0, e0, *a), (s1, e1, *b) in zip(work, work[1:]):
        slack = 0.25 * min(e0 - s0, e1 - s1)
        assert e0 <= s1 + slack, \
            f"{a} and {b} overlap: [{s0:.4f}, {e0:.4f}] and [{s1:.4f}, {e1:.4f}]"
    order = [(stage, kind) for _, _, stage, kind, step in work if step == SETTINGS["warmup"]]
    assert order == [(0, "F"), (1, "F"), (2, "F"), (3, "F"), (3, "B"), (2, "B"), (1, "B"), (0, "B")]
    rows = mp.summarize(runs["gpt"])
    assert all(0 < row.idle_measured < 1 for row in rows)


@pytest.mark.timeout(300)
def test_each_rank_holds_its_stage_and_sends_one_message_each_way(runs):
    model = mp.make_model(**GPT)
    dense_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    gpt = runs["gpt"]
    assert sum(r.param_bytes for r in gpt) == dense_bytes
    assert [r.layers for r in gpt] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    mlp = runs["mlp"]
    assert {r.param_bytes for r in mlp} == {sum(p.numel() * 4 for p in mp.make_model(**MLP)
                                                    .parameters()) // 2}
    activation = 8 * 32 * 64 * 4                                  # (b, s, h) fp32
    steps = SETTINGS["steps"]
    for r in gpt:
        sends = r.messages.get("send", {"calls": 0, "bytes": 0})
        expected = (r.stage < 3) + (r.stage > 0)                 # activation on, gradient back
        assert sends["calls"] == expected * steps
        assert sends["bytes"] == expected * steps * activation
        assert r.stash_bytes > 0


def test_bad_settings_fail_before_any_process_starts():
    with pytest.raises(ValueError, match="p=3 stages must divide the world size 4"):
        mp.run_assembly_line(4, p=3)
    with pytest.raises(ValueError, match="p=4 stages but the mlp has 3 layers"):
        mp.run_assembly_line(4, model="mlp", layers=3)
    with pytest.raises(ValueError, match="model='cnn'"):
        mp.check_line(2, model="cnn")
    with pytest.raises(ValueError, match="batch=0"):
        mp.check_line(2, batch=0)
