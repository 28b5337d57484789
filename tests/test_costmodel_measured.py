"""Your own measured runs against the cost model (``costmodel/measured.py``): a CSV read into
the same runs the record holds, the error as ``--published`` computes it, each job's layouts
ranked, and one clear line for a cell that cannot be read."""
import json
import re
from dataclasses import replace

import pytest

from lessonlib.costmodel import CLUSTERS, MODELS, Layout, estimate
from lessonlib.costmodel.__main__ import main
from lessonlib.costmodel.measured import EXAMPLE_CSV as EXAMPLE
from lessonlib.costmodel.measured import HELD_OUT_CSV, HELD_OUT_H100_CSV
from lessonlib.costmodel.measured import judge, measured_report, read_runs
from lessonlib.costmodel.published import cluster_of, published_rows
from lessonlib.costmodel.record import published_runs

RECORD = {run.source: run for run in published_runs()}


def test_the_example_holds_the_records_runs_and_their_errors():
    """Every line of the shipped example is a torchtitan row of the record, setting for
    setting, and predicts to the same error as ``--published``."""
    runs = read_runs(EXAMPLE)
    assert len(runs) == 15
    for measured in runs:
        run, kept = measured.run, RECORD[measured.run.source]
        assert (run.model, run.cluster, run.layout, run.metric, run.published) == \
            (kept.model, kept.cluster, kept.layout, kept.metric, kept.published)
    errors = {r.run.source: r.error for r in published_rows([RECORD[m.run.source]
                                                              for m in runs])}
    assert {r.run.source: r.error for r in judge(runs).rows} == errors


def test_the_example_ranks_each_benchmarks_layouts():
    """torchtitan's own comparisons: compile and Float8 over eager, async TP over vanilla,
    interleaved over 1F1B, each in the measured order; on the 8B async-TP benchmark the
    model puts bf16 async TP above Float8 without it, where Float8 ran faster (its async-TP
    gain is larger than measured)."""
    jobs = {job.job: job for job in judge(read_runs(EXAMPLE)).jobs}
    assert len(jobs) == 5
    assert all(job.first_choice == 1.0 for job in jobs.values())
    eight = jobs["torchtitan async-TP benchmark: Llama 3 8B on 64 H100"]
    assert (eight.agree, eight.pairs) == (5, 6)
    assert all(job.tau == 1.0 for job in jobs.values() if job is not eight)


def test_the_held_out_sweep_reads_as_the_chronicle_prints_it():
    """BigScience's sweep: 16 runs of four shapes on 48 Jean Zay nodes (384 GPUs), TP 8,
    batch 2048; in every job a micro-batch of 4 ran fastest (what the chronicle concludes)."""
    runs = read_runs(HELD_OUT_CSV)
    assert len(runs) == 16 and {m.run.n_gpus for m in runs} == {384}
    assert {(m.run.layout.t, m.run.layout.global_batch) for m in runs} == {(8, 2048)}
    jobs = judge(runs).jobs
    assert len(jobs) == 4
    b = {m.run.source: m.run.layout.b for m in runs}
    assert all(b[j.fastest] == 4 for j in jobs)


# Megatron-Bridge's performance summary, DGX-H100 pre-training, Llama 3 rows as first
# printed: (GPUs, GBS, MBS, sequence, FSDP, TP, PP, CP, VP, tokens/s per GPU)
MEGATRON_BRIDGE_H100 = [(8, 128, 1, 8192, True, 1, 1, 1, None, 14079),
                        (64, 128, 1, 8192, False, 4, 8, 1, 5, 1619),
                        (1024, 512, 1, 8192, False, 8, 8, 2, 8, 302),
                        (64, 256, 1, 8192, False, 4, 8, 1, 5, 1621),
                        (1024, 1536, 1, 8192, False, 8, 8, 2, 8, 311)]


def test_the_held_out_h100_runs_read_as_the_summary_prints_them():
    """Megatron-Bridge's Llama 3 rows on DGX-H100: each line's GPUs, batch, micro-batch,
    sequence, FSDP (ZeRO-3, else the distributed optimizer), TP, PP, CP and VP as the table
    prints them, in FP8 without recompute; one job per line (releases are not ranked against
    each other)."""
    runs = read_runs(HELD_OUT_H100_CSV)
    read = [(m.run.n_gpus, m.run.layout.global_batch, m.run.layout.b, m.run.model.s,
             m.run.layout.zero_stage == 3, m.run.layout.t, m.run.layout.p, m.run.layout.c,
             m.run.layout.v if m.run.layout.p > 1 else None, m.run.published) for m in runs]
    assert read == MEGATRON_BRIDGE_H100
    # FP8 as the recipes run it on H100 (FP8_CS: Transformer Engine's current scaling)
    assert {(m.run.layout.precision, m.run.layout.fp8_scaling, m.run.layout.recompute,
             m.run.metric) for m in runs} == {("fp8", "te-current", "none", "tokens")}
    assert [m.run.layout.fsdp_impl for m in runs if m.run.layout.zero_stage == 3] == ["megatron"]
    assert len({m.job for m in runs}) == len(runs)


def _write(tmp_path, header, *lines):
    path = tmp_path / "runs.csv"
    path.write_text("\n".join([header, *lines]) + "\n")
    return path


def _layouts():
    """Four layouts of Llama 3 8B (4K tokens) on 16 H100s, and their predicted tokens/s."""
    model = replace(MODELS["llama3-8B"], s=4096)
    cells = [dict(t=1, p=1, d=16, zero_stage=3, recompute="none"),
             dict(t=2, p=1, d=8, zero_stage=1, recompute="selective", sequence_parallel=True),
             dict(t=1, p=2, d=8, zero_stage=1, recompute="full"),
             dict(t=8, p=2, d=1, zero_stage=0, recompute="full", sequence_parallel=True)]
    tokens = [estimate(model, Layout(b=1, global_batch=64, **c), CLUSTERS["dgx-h100"])
              .tokens_per_s / 16 for c in cells]
    return cells, tokens


@pytest.mark.parametrize("order", ["as predicted", "reversed"])
def test_a_job_is_ranked_pair_by_pair(tmp_path, order):
    """Measured as the model predicts: no error, every pair in order, its first choice the
    fastest. Measured in the reverse order: every pair out of order (tau -1), and its first
    choice ran at the slowest's share of the fastest."""
    cells, tokens = _layouts()
    ranked = sorted(tokens)       # reversed: the fastest predicted measured slowest, ...
    measured = tokens if order == "as predicted" else \
        [ranked[-1 - ranked.index(x)] for x in tokens]
    header = "name,model,seq,global_batch,t,p,d,zero_stage,recompute,sequence_parallel," \
             "tokens_per_s_per_gpu"
    lines = [f"layout {i},llama3-8B,4096,64,{c['t']},{c['p']},{c['d']},{c['zero_stage']},"
             f"{c['recompute']},{str(c.get('sequence_parallel', False)).lower()},{m!r}"
             for i, (c, m) in enumerate(zip(cells, measured))]
    result = judge(read_runs(_write(tmp_path, header, *lines)))
    (job,) = result.jobs
    assert job.pairs == 6 and job.job == "llama3-8B (s 4096) on 16 GPUs of dgx-h100"
    if order == "as predicted":
        assert all(abs(r.error) < 1e-12 for r in result.rows)
        assert (job.agree, job.tau, job.first_choice) == (6, 1.0, 1.0)
    else:
        assert (job.agree, job.tau) == (0, -1.0)
        assert job.first_choice == pytest.approx(min(tokens) / max(tokens))
    assert "Kendall's tau" in measured_report(read_runs(_write(tmp_path, header, *lines)))


def test_a_shape_and_a_cluster_by_their_columns(tmp_path):
    """BLOOM by its shape on Jean Zay by its GPU and ports (the record builds both in code)
    predicts what the record predicts; a measured peak memory gets its error."""
    bloom = RECORD["BLOOM-176B, 384 A100, iteration 85,376"]
    path = _write(tmp_path,
                  "name,layers,hidden,heads,seq,vocab,gpu,network_gbit,network_ports,t,p,d,b,"
                  "global_batch,zero_stage,recompute,grad_dtype,reduce_dtype,loss,zero_reduce,"
                  "step_s,peak_gib",
                  "BLOOM,70,14336,112,2048,250880,A100-80GB,100,4,4,12,8,2,2048,1,full,fp32,"
                  "fp32,megatron,all-reduce,104.70,60")
    (run,) = read_runs(path)
    assert run.run.layout == bloom.layout
    result = judge([run])
    expected = estimate(bloom.model, bloom.layout, cluster_of(bloom)).step_time_s
    assert result.rows[0].predicted == pytest.approx(expected, rel=1e-12)
    gib, peak, error, fits = result.memory[0]
    assert peak == 60 and error == pytest.approx(gib / 60 - 1) and fits


@pytest.mark.parametrize("header, line, says", [
    ("model,t,d,global_batch,tokens_per_s_per_gpu,speed", "llama3-8B,1,8,8,1000,9",
     "line 2: unknown column 'speed'; the columns are"),
    ("model,t,d,global_batch,recompute,tokens_per_s_per_gpu", "llama3-8B,3,8,8,none,1000",
     "line 2: t=3"),
    ("model,d,global_batch,mfu", "llama3-8B,8,8,45", "line 2: mfu='45' must be a fraction of "
     "peak (0.45 for a percentage)"),
    ("model,d,global_batch,mfu,step_s", "llama3-8B,8,8,0.4,2",
     "line 2: give exactly one measured figure"),
    ("model,d,global_batch", "llama3-8B,8,8", "line 2: give exactly one measured figure"),
    ("model,d,gpus,global_batch,recompute,step_s", "llama3-8B,8,16,8,none,2",
     "line 2: gpus='16' does not match t*c*p*d = 1*1*1*8 = 8"),
    ("model,d,global_batch,step_s", "llama3-8B,8,8,2", "line 2: recompute is not given; say "
     "what the run recomputed: none, selective, full, op, norm-up"),
    ("model,d,global_batch,recompute,precision,step_s", "llama3-8B,8,8,none,fp8,2",
     "line 2: precision=fp8 needs fp8_scaling, how its casts scale: blockwise, tensorwise, "
     "te, te-current"),
    ("d,global_batch,step_s", "8,8,2", "line 2: the model is not set"),
    ("model,cluster,d,global_batch,step_s", "llama3-8B,dgx-z100,8,8,2",
     "line 2: cluster='dgx-z100' is not a known cluster; use one of"),
    ("model,d,global_batch,overlap_comm,step_s", "llama3-8B,8,8,maybe,2",
     "line 2: overlap_comm='maybe' must be true or false"),
    ("model,d,global_batch,step_s", "llama3-8B,8,8,fast", "line 2: step_s='fast' is not a number"),
    ("model,d,global_batch,step_s,flops", "llama3-8B,8,8,2,palm",
     "line 2: flops='palm' names a FLOP count, which only tflops_per_gpu and mfu use"),
    ("model,layers,d,global_batch,step_s", "llama3-8B,12,8,8,2", "line 2: model='llama3-8B' "
     "is a preset: with it give only seq"),
])
def test_a_bad_cell_is_one_line_before_anything_is_predicted(tmp_path, capsys, header, line,
                                                              says):
    path = _write(tmp_path, header, line)
    with pytest.raises(ValueError, match="^" + re.escape(says)):
        read_runs(path)
    assert main(["--measured", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: " + says) and "\n" not in err


def test_a_bad_cell_names_its_line_in_the_file(tmp_path):
    """Comment lines count: the error names the line as an editor shows it."""
    path = _write(tmp_path, "# my runs", "model,d,global_batch,recompute,step_s",
                  "llama3-8B,8,8,none,2", "# the next one is wrong", "llama3-8B,8,8,none,-2")
    with pytest.raises(ValueError, match="^line 5: step_s='-2' must be a positive number"):
        read_runs(path)


def test_d_is_the_gpus_the_other_axes_leave(tmp_path):
    path = _write(tmp_path, "model,gpus,t,p,global_batch,recompute,step_s",
                  "llama3-70B,64,8,2,64,full,20")
    (run,) = read_runs(path)
    assert (run.run.layout.t, run.run.layout.p, run.run.layout.d) == (8, 2, 4)
    with pytest.raises(ValueError, match=r"^line 2: gpus='60' is not divisible by t\*c\*p"):
        read_runs(_write(tmp_path, "model,gpus,t,p,global_batch,recompute,step_s",
                         "llama3-70B,60,8,2,64,full,20"))


def test_a_missing_or_empty_file_is_named(tmp_path):
    with pytest.raises(ValueError, match="is not a file"):
        read_runs(tmp_path / "nothing.csv")
    with pytest.raises(ValueError, match="holds no runs"):
        read_runs(_write(tmp_path, "model,d,global_batch,step_s"))


def test_the_command_line_prints_the_example(capsys):
    assert main(["--measured", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out
    assert "Time: 15 runs, median |error|" in out
    assert "5 of 6 pairs in the measured order" in out
    assert ("Over 5 jobs: 16 of 17 pairs in the measured order; the model's first choice ran "
            "fastest in 5, and at 100.0% of the fastest at worst.") in out
    assert main(["--measured", str(EXAMPLE), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert len(result["runs"]) == 15 and [j["agree"] for j in result["jobs"]] == [3, 1, 1, 6, 5]


def test_a_pair_the_model_prices_alike_agrees_with_neither_order(tmp_path):
    """Two runs of one layout measured apart: the model cannot order them (tau 0)."""
    path = _write(tmp_path, "name,model,d,global_batch,recompute,step_s",
                  "slow,llama3-8B,8,8,full,3",
                  "fast,llama3-8B,8,8,full,2")
    (job,) = judge(read_runs(path)).jobs
    assert (job.agree, job.pairs, job.tau) == (0, 1, 0.0)
