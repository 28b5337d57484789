"""Beyond three axes: the five-axis grid (pure, and against PyTorch's DeviceMesh), and 8-rank
layouts equal to one process in float64 after 3 steps with no NCCL hazard in their traces:
t2c2p1d2 with SP and FSDP over the d*c ranks (Llama 3's axes but PP); t2p2d2 with ZeRO-1;
the MoE tiny GPT on p2d4 with e = 2 (each expert's two copies averaged over their edp
group); one launch each (notebook 15 runs three more the same way). And the lab on the new
axes."""
import json

import labrun
import pytest

import lessonlib
from lessonlib import hybrid
from lessonlib.grid import demo_axes
from lessonlib.grid_layout import axis_groups, check_grid, layout_table, placements
from lessonlib.instruments.nccl_rules import nccl_hazards
from lessonlib.models import corpus_config

TOL = 1e-12   # float64: summation order only


def test_the_one_order_puts_tp_then_cp_then_pp_inside_and_dp_outermost():
    groups = axis_groups(2, 2, 2, cp=2)                                    # 16 ranks
    assert groups["tp"][:2] == [[0, 1], [2, 3]]
    assert groups["cp"][:2] == [[0, 2], [1, 3]]
    assert groups["pp"][:2] == [[0, 4], [1, 5]]
    assert groups["dp"][0] == [0, 8]
    assert groups["dp_cp"][0] == [0, 2, 8, 10]
    for pl in placements(2, 2, 2, cp=2):                              # ((i p + j) c + l) t + k
        assert pl.rank == ((pl.dp * 2 + pl.pp) * 2 + pl.cp) * 2 + pl.tp


def test_at_c_e_1_the_grid_is_lesson_05s():
    assert axis_groups(2, 2, 2) == {"tp": [[0, 1], [2, 3], [4, 5], [6, 7]],
                                    "pp": [[0, 2], [1, 3], [4, 6], [5, 7]],
                                    "dp": [[0, 4], [1, 5], [2, 6], [3, 7]]}   # no extra group


def test_expert_groups_are_carved_from_the_dp_ranks():
    groups = axis_groups(4, 1, 2, ep=2)                                # dp groups [0,2,4,6], [1,3,5,7]
    assert groups["ep"] == [[0, 2], [4, 6], [1, 3], [5, 7]]
    assert groups["edp"] == [[0, 4], [2, 6], [1, 5], [3, 7]]
    for axis in ("ep", "edp"):
        assert sorted(r for g in groups[axis] for r in g) == list(range(8))


def test_layout_table_draws_the_new_axes():
    lines = layout_table(1, 2, 2, cp=2).splitlines()
    assert "rank order tp-cp-pp-dp" in lines[0] and "cp group" in lines[1]
    assert lines[2 + 3].split()[:5] == ["3", "0", "0", "1", "1"]            # rank 3: cp 1, tp 1
    assert "ep group" in layout_table(2, 1, 1, ep=2).splitlines()[1]


@pytest.mark.parametrize("call, match", [
    (lambda: check_grid(8, 2, 2, 2, cp=2), r"dp\*pp\*cp\*tp = 2\*2\*2\*2 = 16 ranks.*world_size=8"),
    (lambda: check_grid(6, 3, 1, 2, ep=2), r"ep=2 must divide dp=3.*use ep in \[1, 3\]"),
    (lambda: hybrid.run(tp=2, cp=3, pp=1), r"s=16 tokens do not split into 6"),
    (lambda: hybrid.run(dp=2, shard_on="zero3"), r"shard='zero3'.*'fsdp'"),
    (lambda: hybrid.run(dp=2, ep=2), r"ep=2 needs experts"),
    (lambda: hybrid.run(dp=2, cp=2, ep=2, moe=True), r"ep=2 with cp=2"),
    (lambda: hybrid.run(tp=4, cp=2, sp=True, cfg=corpus_config(seq=20, hidden=32, heads=4,
                                                                     layers=4)),
     r"s/c = 20/2 tokens divisible by tp=4"),
    (lambda: hybrid.run(tp=2, dp=2, ep=2, moe=True, sp=True), r"sp=True with moe=True"),
])
def test_bad_settings_fail_in_one_line_before_any_process(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# Three more layouts (t2c2p2d1 with SP, t2p2d2 with FSDP on d, the MoE tiny GPT on t2p2d2
# with e = 2 inside d) run under nbval in notebook 15's section 2, to the same tolerance and
# with the same NCCL check; the three here cover what those send as well.
LAYOUTS = {
    "t2c2p1d2 sp fsdp": dict(tp=2, cp=2, pp=1, dp=2, sp=True, shard_on="fsdp"),  # Llama 3's axes
    "t2p2d2 zero1": dict(tp=2, pp=2, dp=2, shard_on="zero1"),
    "moe p2d4e2": dict(pp=2, dp=4, ep=2, moe=True),            # two copies of each expert
}
# what each layout's new axes must have sent: ring attention's sends inside the cp group and
# FSDP's all-gathers over the d*c ranks, ZeRO-1's reduce-scatter, the all-to-all's sends
# inside the ep group and the experts' all-reduce over their edp group
SENT = {"t2c2p1d2 sp fsdp": [lambda e, r: e.op == "send" and e.ranks == r.cp_ranks,
                             lambda e, r: e.op == "all_gather" and len(e.ranks) == 4],
        "t2p2d2 zero1": [lambda e, r: e.op == "reduce_scatter"],
        "moe p2d4e2": [lambda e, r: e.op == "send" and e.ranks == r.ep_ranks,
                       lambda e, r: e.op == "all_reduce" and e.ranks == r.edp_ranks
                       and len(e.ranks) == 2]}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_eight_ranks_on_the_new_axes_equal_one_process(name, no_children_left):
    per_rank = hybrid.run(**LAYOUTS[name], dtype="float64", timeout=100)
    summary = hybrid.compare_parity(per_rank)
    assert len(per_rank) == 8
    assert summary.max_loss_diff < TOL, summary
    assert summary.max_grad_diff < TOL and summary.max_weight_diff < TOL, summary
    for sent in SENT[name]:
        assert all(any(sent(e, r) for e in r.events) for r in per_rank), name
    assert nccl_hazards([r.events for r in per_rank]) == []


# ---------------------------------------------------------------- the lab takes the new axes
@pytest.mark.timeout(120)
def test_the_lab_runs_a_layout_on_the_new_axes(tmp_path):
    out = tmp_path / "hybrid.json"
    done = labrun.run("hybrid", "--world-size", "8", "--cp", "2", "--shard", "zero1", "--sp",
                      "--layouts", "t2p2d1", "--steps", "1", "--warmup", "0", "--hidden", "32",
                      "--heads", "4", "--seq", "16", "--global-batch", "8", "--json", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    (row,) = json.loads(out.read_text())["rows"]
    assert (row["t"], row["c"], row["p"], row["d"], row["e"], row["shard"], row["sp"]) == (
        2, 2, 2, 1, 1, "zero1", True)
    assert row["max_weight_diff_vs_one_process"] < TOL and row["tokens_per_s"] > 0


@pytest.mark.parametrize("args, message", [
    (["--cp", "3", "--layouts", "t2p2d1"], "--cp 3 must divide --world-size 8"),
    (["--ep", "2", "--layouts", "t2p2d1"], "ep=2 must divide dp=1"),
    (["--ep", "2", "--shard", "zero1", "--layouts", "t2p2d2"], "--shard zero1 with --ep 2"),
    (["--shard", "zero3"], "invalid choice: 'zero3'"),
    (["--sp", "--ep", "2", "--layouts", "t2p2d2"], "--sp with --ep 2"),
])
def test_the_lab_refuses_bad_new_axes_in_one_line(args, message):
    done = labrun.run("hybrid", "--world-size", "8", *args)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr


@pytest.mark.timeout(120)
def test_the_five_axis_context_agrees_with_torch_device_mesh(no_children_left):
    def both():
        return demo_axes(1, 2, 2, cp=2), demo_axes(2, 2, 2, ep=2)

    results = lessonlib.launch(both, 8, timeout=100)
    assert all(a["agrees_with_torch"] and b["agrees_with_torch"] for a, b in results)
    cp_run, ep_run = results[5]                       # rank 5: pp 1, cp 0, tp 1 / dp 1, pp 0, tp 1
    assert cp_run["ours"]["coords"] == (0, 1, 0, 1) and cp_run["dp_cp_ranks"] == (5, 7)
    assert ep_run["ep_ranks"] == (1, 5) and ep_run["edp_ranks"] == (5,)
