"""Expert parallelism equals the one-process MoE layer, in float64, on CPU ranks.

One 4-rank launch checks every case of ``layer_runs.CASES`` (e = 1, 2, 4; E/e = 1 and 2; k = 1
and 2; a capacity factor of 1.0 that drops tokens; a shared expert) and of
``layer_runs.ROUTING_CASES`` (balance aux, bias or none; softmax or sigmoid gates; dropless; the
node limit: every pair of option values at each e, 18 of the 24 combinations in all): this
rank's output, auxiliary loss, drops, tokens per expert, input gradient and every weight's
gradient after one step, every weight (and the balancing bias) after 3 SGD steps; the bytes
each rank's all-to-alls sent and received equal the routing counts' formula; the recorded
trace passes ``nccl_hazards``. A 2-rank launch (one group of e = 2, ``layer_runs.TWO_RANK_CASES``)
is checked the same way: the smallest parity test that sees the expert gradients summed
over the wrong group or the bias moved by one rank's load (the bug zoo names it). Another,
with that bug's switch on, shows the wrong-group gradients caught by the same comparison."""
import ast
from pathlib import Path

import pytest

from lessonlib import bug_switches, comm
from lessonlib.expert_parallel import check_split, layer_runs
from lessonlib.instruments.nccl_rules import nccl_hazards

TIGHT = 1e-12       # float64: every comparison is rounding away from exact


ALL_CASES = layer_runs.CASES + layer_runs.ROUTING_CASES
LAUNCHES = {4: ("reports", ALL_CASES), 2: ("two_rank_reports", layer_runs.TWO_RANK_CASES)}


@pytest.fixture(scope="module")
def reports():
    return layer_runs.run_parity(4, cases=ALL_CASES, timeout=240)


@pytest.fixture(scope="module")
def two_rank_reports():
    return layer_runs.run_parity(2, cases=layer_runs.TWO_RANK_CASES, timeout=60)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world_size", [2, 4])
def test_expert_parallel_equals_one_process(world_size, request):
    fixture, cases = LAUNCHES[world_size]
    reports = request.getfixturevalue(fixture)
    assert len(reports) == world_size
    for i, (E, e, k, C, shared, *routing) in enumerate(cases):
        routing = routing[0] if routing else {}
        ranks = [r[i] for r in reports]
        for r in ranks:
            for what in ("output", "input_grad", "grads", "weights_after_steps", "aux_loss",
                         "bias_after_steps"):
                got = getattr(r, what)
                assert got < TIGHT, (E, e, k, C, routing, r.rank, what, got)
            assert r.dropped[0] == r.dropped[1] and r.tokens_per_expert[0] == \
                r.tokens_per_expert[1], (E, e, k, C, routing)
            assert len(r.expert_ids) == E // e
        assert sorted(x for r in ranks[:e] for x in r.expert_ids) == list(range(E))
        dropped = sum(r.dropped[0] for r in ranks)
        assert dropped == 0 if C is None else dropped > 0, (E, e, k, C, routing, dropped)
        # the bias moved (by 0.05 a step), the same on every replica
        assert (min(r.bias_moved for r in ranks) > 0) == (routing.get("balance") == "bias")


def test_the_routing_cases_hold_every_pair_of_options_at_each_e():
    import itertools
    options = [("aux", "bias", "none"), ("softmax", "sigmoid"), (1.0, None), (None, 1)]

    def rows(e):
        return [(r["balance"], r["gate"], C, r["max_nodes"])
                for E, e_, k, C, _, r in layer_runs.ROUTING_CASES if e_ == e]
    for e in (1, 2, 4):
        assert len(rows(e)) == 6
        for i, j in itertools.combinations(range(4), 2):
            assert {(row[i], row[j]) for row in rows(e)} == \
                set(itertools.product(options[i], options[j])), (e, i, j)
    # no combination runs twice: 18 of the 24, DeepSeek-V3's at e = 4
    assert len({row for e in (1, 2, 4) for row in rows(e)}) == 18
    assert ("bias", "sigmoid", None, 1) in rows(4)


def test_all_to_all_bytes_equal_the_routing_counts_and_no_nccl_hazard(reports):
    for i, (E, e, *_rest) in enumerate(ALL_CASES):
        ranks = [r[i] for r in reports]
        for r in ranks:
            measured = layer_runs.sent_and_received(r.events, r.rank)
            expected = layer_runs.expected_bytes(r.stats, E, r.h)
            assert (measured.sent, measured.received) == \
                (expected.sent, expected.received), (E, e, r.rank)
            if e == 1:
                assert measured.sent_off_rank == 0
        # what all ranks send off-rank, all ranks receive
        moved = [layer_runs.sent_and_received(r.events, r.rank) for r in ranks]
        assert sum(m.sent_off_rank for m in moved) == sum(m.received_off_rank for m in moved)
        assert nccl_hazards([r.events for r in ranks]) == []


@pytest.mark.timeout(60)
def test_averaging_expert_gradients_over_the_wrong_group_is_caught():
    with bug_switches.enabled("ep_expert_grads_wrong_group"):
        ranks = layer_runs.run_parity(2, cases=[(4, 2, 2, 1.0, False)])
    r = [x[0] for x in ranks]
    assert max(x.output for x in r) < TIGHT             # the forward cannot see it
    assert min(x.grads for x in r) > 1e-3               # the expert gradients can


def test_bad_settings_get_one_line_before_any_process_starts(monkeypatch):
    import lessonlib.launcher

    monkeypatch.setattr(lessonlib.launcher, "launch", lambda *a, **k: pytest.fail("launched"))
    for case, words in (((6, 4, 1, 1.0, False), "n_experts=6 must be divisible by the expert-"),
                        ((4, 2, 5, 1.0, False), "top_k=5 must be a positive integer at most 4"),
                        ((4, 2, 1, 0.0, False), "capacity_factor=0.0 must be a finite positive"),
                        ((8, 8, 1, 1.0, False), "e=8 must divide the world size 4")):
        with pytest.raises(ValueError, match=words) as info:
            layer_runs.run_parity(4, cases=[case])
        assert "\n" not in str(info.value)
    assert check_split(8, 4) == 2


def test_bad_splits_and_counts_get_one_line_naming_the_argument(monkeypatch):
    import torch
    import torch.distributed as dist
    from lessonlib.expert_parallel import all_to_all_rows, exchange_counts

    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)   # a group of e = 2
    monkeypatch.setattr(comm, "all_to_all_single", lambda *a, **k: pytest.fail("sent"))
    x = torch.zeros(3, 4)
    for recv, send, words in (
            ([1, 2], [4, -1], "send=[4, -1] must be e=2 whole row counts >= 0, one per rank"),
            ([1.5, 1.5], [1, 2], "recv=[1.5, 1.5] must be e=2 whole row counts >= 0"),
            ([1, 2], [3], "send=[3] must be e=2 whole row counts"),
            ([1, 2], [1, 1], "send=[1, 1] sends 2 rows but x has 3")):
        with pytest.raises(ValueError) as info:
            all_to_all_rows(x, recv, send)
        assert str(info.value).startswith(words) and "\n" not in str(info.value)
    # a count's value is read once, with the exchanged counts: refused before any row moves
    monkeypatch.setattr(comm, "all_to_all_single", lambda out, x, **k: out.copy_(x))
    for counts, got in ((torch.tensor([1, 2, 3]), "shape (3,), int64"),
                        (torch.tensor([1.0, 2.0]), "shape (2,), float32"),
                        (torch.tensor([1, -2]), "shape (2,), int64")):
        with pytest.raises(ValueError) as info:
            exchange_counts(counts)
        assert str(info.value) == (
            f"tokens_per_expert must be a 1-D tensor of E whole counts >= 0, E a multiple of "
            f"the group's e=2 ranks (E/e experts each); got {got}")


def test_the_package_has_a_map():
    package = Path(layer_runs.__file__).parent
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text()))
    for path in package.glob("*.py"):
        if path.name != "__init__.py":
            assert f"``{path.stem}``" in doc, path.name


def test_nccl_hazards_sees_an_all_to_all_whose_splits_disagree(reports):
    import copy
    ranks = [copy.deepcopy(r[1].events) for r in reports]         # E=4, e=2
    recv = next(ev for ev in ranks[0] if ev.op == "recv" and ev.peer == 1 and ev.bytes)
    recv.bytes += 8                          # rank 0 expects one more element from rank 1
    hazards = nccl_hazards(ranks)
    assert hazards and "mismatch" in hazards[0], hazards


@pytest.mark.timeout(60)
def test_an_expert_parallel_moe_gpt_trains_like_one_process():
    """e = 2 inside d = 4 data-parallel ranks: attention, embeddings and routers averaged
    over 4, each expert over its 2 copies; 3 SGD steps on the corpus, float64; GShard's
    routing, then DeepSeek-V3's (dropless, sigmoid, the bias of both layers moved by one
    all-reduce of their loads, the node limit), in the same launch."""
    import lessonlib
    for rank in lessonlib.launch(layer_runs.gpt_parity_reports, 4, 2):
        for r in rank:
            assert max(r.loss) < TIGHT and r.grads < TIGHT, r
            assert r.weights_after_steps < TIGHT and r.bias_after_steps < TIGHT, r


@pytest.mark.timeout(120)
def test_an_expert_parallel_forward_reads_the_device_once():
    """The counts' exchange is the only value the host waits for (a GPU would stall the
    queue at every such read): no nonzero, bincount or repeat_interleave of unknown size;
    dropless routing too (its splits vary per step, exchanged the same way)."""
    import lessonlib
    import comm_workers

    for r in lessonlib.launch(comm_workers.host_reads_in_an_expert_parallel_forward, 2,
                              timeout=60):
        assert r["reads"] == ["tolist"] and r["dropless"] == ["tolist"], r
