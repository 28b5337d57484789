"""Zero-bubble pipelines (Qi et al., ICLR 2024): the backward split into B (input gradient)
and W (weight gradient), ZB-H1 and the V-shaped ZBV.

Without processes: ZB-H1's simulated bubble is (p-1)(T_F + T_B - T_W) per stage (Table 2)
for any p and m >= p, a third of 1F1B's at equal times, at 1F1B's peak memory; ZBV's, at
equal times and m >= 2p-1, is the start-up alone, (p-1) chunk forwards, a sixth of 1F1B's
whatever m; both pass the validator, which rejects a W before
its B. With processes (one launch per p = 2, 3, 4): both equal one process in losses,
gradients and weights after 3 SGD steps in float64, at m = 1, p and 2p+1 (and so do PyTorch's
ScheduleInterleavedZeroBubble and ScheduleZBVZeroBubble on the same stages at p = 2), and
lessonlib's recorded traces pass ``nccl_rules.nccl_hazards``."""
import contextlib
import io
import json

import pytest
import torch
from torch import nn

import lessonlib
from lessonlib.costmodel import Layout, bubble_fraction, bubble_time, stashed_microbatches
from lessonlib.instruments.nccl_rules import nccl_hazards
from lessonlib.pipeline import schedule_runs
from lessonlib.pipeline import schedules as S
from lessonlib.pipeline import zero_bubble
from lessonlib.pipeline.actions import Action, B, Kind, Schedule, W
from lessonlib.pipeline.executor import StepResult
from lessonlib.pipeline.split_backward import LayerOutputs, input_grad, weight_grad
from lessonlib.pipeline.validate import ScheduleError, StageTimes, check, replay, simulate

TIMES = [(1.0, 1.0, 1.0), (1.0, 1.5, 0.7), (1.0, 1.2, 1.0), (2.0, 1.0, 0.5)]


@pytest.mark.parametrize("p", [1, 2, 3, 4, 6])
@pytest.mark.parametrize("f,b,w", TIMES)
def test_zb_h1_bubble_is_p_minus_1_times_tf_plus_tb_minus_tw(p, f, b, w):
    for m in (p, p + 1, 2 * p + 1, 3 * p):
        sim = simulate(S.make("zb-h1", p, m), forward=f, backward=b, weight=w)
        assert sim.idle == pytest.approx([(p - 1) * (f + b - w)] * p)
        assert sim.idle == pytest.approx([bubble_time("zb-h1", p, f, b, w)] * p)
        one = simulate(S.make("1f1b", p, m), forward=f, backward=b + w)
        assert one.idle == pytest.approx([bubble_time("1f1b", p, f, b, w)] * p)


@pytest.mark.parametrize("p", [2, 3, 4, 6])
def test_at_equal_times_zb_h1_has_a_third_of_1f1b_and_zbv_only_the_start_up(p):
    for m in (p, 2 * p - 1, 2 * p, 3 * p, 8 * p):
        one = simulate(S.make("1f1b", p, m), forward=1, backward=2)
        zb = simulate(S.make("zb-h1", p, m), forward=1, backward=1, weight=1)
        assert zb.idle[0] == pytest.approx(one.idle[0] / 3)
        assert zb.bubble_ideal[0] == pytest.approx(bubble_fraction(p, m, schedule="zb-h1",
                                                                   convention="ideal"))
        # ZBV's chunks are half a stage: T_F = T_B = T_W = 1/2. Every device idles only
        # while the first micro-batch reaches device p-1, (p-1) chunk forwards (no schedule
        # that starts empty does better), 1F1B's (p-1)(T_F + T_B + T_W) / 6, whatever m.
        v = simulate(S.make("zbv", p, m, v=2), forward=0.5, backward=0.5, weight=0.5)
        start_up = (p - 1) * 0.5
        assert v.idle == pytest.approx([max(start_up, 2 * p - 1 - m)] * p)
        if m >= 2 * p - 1:
            assert v.idle == pytest.approx([one.idle[0] / 6] * p)
            assert v.bubble_ideal[0] == pytest.approx(bubble_fraction(p, m, schedule="zbv",
                                                                      convention="ideal"))
        assert v.idle[0] <= zb.idle[0] < one.idle[0]


@pytest.mark.parametrize("p", [2, 3, 4])
@pytest.mark.parametrize("f,b,w", TIMES[1:])
def test_at_unequal_times_zbv_still_leaves_a_bubble_that_does_not_grow_with_m(p, f, b, w):
    idle = [max(simulate(zero_bubble.zbv(p, m), forward=f / 2, backward=b / 2, weight=w / 2).idle)
            for m in (2 * p - 1, 2 * p, 3 * p + 1, 6 * p)]
    assert idle == pytest.approx([idle[0]] * 4)
    assert idle[0] < simulate(zero_bubble.zero_bubble_h1(p, 2 * p), forward=f, backward=b,
                              weight=w).idle[0]


@pytest.mark.parametrize("p", [1, 2, 3, 4, 6])
@pytest.mark.parametrize("m", [1, 2, 3, 5, 8, 13])
def test_zero_bubble_schedules_hold_min_p_m_micro_batches_until_their_w(p, m):
    assert simulate(zero_bubble.zero_bubble_h1(p, m)).peak_stash == [min(p, m)] * p
    zbv = simulate(zero_bubble.zbv(p, m)).peak_stash     # half-size chunk activations
    assert zbv == [min(2 * p, m + s + 1, 2 * m) for s in range(p)]
    assert max(zbv) == zbv[-1] == 2 * min(p, m)
    assert [stashed_microbatches("zbv", p, m, s) for s in range(p)] == [n / 2 for n in zbv]
    assert stashed_microbatches("zb-h1", p, m, 0) == min(p, m)
    for name, v in (("zb-h1", 1), ("zbv", 2)):
        sched = S.make(name, p, m, v)
        assert check(sched) == (p, m, v)
        for actions in sched:
            assert sum(a.kind == Kind.W for a in actions) == m * v
            assert all(a.kind != Kind.W or a.peer is None for a in actions)


def test_a_replay_gives_each_virtual_stage_the_times_of_the_stage_holding_its_layers():
    """1F1B fuses B and W into its backward; a virtual stage of half a stage's layers takes
    half of that stage's times, whichever device runs it: ZBV's device 0 runs virtual stages
    0 and 3, so its chunk 1 takes half of the last stage's times, not of its own device's."""
    ms = StageTimes(forward_ms=[1.0, 1.5, 0.5, 2.0], backward_ms=[0.0, 1.0, 2.5, 1.2],
                    weight_ms=[3.0, 0.5, 1.0, 0.8])

    def times(*keys, holder=lambda s, a: s, share=1.0):
        return lambda s, a: share * sum(getattr(ms, k)[holder(s, a)] for k in keys)

    zb_h1 = S.make("zb-h1", 4, 8)
    assert replay(zb_h1, ms).bubble == simulate(
        zb_h1, forward=times("forward_ms"), backward=times("backward_ms"),
        weight=times("weight_ms")).bubble
    one = S.make("1f1b", 4, 8)
    assert replay(one, ms).bubble == simulate(
        one, forward=times("forward_ms"), backward=times("backward_ms", "weight_ms")).bubble
    # (device, chunk) -> the stage of the 4-stage run that holds its layers, by hand: ZBV's
    # virtual stages are d and 7-d, interleaved's d and 4+d, each half of stage k // 2
    for name, holds in (("zbv", {(0, 0): 0, (1, 0): 0, (2, 0): 1, (3, 0): 1,
                                 (0, 1): 3, (1, 1): 3, (2, 1): 2, (3, 1): 2}),
                        ("interleaved", {(0, 0): 0, (1, 0): 0, (2, 0): 1, (3, 0): 1,
                                         (0, 1): 2, (1, 1): 2, (2, 1): 3, (3, 1): 3})):
        def half(*keys):
            return times(*keys, holder=lambda s, a: holds[s, a.chunk], share=0.5)

        sched = S.make(name, 4, 8, 2)
        fused = ("backward_ms", "weight_ms") if name == "interleaved" else ("backward_ms",)
        want = simulate(sched, forward=half("forward_ms"), backward=half(*fused),
                        weight=half("weight_ms"))
        assert replay(sched, ms).bubble == want.bubble, name
    with pytest.raises(ScheduleError, match="4 virtual stages cannot be cut evenly"):
        replay(S.make("1f1b", 2, 4), ms)


def test_explain_bubble_reads_each_virtual_stages_times_and_replays_them():
    """A simulated ZBV step handed over as a measured one: its F, B and W come back per
    virtual stage (device 0's two chunks apart), and replaying them gives its bubble."""
    f, b, w = [1.0, 2.0, 3.0, 4.0], [0.0, 1.5, 2.5, 0.5], [2.0, 1.0, 0.5, 3.0]
    sched = S.make("zbv", 2, 4)
    vstage = {(0, 0): 0, (1, 0): 1, (1, 1): 2, (0, 1): 3}
    sim = simulate(sched, forward=lambda s, a: f[vstage[s, a.chunk]],
                   backward=lambda s, a: b[vstage[s, a.chunk]],
                   weight=lambda s, a: w[vstage[s, a.chunk]])
    case = ("lessonlib", "zbv", 4, 2)
    per_rank = [{case: [StepResult(d, [], sim.timelines[d], sim.makespan, 0, 0, 0)]}
                for d in range(2)]
    why = schedule_runs.explain_bubble(per_rank, case)
    assert (why.forward_ms, why.backward_ms, why.weight_ms) == (
        [1e3 * t for t in f], [1e3 * t for t in b], [1e3 * t for t in w])
    assert why.simulated_with_measured_compute == pytest.approx(sim.bubble)
    assert why.measured == pytest.approx(sim.bubble)
    assert replay(sched, why).bubble == pytest.approx(sim.bubble)


def test_zbv_turns_round_on_the_last_stage_without_a_message():
    sched = zero_bubble.zbv(3, 4)
    assert sched.placement == "v"
    last = sched[2]
    assert not any(a.kind.is_send and a.peer == 2 for a in last)
    assert {a.peer for a in sched[0] if a.peer is not None} == {1}


@pytest.mark.parametrize("call,words", [
    (lambda: zero_bubble.zero_bubble_h1(0, 4), "p=0 must be a positive integer"),
    (lambda: zero_bubble.zbv(2, 0), "m=0 must be"),
    (lambda: S.make("zbv", 2, 4, v=3), "exactly two chunks"),
    (lambda: S.make("zb-h1", 2, 4, v=2), "needs schedule='interleaved'"),
    (lambda: zero_bubble.zero_bubble_h1_order(2, 4, 2), "stage must be an integer in 0..1"),
    (lambda: Layout(p=2, m=4, v=2, schedule="zbv"), "needs schedule='1f1b'"),
    (lambda: bubble_fraction(2, 4, 2, schedule="zb-h1"), "takes v=1"),
])
def test_bad_zero_bubble_settings_are_refused_with_the_setting_named(call, words):
    with pytest.raises(ValueError, match=words):
        call()


def test_the_validator_rejects_a_w_before_its_b_or_a_message_on_a_local_hand_over():
    good = zero_bubble.zero_bubble_h1(2, 2)
    s0 = list(good[0])
    i, j = s0.index(B(0)), s0.index(W(0))
    s0[i], s0[j] = s0[j], s0[i]
    with pytest.raises(ScheduleError, match="weight gradient"):
        check([s0, good[1]])
    v = zero_bubble.zbv(2, 2)
    bad = Schedule([v[0], [Action("RECV_F", 0, 1, 1)] + list(v[1])], "v")
    with pytest.raises(ScheduleError, match="hand over in memory"):
        check(bad)


def test_b_then_w_gives_the_gradients_of_one_backward():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 12), nn.GELU(), nn.LayerNorm(12), nn.Linear(12, 3))
    net = net.double()
    x = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    net(x).pow(2).mean().backward()
    want = [q.grad.clone() for q in net.parameters()] + [x.grad.clone()]
    net.zero_grad()
    layers = LayerOutputs(net)
    with layers.recording() as outs:
        loss = net(x).pow(2).mean()
    dx, kept = input_grad(loss, None, x, outs)
    assert all(q.grad is None for q in net.parameters())      # B computed no weight gradient
    weight_grad(kept)
    for got, ref in zip([q.grad for q in net.parameters()] + [dx], want):
        torch.testing.assert_close(got, ref, rtol=0, atol=1e-12)


def test_the_cost_model_prices_the_zero_bubble_schedules():
    from lessonlib.costmodel import GPT, estimate, get_cluster
    model = GPT(L=24, h=2304, a=24, s=2048, V=51200)
    est = {s: estimate(model, Layout(t=1, p=4, d=1, b=1, m=8, schedule=s),
                       get_cluster("dgx-a100"))
           for s in ("1f1b", "zb-h1", "zbv")}
    assert est["zbv"].time["bubble"] < est["zb-h1"].time["bubble"] < est["1f1b"].time["bubble"]
    assert est["zb-h1"].time["bubble"] == pytest.approx(est["1f1b"].time["bubble"] / 3)
    # Qi et al. 2024: ZB-H1 at 1F1B's activation memory on the first stage; its last stage
    # also holds p micro-batches (until their W) beside the loss's peak, so the busiest GPU
    # holds a little more
    from lessonlib.costmodel.memory import activation_bytes
    first = {s: activation_bytes(model, 1, 4, 1, 8, schedule=s, stage=0) for s in est}
    assert first["zb-h1"] == first["1f1b"]
    assert est["zb-h1"].memory.total >= est["1f1b"].memory.total


# ---------------------------------------------------------------- real ranks
@pytest.fixture(scope="module", params=[2, 3, 4])
def run(request):
    import pipeline_workers
    p = request.param
    return p, lessonlib.launch(pipeline_workers.zero_bubble, p, p, timeout=240)


@pytest.mark.timeout(300)
def test_zb_h1_and_zbv_match_one_process_after_3_steps(run, no_children_left):
    p, per_rank = run
    rows = schedule_runs.compare_parity([r["parity"] for r in per_rank], steps=3,
                                        dtype=torch.float64)
    assert {(r.engine, r.schedule, r.m) for r in rows} == {
        ("lessonlib", s, m) for s in ("zb-h1", "zbv") for m in {1, p, 2 * p + 1}} | (
        {("torch", "zb-h1", 2), ("torch", "zbv", 5)} if p == 2 else set())
    for row in rows:
        assert max(row.max_grads_diff, row.max_weights_diff, row.max_losses_diff) < 1e-9
        if row.engine == "torch":
            continue
        m = row.m
        want = ([min(2 * p, m + s + 1, 2 * m) for s in range(p)] if row.schedule == "zbv"
                else [min(p, m)] * p)
        assert row.peak_stash == want, row


@pytest.mark.timeout(300)
def test_zero_bubble_traces_pass_the_nccl_rules(run):
    p, per_rank = run
    names = per_rank[0]["traces"]
    assert set(names) == {f"{s} m={2 * p + 1}" for s in ("zb-h1", "zbv")}
    for name in names:
        assert nccl_hazards([r["traces"][name] for r in per_rank]) == [], name


def test_the_planner_considers_the_zero_bubble_schedules():
    """``plan`` keeps 1F1B unless asked (the 1 T design question of notebook 05 is a 1F1B
    answer); asked, and on the command line's --plan, it weighs ZB-H1 and ZBV too."""
    from lessonlib.costmodel import CLUSTERS, MODELS, plan
    from lessonlib.costmodel.__main__ import main
    from lessonlib.costmodel.planner import PLAN_SCHEDULES
    gpt3, a100 = MODELS["gpt3-175B"], CLUSTERS["dgx-a100"]
    only = plan(gpt3, a100, 64, 64, interleave=(1,))
    every = plan(gpt3, a100, 64, 64, interleave=(1,), schedules=PLAN_SCHEDULES)
    assert {e.layout.schedule for e in only.ranked} == {"1f1b"}
    assert {e.layout.schedule for e in every.ranked} == set(PLAN_SCHEDULES)
    assert every.best.layout.schedule != "1f1b"
    assert every.best.step_time_s < only.best.step_time_s
    assert f"({every.best.layout.schedule.upper()} schedule)" in every.explain()
    cli = ["--plan", "--json", "--model", "gpt3-175B", "--gpus", "64", "--global-batch", "64",
           "--gpu", "A100-80GB"]
    for extra, want in (([], every.best.layout.schedule), (["--schedule", "1f1b"], "1f1b")):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main(cli + extra) == 0
        assert json.loads(out.getvalue())["best"]["schedule"] == want
