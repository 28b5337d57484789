"""Today's shapes (Llama 3, DeepSeek-V3) and the five-axis estimate, planner and checker."""
import time
from dataclasses import replace

import pytest

from lessonlib.costmodel import CLUSTERS, MODELS, Layout, estimate
from lessonlib.costmodel.__main__ import main
from lessonlib.costmodel.model import PUBLISHED_PARAMS
from lessonlib.costmodel.search import explain_axes, plan_job


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_preset_params_within_one_percent_of_published(name):
    assert MODELS[name].params() == pytest.approx(PUBLISHED_PARAMS[name], rel=0.01)


def test_a_tied_shape_with_rotary_positions_keeps_no_position_table():
    """Llama 3.2 ties its output layer to the embedding but rotates positions: no s x h table
    in its parameters or on its first stage, at any sequence length; GPT-2's tied shape
    keeps one; Megatron-LM 2021's layer cannot drop it (Eq. 2 counts it)."""
    from lessonlib.costmodel.memory import stage_params
    small = MODELS["llama3.2-1B"]
    assert small.tied_embeddings and not small.keeps_position_table
    assert small.params() == 16 * small.layer_params() + small.V * small.h
    longer = replace(small, s=131072)
    assert longer.params() == small.params()
    assert stage_params(longer, 1, 1) == stage_params(small, 1, 1)
    gpt2 = MODELS["gpt2-small"]
    assert gpt2.keeps_position_table and stage_params(replace(gpt2, s=2048), 1, 1) \
        - stage_params(gpt2, 1, 1) == 1024 * gpt2.h
    with pytest.raises(ValueError, match="position_table=False needs today's layer: set ffn"):
        replace(gpt2, position_table=False)


def test_deepseek_active_params_and_dense_presets_are_all_active():
    assert MODELS["deepseek-v3"].active_params() == pytest.approx(37e9, rel=0.03)
    assert MODELS["llama3-8B"].active_params() == MODELS["llama3-8B"].params()


def test_c_and_e_of_one_are_the_old_layout():
    m, cl = MODELS["gpt3-175B"], CLUSTERS["dgx-a100"]
    kw = dict(t=8, p=12, d=4, global_batch=1536, zero_stage=1)
    assert estimate(m, Layout(**kw), cl).as_dict() == estimate(m, Layout(c=1, e=1, **kw),
                                                                cl).as_dict()


def test_context_parallelism_divides_activations_and_adds_the_ring():
    m = replace(MODELS["llama3-405B"], s=131072)
    cl = CLUSTERS["dgx-h100"]
    one = estimate(m, Layout(t=8, p=16, d=2, global_batch=32, recompute="selective",
                             sequence_parallel=True), cl)
    cp = estimate(m, Layout(t=8, c=16, p=16, d=2, global_batch=32, recompute="selective",
                            sequence_parallel=True), cl)
    assert cp.memory.activations == pytest.approx(one.memory.activations / 16)
    assert "cp_comm" in cp.time and "cp_comm" not in one.time
    assert cp.layout.n_gpus == 16 * one.layout.n_gpus


def test_expert_parallelism_splits_experts_and_pays_all_to_alls():
    m, cl = MODELS["deepseek-v3"], CLUSTERS["hgx-h800"]
    kw = dict(p=16, d=128, global_batch=15360, zero_stage=1, recompute="full")
    e8, e64 = (estimate(m, Layout(e=e, **kw), cl) for e in (8, 64))
    assert e64.memory.model_state < e8.memory.model_state
    assert e64.time["ep_comm"] > e8.time["ep_comm"] > 0     # 8 inside a server, 64 across
    hidden = estimate(m, Layout(e=64, overlap_comm=True, **kw), cl)
    assert hidden.time["ep_comm"] < e64.time["ep_comm"]


def test_fsdp_and_hsdp_memory_and_traffic():
    m, cl = MODELS["llama3-70B"], CLUSTERS["dgx-h100"]
    kw = dict(t=8, p=1, d=64, global_batch=512, recompute="full", sequence_parallel=True)
    z1, z3 = (estimate(m, Layout(zero_stage=z, **kw), cl) for z in (1, 3))
    hsdp = estimate(m, Layout(zero_stage=3, shard_group=8, **kw), cl)
    assert z3.memory.weights == pytest.approx(z1.memory.weights / 64)
    assert hsdp.memory.weights == pytest.approx(z1.memory.weights / 8)
    overlapped = estimate(m, Layout(zero_stage=3, overlap_comm=True, **kw), cl)
    assert overlapped.time["dp_comm"] < z3.time["dp_comm"]


@pytest.mark.parametrize("bad, word", [(dict(d=4, e=3), "e=3"),
                                       (dict(d=4, shard_group=3, zero_stage=3), "shard_group")])
def test_bad_axes_fail_with_one_line(bad, word):
    with pytest.raises(ValueError, match=word):
        Layout(global_batch=64, **bad)


def test_expert_parallelism_needs_an_moe_model():
    with pytest.raises(ValueError, match="MoE"):
        estimate(MODELS["llama3-8B"], Layout(d=2, e=2, global_batch=8), CLUSTERS["dgx-h100"])


def test_planner_on_the_405B_job_is_fast_and_splits_the_sequence_at_128K():
    t0 = time.perf_counter()
    short = plan_job(MODELS["llama3-405B"], CLUSTERS["dgx-h100"], 16384, 2048, seq=8192)
    long = plan_job(MODELS["llama3-405B"], CLUSTERS["dgx-h100"], 16384, 128, seq=131072)
    # about 2-4 s each alone here (v up to 8, no recompute); the bound catches a search grown
    # tenfold, with room for a loaded CI run of two workers
    assert time.perf_counter() - t0 < 20
    for p in (short, long):
        assert p.best.fits and p.best.memory.total < 80e9
        text = explain_axes(p)
        for axis in ("t=", "c=", "p=", "d="):
            assert f"\n{axis}" in text
    assert long.best.layout.c > short.best.layout.c


def test_cli_takes_c_and_e(capsys):
    main(["--model", "deepseek-v3", "--p", "16", "--e", "64", "--gpus", "2048",
          "--global-batch", "15360", "--cluster", "hgx-h800", "--zero", "1"])
    assert "e=64" in capsys.readouterr().out
    main(["--model", "llama3-405B", "--seq", "131072", "--t", "8", "--c", "16", "--p", "16",
          "--gpus", "16384", "--global-batch", "128", "--cluster", "dgx-h100"])
    assert "c=16" in capsys.readouterr().out


def test_cli_rejects_a_bad_shard_group_in_one_line(capsys):
    assert main(["--model", "llama3-8B", "--t", "8", "--gpus", "64", "--global-batch", "64",
                 "--zero", "3", "--shard-group", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "shard_group=3" in err[0]


def test_the_long_context_checker_takes_llamas_layout_and_names_the_bubble():
    from lessonlib.exercises import frontier
    text = frontier.check_long_context_layout(8, 16, 16, 8)          # Llama 3's, text's GPUs
    table = frontier.check_long_context_layout(8, 16, 16, 4)         # Table 4's own degrees
    assert text and "16,384" in str(text) and table and "8,192" in str(table)
    no_cp = frontier.check_long_context_layout(8, 1, 16, 128)
    assert not no_cp and "bubble" in str(no_cp)
    assert "inside NVLink" in str(frontier.check_long_context_layout(16, 16, 8, 8))
    assert "16384" in str(frontier.check_long_context_layout(8, 16, 16, 2))


CLI_MESSAGES = {  # flags, what the one line says (each number beside its name)
    "d against gpus": (["--model", "gpt2-small", "--gpus", "16", "--d", "8"],
                       "t*c*p*d = 1*1*1*8 = 8 does not match gpus=16; use d=16"),
    "gpus against t*c*p": (["--model", "gpt2-small", "--gpus", "9", "--t", "2", "--c", "2"],
                           "gpus=9 is not divisible by t*c*p = 2*2*1 = 4"),
    "e not dividing E": (["--model", "deepseek-v3", "--gpus", "24", "--e", "3"],
                         "e=3 must divide the experts of model='deepseek-v3' (E=256); use one "
                         "of [1, 2, 4, 8]"),
    "e on a dense model": (["--model", "gpt2-small", "--gpus", "8", "--e", "2"],
                           "e=2 needs an MoE model (model='gpt2-small' is dense"),
}


@pytest.mark.parametrize("case", list(CLI_MESSAGES))
def test_cli_layout_messages_name_each_number_and_what_would_work(capsys, case):
    flags, words = CLI_MESSAGES[case]
    assert main([*flags, "--gpu", "H100", "--global-batch", "24"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert words in line, line
