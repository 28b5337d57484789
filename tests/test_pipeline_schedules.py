"""Pipeline schedules, the validator, the simulation, stage splits and the stash meter, all
without processes: a schedule is data, so its properties are checked as data.

The simulation must reproduce the published numbers: bubble (p-1)/(m+p-1) of wall time for
GPipe and 1F1B with balanced stages (GPipe §2.3), (p-1)/(v m) of ideal time interleaved
(Megatron-LM 2021 §2.2), stash min(p - stage, m) for 1F1B and m for GPipe (PipeDream-Flush
§3.2). The validator must reject broken schedules, naming the stage and the action."""
import dataclasses

import matplotlib
import pytest
import torch

from lessonlib.costmodel import bubble_fraction, in_flight_microbatches, stashed_microbatches
from lessonlib.exercises import pipeline as ex
from lessonlib.instruments.activations import ActivationMeter
from lessonlib.layer_split import balanced_split, layers_of, split_layers
from lessonlib.models import GPTConfig, TinyGPT, lm_loss, mlp_stack
from lessonlib.pipeline import schedules as S
from lessonlib.pipeline.actions import (COMPUTE, Action, B, F, add_communication, compute_only,
                                       describe, parse)
from lessonlib.pipeline.executor import PipelineExecutor
from lessonlib.pipeline.schedule_runs import ScheduleRow
from lessonlib.pipeline.stages import device_chunks, stage_modules, stage_parameters
from lessonlib.pipeline.validate import (ScheduleError, batched, check, check_batches, lockstep,
                                        simulate)

matplotlib.use("Agg")
GRID = [(p, m) for p in (1, 2, 3, 4, 6) for m in (1, 2, 3, 4, 5, 8, 13)]


# ---------------------------------------------------------------- the schedules
@pytest.mark.parametrize("p,m", GRID)
def test_every_schedule_is_valid_and_has_the_textbook_bubble(p, m):
    for name in ("gpipe", "1f1b"):
        sim = simulate(S.make(name, p, m), forward=1.0, backward=2.0)
        want = (p - 1) / (m + p - 1)
        assert sim.bubble == pytest.approx([want] * p)
        assert sim.bubble == pytest.approx([bubble_fraction(p, m, convention="wall")] * p)
        assert sim.bubble_ideal == pytest.approx([bubble_fraction(p, m, convention="ideal")] * p)


@pytest.mark.parametrize("p,m", GRID)
def test_peak_stash_is_min_p_minus_stage_m_for_1f1b_and_m_for_gpipe(p, m):
    assert simulate(S.one_f_one_b(p, m)).peak_stash == [min(p - s, m) for s in range(p)]
    assert simulate(S.gpipe(p, m)).peak_stash == [m] * p
    assert simulate(S.one_f_one_b(p, m)).peak_stash == [
        stashed_microbatches("1f1b", p, m, s) for s in range(p)]


def test_the_bubble_does_not_depend_on_the_forward_backward_ratio():
    for f, b in ((1.0, 1.0), (1.0, 3.0), (0.2, 0.5)):
        assert simulate(S.one_f_one_b(4, 8), forward=f, backward=b).bubble[0] == pytest.approx(3 / 11)


def test_p2p_latency_adds_to_the_bubble():
    sim = simulate(S.one_f_one_b(4, 8), latency=0.1)
    assert sim.bubble[0] > 3 / 11


def test_1f1b_warms_up_with_p_minus_stage_minus_1_forwards():
    p, m = 4, 8
    for s in range(p):
        order = [str(a) for a in S.one_f_one_b_order(p, m, s)]
        first_b = order.index("B0")
        assert order[:first_b] == [f"F{i}" for i in range(p - s)]  # warm-up + the first steady F
        assert order[first_b + 1::2][:m - (p - s)] == [f"F{i}" for i in range(p - s, m)]


def test_the_published_example_p4_m8():
    """REFERENCES: 3/11 = 27.3 % of wall time, 3/8 = 37.5 % of ideal; interleaved v=2 18.75 %."""
    assert simulate(S.gpipe(4, 8)).bubble[0] == pytest.approx(3 / 11)
    assert simulate(S.gpipe(4, 8)).bubble_ideal[0] == pytest.approx(3 / 8)
    sim = simulate(S.interleaved_one_f_one_b(4, 8, 2), forward=0.5, backward=1.0)
    assert sim.bubble_ideal[0] == pytest.approx(0.1875)


@pytest.mark.parametrize("p,v", [(2, 2), (2, 3), (3, 2), (4, 2), (4, 3)])
def test_interleaved_bubble_is_p_minus_1_over_v_m_of_ideal_time(p, v):
    for m in (p, 2 * p, 3 * p):
        sim = simulate(S.interleaved_one_f_one_b(p, m, v), forward=1 / v, backward=2 / v)
        assert sim.bubble_ideal == pytest.approx([(p - 1) / (v * m)] * p)
        assert sim.bubble == pytest.approx([bubble_fraction(p, m, v, "wall")] * p)


@pytest.mark.parametrize("p,v", [(2, 2), (4, 2), (4, 3), (8, 2)])
def test_interleaved_first_stage_stash_matches_korthikanti_eq5(p, v):
    """Stage 0 holds 2(p-1) + (v-1)p + 1 chunk-micro-batches = p (1 + (p-1)/(p v)) of its
    layers' worth; the cost model's in_flight_microbatches gives the same."""
    sim = simulate(S.interleaved_one_f_one_b(p, 2 * p, v))
    assert sim.peak_stash[0] == 2 * (p - 1) + (v - 1) * p + 1
    assert sim.peak_stash[0] / v == pytest.approx(in_flight_microbatches("1f1b", p, 2 * p, v))


def test_interleaved_with_one_chunk_is_1f1b():
    assert S.interleaved_one_f_one_b(3, 6, 1) == S.one_f_one_b(3, 6)


def test_every_f_has_its_messages():
    sched = S.one_f_one_b(3, 2)
    assert [str(a) for a in sched[1][:3]] == ["RECV_F0<-0", "F0", "SEND_F0->2"]
    assert all(a.kind != "RECV_F" for a in sched[0]) and all(a.kind != "SEND_F" for a in sched[2])
    assert describe(sched).splitlines()[0] == "stage 0: F0 F1 B0 B1"


@pytest.mark.parametrize("call,words", [
    (lambda: S.gpipe(0, 4), "p=0 must be a positive integer"),
    (lambda: S.one_f_one_b(2, 0), "m=0 must be"),
    (lambda: S.one_f_one_b(2, 2.0), "m=2.0 must be"),
    (lambda: S.interleaved_one_f_one_b(4, 6, 2), "m to be a multiple of p"),
    (lambda: S.interleaved_one_f_one_b(4, 6, 2), "use m=4 or 8"),
    (lambda: S.make("zb", 2, 2), "schedule='zb' is not one of"),
    (lambda: S.make("1f1b", 2, 2, v=2), "needs schedule='interleaved'"),
    (lambda: parse("F0 X1"), "cannot read 'X1'"),
])
def test_bad_settings_are_refused_with_the_setting_named(call, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        call()


# ---------------------------------------------------------------- the validator rejects
def _swap(actions, i, j):
    actions = list(actions)
    actions[i], actions[j] = actions[j], actions[i]
    return actions


def _edit(schedule, stage, actions):
    out = [list(a) for a in schedule]
    out[stage] = actions
    return out


GOOD = S.one_f_one_b(3, 4)


def _broken():
    """(schedule, words the error must contain) for a dozen ways to get it wrong."""
    s1 = GOOD[1]
    i_f0, i_b0 = s1.index(F(0)), s1.index(B(0))
    i_recv = s1.index(Action("RECV_F", 0, 0, 0))
    wrong_peer = [dataclasses.replace(a, peer=2) if a.kind == "RECV_F" and a.microbatch == 1
                  else a for a in s1]
    yield _edit(GOOD, 1, _swap(s1, i_f0, i_b0)), "stage 1, action"
    yield _edit(GOOD, 1, _swap(s1, i_recv, i_f0)), "before its input arrives"
    yield _edit(GOOD, 1, [a for a in s1 if a != B(2)]), "never runs the backward of micro-batch 2"
    yield _edit(GOOD, 1, [a for a in s1 if a.kind != "SEND_B" or a.microbatch != 3]), \
        "never runs the send of its input gradient"
    yield _edit(GOOD, 1, wrong_peer), "is stage 0, not 2"
    yield _edit(GOOD, 1, s1 + [F(0)]), "runs twice"
    yield _edit(GOOD, 0, [F(-1)] + GOOD[0]), "micro-batch must be in 0..3"
    yield _edit(GOOD, 1, s1 + ["F9"]), "is not an Action"
    yield _edit(GOOD, 1, s1 + [Action("X", 0)]), "kind 'X'"
    yield _edit(S.gpipe(2, 1), 0, [Action("RECV_F", 0, 0, 1)] + S.gpipe(2, 1)[0]), \
        "virtual stage 0 is the first one"
    yield _deadlock(), "deadlock"


def _deadlock():
    """1F1B with GPipe's order on stage 1: stage 0 waits for B0, stage 1 for F4."""
    orders = [S.one_f_one_b_order(4, 6, s) for s in range(4)]
    orders[1] = compute_only(S.gpipe(4, 6)[1])
    return add_communication(orders)


@pytest.mark.parametrize("schedule,words", list(_broken()))
def test_the_validator_rejects_broken_schedules_naming_the_problem(schedule, words):
    with pytest.raises(ScheduleError, match=words):
        simulate(schedule)


def test_a_deadlock_names_every_stuck_stage():
    with pytest.raises(ScheduleError) as err:
        simulate(_deadlock())
    text = str(err.value)
    assert "stage 0, action" in text and "waits for the gradient of micro-batch 0 from stage 1" in text
    assert "stage 1, action" in text and "waits for the activation of micro-batch 4 from stage 0" in text


def test_times_whose_sums_overflow_are_refused_not_a_nan_bubble():
    with pytest.raises(ScheduleError) as err:
        simulate(S.make("zbv", 2, 4), forward=1e308, backward=1e308)
    assert str(err.value) == (
        "the times (forward=1e+308, backward=1e+308, weight=1.0, send=0.0, latency=0.0) add up "
        "past the largest float (about 1.8e308) in this schedule, so its bubble would be nan; "
        "use smaller units (ms instead of s, or every time scaled down by the same factor)")
    with pytest.raises(ScheduleError, match="forward=a function, .*latency=1e"):
        simulate(S.gpipe(2, 2), forward=lambda s, a: 1e308, latency=1e308)


def test_a_micro_batch_missing_everywhere_is_caught_when_m_is_given():
    short = S.gpipe(2, 3)
    assert check(short) == (2, 3, 1)
    with pytest.raises(ScheduleError, match="micro-batch 3"):
        check(short, m=4)


# ---------------------------------------------------------------- blocking batches (NCCL safety)
def _every_schedule():
    """Every family at p = 2..4 and several m (interleaved at v = 2 and 3)."""
    for name in S.SCHEDULES:
        for p in (2, 3, 4):
            for m in sorted({1, 2, p, p + 1, 2 * p, 2 * p + 1, 3 * p}):
                for v in ((2, 3) if name == "interleaved" else (None,)):
                    try:
                        yield pytest.param(S.make(name, p, m, v), id=f"{name}-p{p}-m{m}-v{v}")
                    except ValueError:             # m not a multiple of p (interleaved)
                        continue


@pytest.mark.parametrize("sched", list(_every_schedule()))
def test_blocking_batches_never_deadlock_and_carry_every_message(sched):
    """The executor's rounds (``lockstep``): the schedule's computes in its order, every
    send and receive in exactly one batch, and the batches, each waited on whole before
    the next compute, never deadlock (``check_batches`` plays them)."""
    check_batches(sched)
    for actions, units in zip(sched, lockstep(sched)):
        assert [u for u in units if not isinstance(u, list)] == compute_only(actions)
        moved = sorted(map(str, (a for u in units if isinstance(u, list) for a in u)))
        assert moved == sorted(str(a) for a in actions if a.kind not in COMPUTE)


@pytest.mark.parametrize("name,p,m,v", [("interleaved", 2, 4, 2), ("interleaved", 4, 8, 2),
                                        ("zbv", 3, 6, 2)])
def test_one_batch_per_gap_of_the_action_list_would_deadlock(name, p, m, v):
    """Posting each run of sends and receives between two computes as one blocking batch
    hangs the interleaved schedule (a stage sends a gradient its neighbour receives only
    after a forward the first stage's next batch must feed), and would pair ZBV's messages
    wrongly (a stage lists its receives in another order than its neighbour sends them).
    Hence the rounds."""
    sched = S.make(name, p, m, v)
    with pytest.raises(ScheduleError, match="deadlock with blocking batches|another order"):
        check_batches(sched, [batched(actions) for actions in sched])


def test_batches_whose_sends_and_receives_are_in_different_orders_are_refused():
    sched = S.gpipe(2, 2)
    units = lockstep(sched)
    units[1] = [u for u in units[1] if not isinstance(u, list)]
    recvs = [Action("RECV_F", 1, 0, 0), Action("RECV_F", 0, 0, 0)]
    units[1][:0] = [recvs]
    with pytest.raises(ScheduleError, match="another order"):
        check_batches(sched, units)


def test_balanced_split_minimises_the_largest_stage():
    assert balanced_split([1, 1, 1, 1], 2) == [2, 2]
    assert balanced_split([5, 1, 1, 1, 1, 1], 2) == [1, 5]
    assert balanced_split([1, 2, 3, 4], 4) == [1, 1, 1, 1]
    assert balanced_split([4, 3, 2, 1], 2) == [1, 3]


def test_fewer_layers_than_stages_is_a_clear_error():
    with pytest.raises(ValueError, match="cannot cut 4 layers into 5 stages"):
        split_layers(mlp_stack(8, 4), 5)
    with pytest.raises(ValueError, match="counts=\\[1, 1\\] must give 2 stages"):
        split_layers(mlp_stack(8, 4), 2, counts=[1, 1])


def test_stages_compute_exactly_the_model():
    gpt = TinyGPT(GPTConfig(vocab=27, seq=8, hidden=16, heads=2, layers=4))
    x = torch.randint(0, 27, (3, 8))
    for p in (1, 2, 3, 6):
        torch.testing.assert_close(torch.nn.Sequential(*split_layers(gpt, p))(x), gpt(x))
    mlp = mlp_stack(8, 4)
    assert len(layers_of(mlp)) == 4                  # Linear+GeLU pairs, then the last Linear
    torch.testing.assert_close(torch.nn.Sequential(*split_layers(mlp, 2, [1, 3]))(torch.ones(2, 8)),
                               mlp(torch.ones(2, 8)))


def test_interleaved_chunks_and_their_parameters():
    gpt = TinyGPT(GPTConfig(vocab=27, seq=8, hidden=16, heads=2, layers=6))
    chunks = stage_modules(gpt, 2, 2, 1)
    stages = split_layers(gpt, 4)
    assert len(chunks) == 2
    for got, want in zip(chunks, device_chunks(stages, 2, 1)):
        assert all(torch.equal(a, b) for a, b in zip(got.parameters(), want.parameters()))
    originals = stage_parameters(gpt, 2, 2, 1)
    copies = [q for c in chunks for q in c.parameters()]
    assert len(originals) == len(copies)
    assert all(torch.equal(a, b) and a is not b for a, b in zip(originals, copies))


# ---------------------------------------------------------------- stash meter and executor
def test_stash_meter_counts_saved_activations_not_parameters():
    layer = torch.nn.Linear(16, 16)
    meter = ActivationMeter(layer.parameters())
    outs = []
    for _ in range(3):
        with meter.forward():
            outs.append(torch.relu(layer(torch.randn(4, 16))))
    assert meter.live_groups == 3 and meter.live_bytes == 3 * 2 * 4 * 16 * 4   # input + relu output
    for out in outs:
        out.sum().backward()
    assert meter.live_groups == 0 and meter.live_bytes == 0 and meter.peak_groups == 3


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_a_one_stage_pipeline_equals_the_model(name):
    """p = 1 runs in this process: m micro-batches with the loss scaled by 1/m give the
    gradient of the whole batch."""
    cfg = GPTConfig(vocab=27, seq=8, hidden=16, heads=2, layers=2)
    model, pipe = TinyGPT(cfg, 0), split_layers(TinyGPT(cfg, 0), 1)
    x, y = torch.randint(0, 27, (8, 8)), torch.randint(0, 27, (8, 8))
    result = PipelineExecutor(S.make(name, 1, 4), 0, pipe, lm_loss, (2, 8, 16)).step(x, y)
    lm_loss(model(x), y).backward()
    for a, b in zip(pipe[0].parameters(), model.parameters()):
        torch.testing.assert_close(a.grad, b.grad)
    assert result.peak_stash == (4 if name == "gpipe" else 1) == result.peak_stash_measured


def test_executor_rejects_bad_input_before_running():
    stage = split_layers(mlp_stack(8, 2), 1)
    ex_ = PipelineExecutor(S.gpipe(1, 4), 0, stage, torch.nn.functional.mse_loss, (2, 8))
    with pytest.raises(ValueError, match="10 rows, which m=4 micro-batches cannot split evenly"):
        ex_.step(torch.ones(10, 8), torch.ones(10, 8))
    with pytest.raises(ValueError, match="needs inputs="):
        ex_.step(None, torch.ones(8, 8))
    with pytest.raises(ValueError, match="v=1 chunk"):
        PipelineExecutor(S.gpipe(1, 4), 0, stage * 2, torch.nn.functional.mse_loss, (2, 8))
    with pytest.raises(ValueError, match="stage must be in 0..0"):
        PipelineExecutor(S.gpipe(1, 4), 1, stage, torch.nn.functional.mse_loss, (2, 8))
    with pytest.raises(ScheduleError, match="deadlock"):
        PipelineExecutor(_deadlock(), 0, stage, torch.nn.functional.mse_loss, (2, 8))


# ---------------------------------------------------------------- exercises and plots
def test_exercise_checkers_accept_the_answer_and_explain_mistakes():
    assert ex.check_1f1b_order(" ".join(map(str, S.one_f_one_b_order(4, 6, 1))), 4, 6, 1)
    assert ex.check_1f1b_order(" ".join(map(str, S.one_f_one_b_order(3, 5, 0))), 3, 5, 0)
    verdict = ex.check_1f1b_order("F0 F1 F2 F3 F4 F5 B0 B1 B2 B3 B4 B5", 4, 6, 1)
    assert not verdict and verdict.ok is False and "deadlocks" in str(verdict)
    verdict = ex.check_1f1b_order("F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5", 4, 6, 1)
    assert not verdict and "instead of 1F1B's" in str(verdict)
    assert ex.check_1f1b_order(None).ok is None
    assert ex.check_min_microbatches(63, p=8, target=0.1)
    verdict = ex.check_min_microbatches(70, p=8, target=0.1)
    assert verdict.ok is False and "Megatron's (p-1)/m" in str(verdict)


def test_capped_bubble_checker_wants_the_largest_m_that_fits():
    # GPipe holds all m micro-batches on every stage: room for 4 means m = 4, 3/7 of the step
    assert ex.check_capped_bubble(3 / 7, p=4, capacity=4)
    assert ex.check_capped_bubble(0.4286, p=4, capacity=4)
    assert ex.check_capped_bubble(2 / 5, p=2, capacity=2) is not None
    assert ex.check_capped_bubble(1 / 3, p=2, capacity=2)
    for answer, words in ((0.75, "Megatron-LM's convention"), (42.9, "percentage"),
                          (3 / 19, "more micro-batches than fit"),
                          (0.75 + 1e-9, "Megatron-LM's convention"),
                          ("lots", "share of the step")):
        verdict = ex.check_capped_bubble(answer, p=4, capacity=4)
        assert verdict.ok is False and words in str(verdict), (answer, str(verdict))
    assert ex.check_capped_bubble(None).ok is None


def test_interleaved_microbatches_checker():
    # (p-1)/(v m + p-1) = (p-1)/(16 + p-1) at v = 2 needs m = 8, a multiple of p = 4
    assert ex.check_interleaved_microbatches(8, p=4, v=2, m_plain=16)
    assert ex.check_interleaved_microbatches(4, p=2, v=2, m_plain=8)
    for answer, words in ((16, "fewer micro-batches"), (6, "multiple of p=4"),
                          (12, "a smaller multiple"), (4, "more than plain"),
                          (2.5, "whole number")):
        verdict = ex.check_interleaved_microbatches(answer, p=4, v=2, m_plain=16)
        assert verdict.ok is False and words in str(verdict), (answer, str(verdict))
    assert ex.check_interleaved_microbatches(None).ok is None


def test_plots_draw_theory_and_measured_points():
    from lessonlib.viz import pipeline as vp

    vp.gantt_schedule("interleaved", 2, 4, 2)
    row = ScheduleRow("lessonlib", "1f1b", p=2, m=4, v=1, step_time_s=0.1,
                      bubble_per_stage=[0.22, 0.22], bubble_mean=0.22, bubble_theory_wall=0.2,
                      bubble_theory_ideal=0.25, peak_stash_per_stage=[2, 1],
                      peak_stash_theory=[2, 1], peak_stash_bytes_per_stage=[0, 0])
    fig = vp.explore(2, 4, 2, measured=[row])
    assert len(fig.axes) == 2
    box = vp.widget(measured=[row])
    box.children[0].children[1].value = 3          # moving a slider redraws
    assert len(box.children[1].outputs) == 1
    assert vp.predicted_stash("1f1b", 4, 8) == [4, 3, 2, 1]
    assert vp.predicted_stash("interleaved", 4, 8, 2) == [5.5, 4.5, 3.5, 2.5]


def test_gantt_panels_on_a_shared_time_axis_all_end_at_the_longest_chart():
    """Drawn one by one on a shared x axis, GPipe's and 1F1B's 33 time units (p = 4, m = 8)
    are not cut at the interleaved chart's 28.5, the last one drawn."""
    import matplotlib.pyplot as plt

    from lessonlib.viz import pipeline as vp

    fig, axes = plt.subplots(3, 1, sharex=True)
    for ax, (name, v) in zip(axes, (("gpipe", 1), ("1f1b", 1), ("interleaved", 2))):
        vp.gantt_schedule(name, 4, 8, v, ax=ax)
    assert [ax.get_xlim() for ax in axes] == [pytest.approx((0, 33 * 1.01))] * 3
    alone = vp.gantt_schedule("interleaved", 4, 8, 2)
    assert alone.get_xlim() == pytest.approx((0, 28.5 * 1.01))
    plt.close("all")
