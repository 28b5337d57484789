"""Context parallelism is attention over the whole sequence: ring attention on c = 1, 2, 3
and 4 ranks, contiguous and zig-zag layouts, causal and not, gives one-process
``scaled_dot_product_attention``'s output and gradients of q, k and v (float64); the c-rank
tiny GPT, also with data parallelism (c = 2, d = 2) and in the contiguous layout, equals
one process after 3 SGD steps (losses, gradients, weights); under a causal mask the contiguous layout's last rank does
about 2c-1 times the first's work and the zig-zag layout is balanced; each rank saves about
1/c of one process's activations; the ledger's key/value bytes equal the formula; the traces
pass ``nccl_rules.nccl_hazards``; bad settings (q, k, v of different or integer dtypes among them)
fail in one line before anything is sent; ranks passing different layouts, masks or
documents are refused on every rank, on any call, by every method.

One 4-rank launch checks everything: ranks form groups of c consecutive ranks (at c = 3 the
fourth rank is in none, and is refused)."""
import pytest

import lessonlib
from lessonlib.context_parallel import ring_runs
from lessonlib.costmodel.context import causal_pairs_per_rank
from lessonlib.instruments.nccl_rules import nccl_hazards
from lessonlib.models import GPTConfig

CS = (1, 2, 3, 4)
LAYOUTS = ("contiguous", "zigzag")
SHAPE = dict(b=2, heads=2, s=24, head_dim=4)
CFG = GPTConfig(vocab=32, seq=16, hidden=16, heads=2, layers=2)
TOL = 1e-12                                        # float64


def everything_worker():
    return {"attention": ring_runs.attention_reports(CS, LAYOUTS, (True, False), **SHAPE),
            "gpt": {c: ring_runs.gpt_report(c, CFG, b=2, steps=3) for c in (2, 4)}
            | {"contiguous": ring_runs.gpt_report(4, CFG, b=2, steps=3, layout="contiguous")},
            "disagree": ring_runs.disagreement_report(),
            "balance": ring_runs.balance_report(s=64, repeats=1),
            "bad": ring_runs.bad_input_report()}


@pytest.fixture(scope="module")
def ranks():
    return lessonlib.launch(everything_worker, 4, timeout=120)


def _members(ranks, c):
    return [r["attention"][c, "zigzag", True] for r in ranks[:c * (4 // c)]]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("c", CS)
def test_ring_attention_is_sdpa(ranks, c, layout, causal):
    for r in ranks[:c * (4 // c)]:
        report = r["attention"][c, layout, causal]
        for what in ("output", "gathered_output", "dq", "dk", "dv"):
            error = getattr(report, what)
            assert error < TOL, f"rank {report.rank} c={c}: {what} off by {error:.1e}"


@pytest.mark.timeout(150)
def test_a_rank_outside_the_group_is_refused(ranks):
    refused = ranks[3]["attention"][3, "zigzag", True].refused
    assert refused == ("rank 3 is not in the given group of ranks [0, 1, 2]; "
                       "call it only on its members")


@pytest.mark.timeout(150)
@pytest.mark.parametrize("c", CS)
def test_ledger_bytes_equal_the_formula_and_no_nccl_hazard(ranks, c):
    block = 2 * SHAPE["b"] * SHAPE["heads"] * SHAPE["s"] // c * SHAPE["head_dim"] * 8
    forward, backward = (c - 1) * block, ((c - 1) + c) * block if c > 1 else 0
    for layout in LAYOUTS:
        members = [r["attention"][c, layout, True] for r in ranks[:c * (4 // c)]]
        for report in members:
            assert report.received == {"forward": forward, "backward": backward}
            assert report.received == report.predicted_received
            # the forward posts one batch per step but the last; the backward two
            assert report.batches == {"forward": c - 1, "backward": 2 * c - 1 if c > 1 else 0}
        # every member of every group, in global rank order (as the trace names them)
        assert nccl_hazards([m.events for m in members]) == []


@pytest.mark.timeout(150)
def test_activations_per_rank_are_one_cth(ranks):
    one = ranks[0]["attention"][1, "zigzag", True].saved_bytes
    for c in CS:
        for report in _members(ranks, c):
            assert report.saved_bytes * c == one          # q, k, v, out, lse: s/c tokens
    for c, reports in ((c, [r["gpt"][c] for r in ranks]) for c in (2, 4)):
        for report in reports:
            ratio = report.activation_bytes / report.one_process_activation_bytes
            assert ratio == pytest.approx(1 / c, rel=0.1)


@pytest.mark.timeout(150)
def test_causal_work_contiguous_unbalanced_zigzag_balanced(ranks):
    c, s = 4, 64
    for layout in LAYOUTS:
        work = [r["balance"][layout]["work"] for r in ranks]
        assert work == causal_pairs_per_rank(s, c, layout)      # scores of one (b, head)
    contiguous = [r["balance"]["contiguous"]["work"] for r in ranks]
    zigzag = [r["balance"]["zigzag"]["work"] for r in ranks]
    assert contiguous[-1] / contiguous[0] == pytest.approx(2 * c - 1, rel=0.15)
    assert max(zigzag) / min(zigzag) <= 1.15


@pytest.mark.timeout(150)
@pytest.mark.parametrize("c", (2, 4, "contiguous"))
def test_gpt_equals_one_process_after_3_steps(ranks, c):
    for r in ranks:
        report = r["gpt"][c]
        assert report.d == (4 // c if c != "contiguous" else 1)
        assert report.losses == pytest.approx(report.reference_losses, abs=1e-12)
        assert report.grads[0] < TOL, report.grads
        assert report.weights[0] < TOL, report.weights


@pytest.mark.timeout(150)
def test_bad_input_one_line_before_anything_is_sent(ranks):
    bad = ranks[0]["bad"]
    assert bad["messages_sent"] == 0
    for name, message in bad["messages"].items():
        assert message and "\n" not in message, name
    messages = bad["messages"]
    assert "do not split into 8 equal chunks" in messages["s not divisible by 2c (zigzag)"]
    assert "do not split into 4 equal chunks" in messages["s not divisible by c (contiguous)"]
    assert "the same b, s/c and head_dim as q" in bad["messages"]["shards of unequal length"]
    assert messages["k, v of another dtype"].startswith(
        "q, k, v must share one floating-point dtype; got q float32, k float64, v float64")
    assert "got q int64, k int64, v int64" in messages["integer tensors"]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("what", ["layout", "causal", "doc_ids"])
@pytest.mark.parametrize("method", ["ring", "allgather", "ulysses"])
def test_ranks_that_disagree_on_a_later_call_are_refused(ranks, method, what):
    """The ranks agreed on a first call; on a later one the odd ranks pass another setting:
    every rank is refused, naming the ranks and what each passed (not a hang, not a wrong
    answer)."""
    said = {"layout": ("ranks 0, 2: layout='zigzag' causal=True doc_ids=None; "
                       "ranks 1, 3: layout='contiguous' causal=True doc_ids=None"),
            "causal": ("ranks 0, 2: layout='zigzag' causal=True doc_ids=None; "
                       "ranks 1, 3: layout='zigzag' causal=False doc_ids=None"),
            "doc_ids": "ranks 0, 2: layout='zigzag' causal=True doc_ids=#"}[what]
    for r in ranks:
        message = r["disagree"][method, what]
        assert message is not None, f"rank {ranks.index(r)} ran {method} with {what} disagreeing"
        assert message.startswith(f"the ranks of the context-parallel group disagree ({said}")
        assert message.endswith("every rank must pass the same layout, causal and doc_ids")
        if what == "doc_ids":
            assert "; ranks 1, 3: layout='zigzag' causal=True doc_ids=#" in message


def test_settings_are_checked_before_any_launch():
    with pytest.raises(ValueError, match="s=24 tokens do not split into 5 equal chunks"):
        ring_runs.run_parity(5, cs=(5,))
    with pytest.raises(ValueError, match="c=3 must divide world_size=4"):
        ring_runs.run_gpt_parity(4, 3, GPTConfig(vocab=32, seq=24, hidden=16, heads=2, layers=1))


def test_the_package_maps_its_modules():
    import test_layout
    test_layout.test_each_strategy_is_a_package_with_a_map("context_parallel")
