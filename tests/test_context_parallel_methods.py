"""Three context-parallel attentions, one answer: ring, all-gather (Llama 3) and Ulysses
(DeepSpeed) on c = 1, 2, 3 and 4 ranks give one-process attention's output and gradients of
q, k and v (float64), in both layouts, causal or not, plain and with a document mask of
uneven documents (5, 11 and 8 tokens) together with grouped-query K and V (half the heads;
the ring takes none: its masked case has all heads); the tiny GPT on a (d, c) = (2, 2) grid trains equal to one process with each
method (Ulysses also at c = 4). The
bytes each rank sends to the others, by its ledger, equal ``costmodel.context``'s formula
for each method; the traces pass ``nccl_rules.nccl_hazards``; bad settings (heads or kv heads
that c does not divide, kv heads that do not divide the heads, doc_ids of the wrong shape or
dtype) fail in one line before anything is sent.

One 4-rank launch checks everything: ranks form groups of c consecutive ranks (at c = 3
the fourth rank is in none). A 2-rank launch checks each method's parity again where the
group of c = 2 is the whole world: the smallest test that sees gradients of K and V left
unreduced or head groups put back in the wrong order (the bug zoo names it)."""
import pytest

import lessonlib
from lessonlib.context_parallel import method_runs, ring_runs
from lessonlib.context_parallel.method_runs import ForwardBackward
from lessonlib.context_parallel.methods import METHODS
from lessonlib.costmodel.context import cp_bytes_sent_per_rank, document_work
from lessonlib.instruments.nccl_rules import nccl_hazards
from lessonlib.models import GPTConfig

CS = (1, 2, 3, 4)
CFG = GPTConfig(vocab=32, seq=16, hidden=16, heads=4, layers=2)
TOL = 1e-12                                        # float64
# each method on a (d, c) = (2, 2) grid; Ulysses also at c = 4, one of the 4 heads per rank
GPTS = [(m, 2) for m in METHODS] + [("ulysses", 4)]


def everything_worker():
    return {"attention": method_runs.method_reports(CS),
            "gpt": {(m, c): ring_runs.gpt_report(c, CFG, b=2, steps=3, method=m) for m, c in GPTS},
            "bad": method_runs.bad_input_report()}


@pytest.fixture(scope="module")
def ranks():
    return lessonlib.launch(everything_worker, 4, timeout=120)


@pytest.fixture(scope="module")
def two_ranks():
    return lessonlib.launch(method_runs.method_reports, 2, (2,), timeout=60)


def _members(ranks, c):
    return ranks[:c * (4 // c)]


def _cases(method):
    return method_runs.cases((method,))


def _assert_is_attention(reports, c, method):
    """Every case of ``method`` at c, in each rank's ``method_reports``: one-process attention."""
    for case in _cases(method):
        for attention in reports:
            report = attention[(c, *case)]
            errors = {"output": report.output, "gathered_output": report.gathered_output,
                      "dq": report.dq, "dk": report.dk, "dv": report.dv}
            for what, err in errors.items():
                assert err < TOL, f"rank {report.rank} c={c} {case}: {what} off by {err:.1e}"


@pytest.mark.timeout(150)
@pytest.mark.parametrize("method", METHODS)
def test_each_method_is_one_process_attention(ranks, method):
    for c in CS:
        _assert_is_attention([r["attention"] for r in _members(ranks, c)], c, method)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("method", METHODS)
def test_on_two_ranks_each_method_is_one_process_attention(two_ranks, method):
    _assert_is_attention(two_ranks, 2, method)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("method", METHODS)
def test_bytes_sent_equal_the_formula_and_no_nccl_hazard(ranks, method):
    for c in CS:
        for case in _cases(method):
            members = [r["attention"][(c, *case)] for r in _members(ranks, c)]
            for report in members:
                assert report.sent == report.predicted_sent, (c, case)
            assert nccl_hazards([m.events for m in members]) == [], (c, case)


@pytest.mark.timeout(150)
def test_the_bytes_by_hand_and_what_gqa_saves(ranks):
    # c = 4: b = 2, s = 24 (s/c = 6), 8 query heads, head_dim 4, float64 (8 bytes)
    q = 2 * 8 * 6 * 4 * 8                                   # a q shard: 3072 bytes
    for gqa, docs, kv in ((False, None, 2 * q), (True, method_runs.DOCS, q)):  # 8 or 4 heads
        sent = {m: ranks[0]["attention"][4, m, "zigzag", True, gqa, docs].sent
                for m in METHODS}
        assert sent["allgather"] == ForwardBackward(forward=3 * kv, backward=3 * kv)
        assert sent["ulysses"] == ForwardBackward(forward=3 * (2 * q + kv) // 4,
                                                  backward=3 * (2 * q + kv) // 4)
        # the ring repeats K and V to all 8 heads first: GQA saves it nothing
        assert sent["ring"] == ForwardBackward(forward=3 * 2 * q, backward=7 * 2 * q)
    assert ranks[0]["attention"][4, "ulysses", "zigzag", True, True,
                                 method_runs.DOCS].kv_heads == 4
    assert cp_bytes_sent_per_rank("ulysses", 1, 2, 24, 8, 4, 4, 8) == (0, 0)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("method, c", GPTS)
def test_gpt_equals_one_process_after_3_steps(ranks, method, c):
    for r in ranks:
        report = r["gpt"][method, c]
        assert report.d == 4 // c and report.method == method
        assert report.losses == pytest.approx(report.reference_losses, abs=1e-12)
        assert report.grads[0] < TOL, report.grads
        assert report.weights[0] < TOL, report.weights


@pytest.mark.timeout(150)
def test_bad_settings_one_line_before_anything_is_sent(ranks):
    bad = ranks[0]["bad"]
    assert bad["c"] == 4 and bad["messages_sent"] == 0
    for name, message in bad["messages"].items():
        assert message and "\n" not in message, name
    said = bad["messages"]
    assert said["heads not divisible by c"].startswith(
        "Ulysses splits the heads over the c=4 ranks: heads=9 is not divisible by c")
    assert said["kv heads not divisible by c (c > 2)"].startswith(
        "Ulysses splits the heads over the c=4 ranks: kv_heads=2 is not divisible by c")
    assert said["kv heads not dividing heads"].startswith("kv_heads=3 (k and v's heads) must "
                                                          "divide heads=8")
    assert "got shape (1, 15), int64" in said["doc_ids of the wrong shape"]
    assert "got shape (1, 16), float32" in said["doc_ids of the wrong dtype"]
    assert said["doc_ids not a tensor"].endswith("got list")
    assert "use one of ring, allgather, ulysses" in said["unknown method"]


def test_document_mask_work_ring_waits_for_its_busiest_rank_each_step():
    # the 24 tokens of 5, 11 and 8 in the zig-zag layout over c = 4 (chunks of 3)
    work = document_work(method_runs.DOCS, 4)
    assert sum(work.per_rank) == sum(n * (n + 1) // 2 for n in method_runs.DOCS)
    assert work.per_step[0] == [12, 0, 6, 9]               # rank 0's steps, by hand below
    assert (work.ring, work.allgather, work.even) == (54, 45, 29.25)
    # one document (causal only): the zig-zag split evens out every step of the ring too
    plain = document_work([24], 4)
    assert plain.ring == plain.allgather == plain.even == 24 * 25 / 2 / 4


def test_settings_are_checked_before_any_launch():
    with pytest.raises(ValueError, match="method='tree' is not a context-parallel attention"):
        method_runs.run_parity(2, methods=("tree",))
    with pytest.raises(ValueError, match="heads=4 is not divisible by c"):
        method_runs.check_method_runs(4, (3,), ("ulysses",), s=24, heads=4)
    with pytest.raises(ValueError, match="s=24 tokens do not split into 10 equal chunks"):
        method_runs.run_parity(5, cs=(5,))
