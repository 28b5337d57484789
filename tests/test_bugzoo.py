"""The bug zoo: every switch is off by default, an unknown name fails before anything starts,
each bug's check passes with the bug off and fails with it on, and the existing test the
registry names fails with the switch on (it passes without: that is the normal suite).

Each check is one 2-rank launch; each existing test runs in a pytest session of its own
inside this process (its ranks come from the same warm fork server), the narrowest
parametrized case, with ``LESSONLIB_BUGS`` set in the environment the ranks inherit."""
import os
import sys
from pathlib import Path

import pytest

from lessonlib import bug_checks, bug_switches

ROOT = Path(__file__).resolve().parent.parent
NAMES = list(bug_switches.BUGS)


def test_every_switch_is_off_by_default(monkeypatch):
    monkeypatch.delenv(bug_switches.ENV, raising=False)
    assert not any(bug_switches.active(n) for n in NAMES)
    with bug_switches.enabled("pipeline_loss_unscaled"):
        assert bug_switches.active("pipeline_loss_unscaled")
        assert not bug_switches.active("p2p_dropped_request")
        with bug_switches.enabled("p2p_dropped_request"):
            assert os.environ[bug_switches.ENV] == "pipeline_loss_unscaled,p2p_dropped_request"
        assert os.environ[bug_switches.ENV] == "pipeline_loss_unscaled"
    assert bug_switches.ENV not in os.environ


def test_an_unknown_name_fails_before_any_process_starts(monkeypatch):
    import lessonlib.launcher

    def no_launch(*args, **kwargs):
        raise AssertionError("a process was started")

    monkeypatch.setattr(lessonlib.launcher, "launch", no_launch)
    for call in (lambda: bug_switches.active("tp_bug"),
                 lambda: bug_switches.enabled("tp_bug").__enter__(),
                 lambda: bug_checks.check("tp_bug", True),
                 lambda: bug_switches.hook_line("tp_bug")):
        with pytest.raises(ValueError, match=r"unknown bug name\(s\) \['tp_bug'\].*"
                                             r"tp_missing_backward_all_reduce, .*tp_layer_left"):
            call()
    monkeypatch.setenv(bug_switches.ENV, "pipeline_loss_unscaled,typo")
    with pytest.raises(ValueError, match=r"\['typo'\] \(in LESSONLIB_BUGS"):
        bug_switches.active("pipeline_loss_unscaled")


def test_each_switch_is_one_line_in_the_module_the_registry_names():
    for name, bug in bug_switches.BUGS.items():
        where, line = bug_switches.hook_line(name)
        module = bug.where.split(".")[1]
        assert f"/{module}.py:" in where or where.startswith(f"lessonlib/{module}"), where
        assert line.count(f'bug_switches.active("{name}")') == 1, line
        assert bug.test.startswith("tests/") and "::" in bug.test and bug.test.endswith("]")


@pytest.mark.timeout(150)
@pytest.mark.parametrize("name", NAMES)
def test_the_check_passes_with_the_bug_off_and_fails_with_it_on(name, monkeypatch):
    monkeypatch.delenv(bug_switches.ENV, raising=False)
    off, on = bug_checks.check(name, bug_on=False), bug_checks.check(name, bug_on=True)
    assert off.passed and off.max_diff <= off.tolerance, off
    assert off.message.startswith("passed: ")
    assert not on.passed and not on.max_diff <= on.tolerance, on
    assert on.message.startswith("FAILED: ") and "did not finish" not in on.message, on
    assert bug_switches.ENV not in os.environ                    # the caller's switch is restored
    expected = {  # the words that say why, in the failing check's message
        "tp_missing_backward_all_reduce": "a check of the forward pass sees nothing",
        "ddp_sync_on_wrong_microbatch": "all-reduces per micro-batch: [1, 0]",
        "p2p_dropped_request": "gradients off by",
        "pipeline_loss_unscaled": "their norm is 4 times the one-process norm (m = 4",
        "tp_layer_left_unsharded": "1 all-reduce(s) per forward, expected 2",
        "ep_expert_grads_wrong_group": "the other rank's gradients too",
        "sp_layernorm_grad_not_summed": "ln",
        "cp_allgather_grads_not_reduced": "dk, dv off by up to",
        "ulysses_head_groups_swapped": "output, dq, dk, dv off by up to",
        "moe_bias_in_combine_weights": "the bias is in the combine weights",
        "moe_bias_update_sign_flipped": "busiest / mean load went from",
        "ep_bias_load_not_all_reduced": "each replica moved its bias by its own batch's load",
        "hang_skipped_collective": "skipped: all_reduce #3 on group 1 [0, 1, 2]; posted by "
                                   "[0, 1], missing [2]",
        "hang_reordered_collectives": "out_of_order: all_reduce #3 on group 0 [0, 1, 2]; posted "
                                      "by [0, 1], missing [2]. The ranks disagree on the order",
        "hang_mismatched_size": "size_mismatch: all_reduce #3 on group 1 [0, 1, 2]; posted by "
                                "[0, 1, 2], missing []. The members posted different sizes "
                                "(rank 0: [4], rank 1: [4], rank 2: [3])",
    }[name]
    assert expected in on.message, on.message
    assert (on.finding is not None) == name.startswith("hang_") and off.finding is None


class _Outcomes:
    """Each test's outcome in a pytest session: "failed" if any phase failed, else "passed"."""

    def __init__(self):
        self.by_node = {}

    def pytest_runtest_logreport(self, report):
        if report.failed:
            self.by_node[report.nodeid] = "failed"
        elif report.when == "call":
            self.by_node.setdefault(report.nodeid, report.outcome)


def _pytest(name, *nodes, monkeypatch) -> tuple[int, dict]:
    """Run the named tests with bug ``name`` switched on: (pytest's exit code, outcomes).
    Their modules are imported afresh (results cached by an earlier run of the same module
    in this process, with the bug off, must not answer for the bug on)."""
    monkeypatch.setenv(bug_switches.ENV, name)
    monkeypatch.chdir(ROOT)
    for module in {Path(node.split("::")[0]).stem for node in nodes}:
        if module in sys.modules:
            monkeypatch.delitem(sys.modules, module)   # put back when the test ends
    outcomes = _Outcomes()
    code = pytest.main(["-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-p", "no:timeout",
                        *nodes], plugins=[outcomes])
    return int(code), outcomes.by_node


@pytest.mark.timeout(170)
@pytest.mark.parametrize("name", [n for n in NAMES if n != "tp_layer_left_unsharded"])
def test_the_named_existing_test_fails_with_the_switch_on(name, monkeypatch):
    node = bug_switches.BUGS[name].test
    code, outcomes = _pytest(name, node, monkeypatch=monkeypatch)
    assert code == 1 and outcomes == {node: "failed"}, outcomes


@pytest.mark.timeout(170)
def test_a_layer_left_unsharded_passes_parity_and_fails_the_memory_check(monkeypatch):
    parity = "tests/test_tensor_parallel.py::test_on_two_ranks_parity_with_the_dense_model[block]"
    memory = bug_switches.BUGS["tp_layer_left_unsharded"].test
    code, outcomes = _pytest("tp_layer_left_unsharded", parity, memory, monkeypatch=monkeypatch)
    assert code == 1 and outcomes == {parity: "passed", memory: "failed"}, outcomes
