# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py_src//py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 15 · Deep dive: beyond three axes — context and expert parallelism in the grid, Llama 3 and DeepSeek-V3 planned
#
# **Prerequisites:** [05 · Hybrid parallelism](05-hybrid-parallelism.ipynb) (the (d, p, t)
# grid and the planner), and the deep dives
# [09](09-deep-dive-interleaved-schedules.ipynb) (interleaved and zero-bubble schedules),
# [12](12-deep-dive-long-sequences.ipynb) (context parallelism),
# [13](13-deep-dive-mixture-of-experts.ipynb) (expert parallelism) and
# [14](14-deep-dive-sequence-parallelism.ipynb) (sequence parallelism and recomputation).
#
# Lesson 05's grid has three axes, (d, p, t). This deep dive adds the two that 12 and 13
# built on their own: **context parallelism** over c ranks (each sequence split over c
# GPUs, which share one micro-batch; keys and values travel a ring here, as in
# Megatron-Core, or are all-gathered, as in Llama 3 and by default in PyTorch's
# `context_parallel`) and **expert parallelism** over e ranks (a mixture of experts'
# experts split over e of the d data-parallel GPUs, tokens sent to them by all-to-alls).
# The layouts published since 2021 use them: Llama 3 405B trained on TP × CP × PP × FSDP,
# DeepSeek-V3 on PP × EP × ZeRO-1.
#
# The plan: the grid with five axes -> three layouts on 8 ranks, each equal to one process
# -> the cost model's planner on Llama 3 and DeepSeek-V3, beside their published layouts ->
# a takeaway -> a design question. About 40 minutes to read, code and outputs included;
# Run All takes under half a minute on a 2-core laptop.
# <!-- numbers: 40 because it is the reading time: markdown words / 200 + code lines / 10 + output lines / 20 -->

# %%
from dataclasses import replace

from lessonlib import grid_layout, hybrid
from lessonlib import costmodel as cm
from lessonlib.instruments.claims import at_most, claim, every
from lessonlib.costmodel.model import PUBLISHED_PARAMS
from lessonlib.exercises import frontier as ex
from lessonlib.instruments.nccl_rules import nccl_hazards
from lessonlib.viz.source import show

# %% [markdown]
# ## 1. One grid, five axes, one order
#
# Each new axis is one room's idea applied in one place, in one order, as torchtitan does.
# There the pipeline is cut first: `pipeline_llama` keeps this rank's stage of the model,
# then calls `parallelize_llama` on that stage, which applies every other axis ("the PT-D
# parallelisms (except pipeline parallelism)", as its file says) in its order: tensor, with
# sequence parallelism (SP, [deep dive 14](14-deep-dive-sequence-parallelism.ipynb)), then
# context, then activation checkpointing and compile, then data parallelism. `build_stage`
# below, lesson 05's builder too, does the same: it cuts the stage first, then on each part
# applies each room's own `apply_*`, kept in that room's package: tensor with SP
# (`apply_tp`), expert (`apply_ep`: an MoE layer's experts spread over the e group), then
# context (`apply_cp`: ring attention over the c group, each token's position read from the
# whole sequence), then data parallelism (`apply_dp`): the gradients
# averaged after backward over the d·c ranks that hold the same weights (plain, ZeRO-1 or
# FSDP), an expert's over the ranks holding its copies. The grid gains a c axis between
# p and t, and expert groups carved from the d ranks, in the grid's one rank order,
# tp-cp-pp-dp: tensor innermost, data outermost (lesson 05's grid when c = 1). Megatron-Core's
# default, tp-cp-ep-dp-pp, puts the pipeline outermost instead; with d = 1 the two agree.
# Here is t = 2, c = 2, p = 2 on 8 ranks, then the builder itself:

# %%
# NBVAL_CHECK_OUTPUT
print(grid_layout.layout_table(1, 2, 2, gpus_per_node=4, cp=2))

# %%
show(hybrid.build_stage)

# %% [markdown]
# ## 2. Three layouts on 8 ranks, each equal to one process
#
# Each layout trains the tiny GPT 3 SGD steps in float64 and is compared with one process on
# the whole batch: losses, every rank's shard of the first step's gradients and of the final
# weights. The MoE run uses a capacity factor E/k (E experts, k per token), so no token is
# dropped, and no auxiliary loss. Every rank's messages are recorded and replayed against
# NCCL's rules (`nccl_hazards`, deep dive 11): a *hazard* is an order of calls that would
# hang, or mix up messages, on GPUs, though gloo on CPUs runs it.

# %%
# NBVAL_IGNORE_OUTPUT
beyond = {"t=2 c=2 p=2 d=1, SP": dict(tp=2, cp=2, pp=2, sp=True),
          "t=2 p=2 d=2, FSDP on d": dict(tp=2, pp=2, dp=2, shard_on="fsdp"),
          "MoE t=2 p=2 d=2, e=2 inside d": dict(tp=2, pp=2, dp=2, ep=2, moe=True)}
for name, axes in beyond.items():
    ranks = hybrid.run(**axes, dtype="float64")
    s = hybrid.compare_parity(ranks)
    worst = max(s.max_loss_diff, s.max_grad_diff, s.max_weight_diff)
    claim(f"{name} on 8 ranks equals one process", worst < 1e-12,
          numbers=f"loss {s.max_loss_diff:.0e}, gradients {s.max_grad_diff:.0e}, "
                  f"weights {s.max_weight_diff:.0e}")
    hazards = nccl_hazards([r.events for r in ranks])
    claim("  and its recorded trace has no NCCL hazard", hazards == [],
          numbers=f"{sum(len(r.events) for r in ranks)} calls replayed: "
                  f"{'; '.join(hazards) or 'no hazard'}")

# %% [markdown]
# The same lab measures them: `python labs/hybrid.py --cp 2 --layouts t2p2d1`, with `--ep 2`
# or `--shard zero1` / `--shard fsdp`, and `labs/sweep.py` sweeps those flags like any other.
#
# ## 3. At scale: the planner on Llama 3 and DeepSeek-V3
#
# The ranks keep section 1's order, the e groups inside the d ranks. `cm.plan_job` searches
# t, c, p, d and e, with the pipeline schedule (1F1B, interleaved, or the zero-bubble ZB-H1
# and ZBV of [deep dive 09](09-deep-dive-interleaved-schedules.ipynb)), ZeRO-1 or FSDP, and
# recompute ([deep dive 14](14-deep-dive-sequence-parallelism.ipynb): `full` re-runs each
# layer's forward in the backward, `selective` only attention's s × s part, `none` keeps
# everything); `cm.explain_axes` says why each value won. The model shapes
# are the published ones: grouped-query attention with kv key/value heads, SwiGLU MLPs of
# width ffn, untied embeddings (Llama 3.2's 1B and 3B tie theirs, with rotary positions and
# no position table), and for DeepSeek-V3 E = 256 experts of which k = 8 serve each token:

# %%
# NBVAL_CHECK_OUTPUT
for name, published in PUBLISHED_PARAMS.items():
    print(f"{cm.MODELS[name].describe()}: published {published / 1e9:.2f} B, "
          f"{cm.MODELS[name].params() / published - 1:+.2%}")

# %% [markdown]
# **The published record.** Before it plans anything, the cost model is held to what teams
# measured, with one set of constants, none chosen on a row: a GEMM runs at the rate its
# shape allows under the GPU's measured maximum achievable matmul rate (a published sweep),
# at the share of it a Hopper GPU sustains once its clock settles at the power limit
# (Bekman's MSMF of 698.6 against a MAMF of 823.9 TFLOP/s on an H200 node; no A100 figure is
# published, so the A100 rows run at the burst rate: most of them come out too fast, but by
# no steady share of their compute, as one slower clock would make it, and torchtitan's not
# at all, as a check below the tables shows), and the memory-bound kernels' passes are
# counted (lesson 05); every row below is a check.
# Each row is compared on what its team published (step time, TFLOP/s per GPU by the team's
# own FLOP count, or tokens per second per GPU, which needs no count), with the model's
# figure and the error; the row's other published figures and, for a run measured against
# another, the ratio of the two are printed beside, never instead. Below the time rows, the
# memory rows: peak GiB per GPU where a team published it, and the layouts teams ran, which
# must therefore fit. Each table ends with its error as a distribution, its median and its
# worst
# (`python -m lessonlib.costmodel --published`):

# %%
# NBVAL_CHECK_OUTPUT
from lessonlib.costmodel import published as pub

print(pub.published_report(), pub.memory_report(), sep="\n\n")
record = [r for r in pub.published_rows() if r.run.role == "checked"]
middle, worst = pub.error_summary([r.error for r in record])
missed = [r for r in record if abs(r.error) > 0.15]
claim("the model does not yet predict every held-out row within 15 %", len(missed) > 0,
      numbers=f"{len(missed)} of {len(record)} checked rows miss by more than 15 %; median "
              f"|error| {middle:.0%}, worst {worst:+.0%}")
long = [r for r in record if "long sequence" in r.run.source]
claim("on NeMo's long-sequence table the model is too fast on every row, and more so at "
      "the longest sequence than at the shortest",
      all(r.error > 0 for r in long) and long[-1].error > long[0].error,
      numbers=", ".join(f"{r.run.model.s // 1024}K {r.error:+.0%}" for r in long))
gaps = [pub.attention_gap(r) for r in long]      # (attention's share, gap / attention)
claim("there the gap is a steady share of the model's attention time on every row, while "
      "attention's share of the step grows from under a quarter to over three quarters",
      all(0 < gap for _, gap in gaps) and max(g for _, g in gaps) - min(g for _, g in gaps)
      < 0.1 and gaps[0][0] < 0.25 and gaps[-1][0] > 0.75,
      numbers="gap / attention " + ", ".join(f"{g:+.0%}" for _, g in gaps)
              + "; attention / step " + ", ".join(f"{a:.0%}" for a, _ in gaps))
sweep = [r for r in record if r.run.source.startswith("torchtitan Table 2")]
titan = [pub.attention_gap(r)[1] for r in sweep]
claim("on torchtitan's 8B context-parallel sweep it is not: within a tenth of attention "
      "time at CP 1 and 2, over a quarter at CP 4 and 8",
      all(abs(g) < 0.1 for g in titan[:2]) and all(g > 0.25 for g in titan[2:]),
      numbers=", ".join(f"CP {r.run.layout.c} {g:+.0%}" for r, g in zip(sweep, titan)))
mcore = next(r for r in record if r.run.source.endswith("GPT 32B"))
exchange = pub.gap_share(mcore, "dp_comm")            # the gap, in exposed exchanges
whole = pub.published_rows([replace(mcore.run, layout=replace(mcore.run.layout, b=4, m=1))])[0]
claim("Megatron-Core's GPT 32B misses by about its whole exposed data-parallel exchange, and "
      "is met with its four sequences in one micro-batch, whose backward hides it",
      -1.15 < exchange < -0.85 and abs(whole.error) < 0.05,
      numbers=f"gap / exposed exchange {exchange:+.2f} at one sequence per micro-batch "
              f"({mcore.error:+.0%}); {whole.error:+.1%} at four")
a100 = [r for r in record if pub.cluster_of(r.run).gpu.name.startswith("A100")]
titan_a100 = [pub.gap_share(r, "compute") for r in a100 if "torchtitan" in r.run.source]
others = [pub.gap_share(r, "compute") for r in a100 if "torchtitan" not in r.run.source]
claim("on the A100 rows the gap is no steady share of the compute, as one slower clock would "
      "make it: from about a tenth to a third of it on Megatron-LM's, Korthikanti's and "
      "BLOOM's rows, and none on torchtitan's",
      min(others) < 0.12 and max(others) > 0.3 and all(abs(g) < 0.05 for g in titan_a100),
      numbers=f"gap / compute {min(others):+.2f} to {max(others):+.2f} over {len(others)} rows; "
              "torchtitan " + ", ".join(f"{g:+.2f}" for g in titan_a100))
h200 = [r for r in pub.memory_rows() if "H200" in r.row.source]
as_eager = [cm.estimate(r.row.model, replace(r.row.layout, loss="eager"),
                        cm.CLUSTERS[r.row.cluster]).memory.total / 2**30 / r.row.gib - 1
            for r in h200]
claim("the H200 rows' memory misses by more than a quarter with an eager loss, and by "
      "less than a tenth with the loss compiled, as torchtitan ran it",
      min(as_eager) > 0.25 and all(abs(r.error) < 0.1 for r in h200),
      numbers="eager " + ", ".join(f"{e:+.0%}" for e in as_eager) + "; compiled "
              + ", ".join(f"{r.error:+.0%}" for r in h200))

# %% [markdown]
# **Your own runs.** The record holds what teams chose to publish; the runs that matter to
# you are your own. `python -m lessonlib.costmodel --measured runs.csv` reads a CSV of runs
# you measured, one per line (the model, the cluster, the layout's settings by name, what it
# recomputed always among them, and one measured figure; `costmodel/measured.py` lists the
# columns), predicts each as the record
# is predicted, and then, job by job (one model on one cluster and GPU count), counts the
# pairs of layouts it puts in the order they ran: to choose a layout, the order matters as
# much as the number. `data/measured_runs_example.csv` holds torchtitan's benchmark runs so:

# %%
# NBVAL_CHECK_OUTPUT
from lessonlib.costmodel import measured

example = measured.read_runs(measured.EXAMPLE_CSV)
print(measured.measured_report(example))
jobs = measured.judge(example).jobs
wrong = [job for job in jobs if job.agree < job.pairs]
claim("the model orders every pair of torchtitan's layouts as they ran but one, and its "
      "first choice in every job ran fastest",
      sum(j.pairs - j.agree for j in jobs) == 1 and all(j.first_choice == 1 for j in jobs),
      numbers=f"{sum(j.agree for j in jobs)} of {sum(j.pairs for j in jobs)} pairs; out of "
              f"order in {'; '.join(job.job for job in wrong) or 'none'}")

# %% [markdown]
# Those runs are in the record. A harder test is a sweep no term of the model was shaped on:
# before BLOOM, BigScience timed ~180-200B models of four shapes on 48 Jean Zay nodes in
# several data-parallel x pipeline x micro-batch layouts to find the fastest
# (`train/tr11-176B-ml/chronicles-prequel.md`, "48 node contenders" and "Final round
# comparison"); `data/measured_runs_bigscience_2022.csv` holds them:
# <!-- numbers: 180 because it is the chronicle's own size range, 181B to 196B in its tables -->

# %%
# NBVAL_CHECK_OUTPUT
held = measured.read_runs(measured.HELD_OUT_CSV)
print(measured.measured_report(held))
judged = measured.judge(held)
b = {run.run.source: run.run.layout.b for run in held}
picked = [(b[j.first], b[j.fastest]) for j in judged.jobs]
agree, pairs = sum(j.agree for j in judged.jobs), sum(j.pairs for j in judged.jobs)
claim("on BigScience's held-out sweep the model orders at most half the pairs of layouts as "
      "they ran, and in every job its first choice has a smaller micro-batch than the fastest",
      2 * agree <= pairs and all(first < fastest for first, fastest in picked),
      numbers=f"{agree} of {pairs} pairs; micro-batch (the model's first, the fastest): "
              + ", ".join(f"({first}, {fastest})" for first, fastest in picked))
one, four = (next(r for r in judged.rows if r.run.source == f"181B DP8 PP6 MBS{k}")
             for k in (1, 4))
fewer = one.run.layout.m - four.run.layout.m           # micro-batches a step no longer runs
claim("what a micro-batch of 4 instead of 1 saved them is about a tenth of a second per "
      "micro-batch no longer run, where the model saves nothing",
      0.05 < (one.run.published - four.run.published) / fewer < 0.15
      and one.predicted - four.predicted < 0.01 * one.predicted,
      numbers=f"181B, DP 8 x PP 6: {one.run.published:.1f} -> {four.run.published:.1f} s "
              f"measured, predicted {four.predicted / one.predicted - 1:+.0%}, "
              f"{fewer} micro-batches fewer")

# %% [markdown]
# So the model ranks torchtitan's settings but not BigScience's layouts. Their larger
# micro-batches bought far more than the model's GEMMs gain from them, even after the larger
# pipeline bubble the model charges for them: each micro-batch they ran cost a fixed time
# the model leaves out, about 0.1 s on a stage of 12 layers. The chronicle does not name
# it. BLOOM's own script made every CUDA call synchronous (`CUDA_LAUNCH_BLOCKING=1`, its
# cure for a hang), which exposes each kernel's launch; but the team measured no cost from
# that at 160 GPUs, and the chronicle does not say whether these runs set it. Until the cost
# has a measured source, the model's choice of micro-batch is its weakest ranking.
# <!-- numbers: 160 because it is the chronicle's measurement: 90.29 and 90.25 TFLOP/s at 160 GPUs, blocking and not -->

# %% [markdown]
# One more held-out set, on the hardware most of today's runs use: NVIDIA's own benchmarks
# of Llama 3 8B, 70B and 405B on DGX-H100 in FP8 (Megatron-Bridge's performance summary,
# the first release that printed each layout), read with the settings of its recipes, which the
# file's header lists. Their FP8 is Transformer Engine's current scaling, each cast taking
# its tensor's amax first and the weights cast once a step (`fp8_scaling="te-current"`,
# priced from TE's code in `costmodel/gemm.py`). Each is one layout of its job, so they test
# the number, not the order:

# %%
# NBVAL_CHECK_OUTPUT
h100_runs = measured.read_runs(measured.HELD_OUT_H100_CSV)
print(measured.measured_report(h100_runs))
h100 = measured.judge(h100_runs).rows
errors = sorted(abs(r.error) for r in h100)
claim("on Megatron-Bridge's held-out H100 runs the model is within 15 % of every one, slower "
      "than every one, and within a tenth at the median",
      all(-0.15 < r.error < 0 for r in h100) and errors[len(errors) // 2] < 0.1,
      numbers=", ".join(f"{r.error:+.0%}" for r in h100))
as_torchao = [cm.estimate(r.run.model, replace(r.run.layout, fp8_scaling="tensorwise"),
                          cm.CLUSTERS[r.run.cluster]).tokens_per_s / r.run.n_gpus
              / r.run.published - 1 for r in h100]
claim("  read as torchao's casts, which cast the weights again every micro-batch, every run "
      "is predicted slower still", all(t < r.error for t, r in zip(as_torchao, h100)),
      numbers=", ".join(f"{e:+.0%}" for e in as_torchao))

# %% [markdown]
# So on the runs nearest a student's own the model errs on the slow side: a plan made with
# it promises less than NVIDIA's tuned recipes deliver. Read as torchao's casts, every run
# would miss by more: which casts a run makes, and whose FSDP (the 8B run's is
# Megatron-Core's, which copies nothing in or out of its buckets: `fsdp_impl="megatron"`),
# are worth knowing.
# <!-- numbers: 15 because it is the bound every published row is held to -->

# %% [markdown]
# How each row is read, from its note in `costmodel/record.py`. No row is read on its own:
# its settings follow its table's columns (a test fails if they contradict them), and what
# no table prints takes one default for every row (`record.SILENT`: one sequence per
# micro-batch, two model chunks per stage for an interleaved schedule, no recompute).
# - **Llama 3** (Dubey et al. 2024, Table 4 and §3.3.2): interleaved 1F1B with the first
#   and last stages one layer lighter, no activation checkpointing at 8K, FSDP; the paper
#   prints no chunk count v (its Figure 6 illustrates two), so the rule for every such row
#   holds: the fewest chunks, from two up, with which the run fits, since it ran. TFLOP/s per GPU by PaLM's count
#   (every attention score counted), the course's count (causal: half of them) beside.
#   Table 4's 128K row prints DP 4, which with TP 8, CP 16 and PP 16 makes 8,192 GPUs,
#   while its GPU column says 16,384: the table contradicts itself there, and both
#   readings are rows.
# - **Nemotron-4 15B** (Parmar et al. 2024, Table 2) and **BLOOM-176B** (the BigScience
#   repository's `train/tr11-176B-ml`): step times, with Nemotron-4's MFU by Megatron-LM's
#   count and BLOOM's TFLOP/s by Eq. 3 beside. Megatron-LM builds its layers on Transformer
#   Engine, which runs attention on an H100 in cuDNN's fused kernel: 529 TFLOP/s forward at
#   8K tokens under a causal mask, where FlashAttention-2, which PyTorch's SDPA and so
#   torchtitan run, reaches 333 (Shah et al. 2024, Fig. 5); the attention kernel is a
#   setting of the layout. Megatron-LM reduces gradients in fp32 under bf16, and nothing
#   the paper prints says its run overlapped that exchange: priced so, the row is far too
#   slow, the model's sign that the run hid a cost the paper does not name.
# - **torchtitan** (its `benchmarks/llama3_h100_202412_torchtitan.md`): tokens per second per
#   GPU on H100s limited to 500 W, every table in absolute figures: FSDP eager, compiled and
#   with Float8 on 8 and 128 GPUs, the 8B context-parallel sweep, 70B in 2D with and
#   without async TP, 405B in 3D with 1F1B and interleaved, the 405B context-parallel sweep;
#   and its async-TP benchmark (`benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md`),
#   whose Float8 rows are held out. The
#   file says its runs without Float8 achieve "33% to 39% MFU"; torchtitan's own FLOP
#   formula, applied here, turns 5,762 tokens/s into 33.7 %. Its tensor parallelism is
#   PyTorch's: activations batch first, so every sequence-parallel collective along the
#   sequence costs a copy of the gathered tensor (PyTorch's functional collectives gather
#   along the first dimension only), and async TP's compiler pass fuses the backward's
#   all-gathers but not its reduce-scatters, whose input is a sum of matmuls. Its FSDP
#   reduce-scatters gradients in fp32 (its only choice of `mixed_precision_reduce`).
# - **NeMo** (its `docs/source/performance/performance_summary.md`, container 24.07,
#   DGX-H100): tokens per second per GPU in FP8, with the model TFLOP/s beside, of Llama 3
#   8B and 70B, then, held out, the same table's Llama 2 7B, 13B and 70B, Nemotron-3 8B and
#   22B and Nemotron-4 340B, and last its GPT-3 5B, 20B and 175B (the models of NeMo's own
#   GPT-3 recipes, a GeLU MLP and attention fused); Megatron-Core's layers from Transformer
#   Engine, so attention in cuDNN and FP8 by its default recipe, delayed scaling, whose
#   norms write FP8 themselves;
#   the gradients' exchange overlapped, TP's transfers under its GEMMs and the pipeline's
#   sends under other chunks' compute where that release's own launcher config of the model
#   sets them (`overlap_grad_sync`, `overlap_param_sync`, `ub_tp_comm_overlap`,
#   `overlap_p2p_comm`).
#   Then, held out, NeMo's long-sequence table (`performance_long_sequence.md`): Llama 2
#   7B in FP8 at 4K to 1M tokens, the longer sequences split by context parallelism, model
#   TFLOP/s per GPU. The model is too fast there on every row, more at the longest
#   sequence than at the shortest (the checks below the tables), as on torchtitan's
#   context-parallel sweeps. How large the missing cost is says where to look
#   (`published.attention_gap`): on every row of NeMo's table, with or without context
#   parallelism, the run took longer than predicted by about a quarter of the model's
#   attention time, while attention's share of the step grows nearly fivefold. So the cost
#   grows with attention: that container's cuDNN attention ran slower than the 2024 rates
#   the model reads, or attention ran once more. Neither has a source: no rate of that cuDNN
#   is published, and NeMo's own long-context configs (launcher `24.05`, e.g.
#   `gpt3/5b_64k.yaml`) set no recompute, so the model charges neither and the rows stay
#   missed. The same measure tells torchtitan's 8B sweep apart: there the gap appears only
#   from CP 4 on, with the same 32K tokens per GPU, so its missing cost comes with the
#   context-parallel degree, not with attention.
# - **NVIDIA's DGX Cloud recipes** (NVIDIA/dgxc-benchmarking, release 24.11.1): step times
#   of Llama 3.1 8B and 70B and Nemotron-4 15B and 340B on H100 servers, in BF16 and in
#   FP8, at the fewest and the most GPUs of each table; every setting a table does not print
#   is read from the workload's own config. Held out, as the NeMo rows after Llama 3 are,
#   but for what the NeMo Nemotron rows' misses led to: two corrections read in code, a
#   squared-ReLU MLP's matrix products and a pipeline send under sequence parallelism.
#   Then its release 25.04, held out: the same Llama models and the largest one, and the
#   smaller Nemotron, read from the NeMo performance recipes at the commit the release pins.
# - **Megatron-Core's weak scaling** (the Megatron-LM README's H100 table of July 2024): nine
#   GPT models, per-GPU TFLOP/s by Megatron-LM's count, and the two ends of its strong
#   scaling of the 177B model, whose MFU the text gives, all held out. The README names the
#   overlaps it ran and Megatron-LM's defaults give the rest (a GeLU MLP, an unfused loss);
#   it overlaps the pipeline's sends, which Megatron-LM does only with virtual stages, so
#   its pipelines are read as interleaved. Its worst miss, the GPT 32B, is the size of its
#   whole exposed data-parallel exchange (`published.gap_share`, checked below the
#   tables): read at one sequence per micro-batch, as every row whose team prints none is,
#   its float32 gradients wait for the last micro-batch's backward (Megatron-Core's
#   `schedules.py`), too short to hide them; with its four sequences in one micro-batch the
#   model meets the row. The README prints no micro-batch, so the row keeps the rule and
#   stays missed.
# - **torchtitan on H200** (its `benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md`,
#   by the Trainy team): torchtitan's 8B Llama under FSDP on 32 and 64 H200s, compiled,
#   with Float8. Met after the model's time terms were set, it is a held-out check of them.
#   Its memory rows
#   missed (as the check below the tables prints) and led to a term the model lacked:
#   from April 2025 torchtitan
#   compiles its loss too, and a compiled cross entropy keeps the BF16 logits, where the
#   eager one keeps float32 log-probabilities (`Layout.loss`, read in the kernels inductor
#   generates, not fitted).
# - **torchtitan's first figures** (its `docs/performance.md` of April 2024): Llama 3 8B and
#   70B under FSDP on 64 A100s, eager, read from its configs of that date, with its MFU by
#   its count of then, which counted the token embedding; held out as the H200 rows are.
# - **DeepSeek-V3** (DeepSeek-AI 2024, Table 1): 14.8T tokens in 2.664M H800 GPU hours is an
#   average over the whole pre-training (its batch ramp-up included), not a step's
#   measurement; FP8 GEMMs, DualPipe, EP 64, each token on at most 4 nodes.
#
# Where the model and a team disagree, the model is assumed to be missing a cost until
# shown otherwise, and the miss is printed, not closed with a chosen constant. torchtitan's
# GPUs are held to 500 W, below the datasheet's 700 (its `docs/performance.md`; its team
# puts their peak between the SXM's and the NVL's without knowing where): the model places
# them between those two datasheets by their power limit, a reading, not a measurement.
# Hiding a transfer under compute is not free either: compute beside a transfer ran 18.9 %
# slower on average (Lee et al. 2025, abstract), and the model charges that wherever it
# hides one.
# DeepSeek-V3 recomputes its norms and MLA up-projections (§3.2.3), and quantizes every FP8
# GEMM's input in a separate kernel that reads BF16 from memory and writes FP8 back
# (§3.5.2).
#
# **How a layout prints** (`Layout.describe()`), before the planner prints some:
# - `t c p d e`: the tensor, context, pipeline, data and expert degrees (e inside d); `b`
#   sequences per micro-batch, `m` micro-batches per step and replica, `B` = b·m·d
#   sequences per step.
# - `v=2`: interleaved 1F1B with v = 2 model chunks per device (deep dive 09).
# - `recompute=`: what the backward recomputes: `none`, `selective` (attention's s × s
#   part), `full` (each layer's forward), or `norm-up`, DeepSeek-V3's: its RMSNorms and the
#   up-projections of its multi-head latent attention, MLA (§3.2.3).
# - `SP`: sequence parallelism (14); `ZeRO-1`: the optimizer state sharded over the d
#   replicas; FSDP would shard the weights too (08).
# - `uneven stages`: one layer fewer on the first and last pipeline stages, as Llama 3 did
#   (§3.3.2).
# - `CP allgather`: context parallelism with K and V all-gathered, Llama 3's; without it,
#   the ring (12).
# - `FP8 tensorwise`, `FP8 te`: FP8 scaled as torchao (torchtitan) or Transformer Engine
#   (Megatron-LM, NeMo) scales it; they differ in the cast kernels they run.
# - `DualPipe` and `FP8`: DeepSeek-V3's pipeline schedule, which pairs one micro-batch's
#   forward with another's backward, and its FP8 GEMMs; deep dive 16 runs both.
# - `compiled loss`: the cross entropy under torch.compile, its logits kept in BF16.
# - `overlapped sends`: the interleaved pipeline's sends and receives under other chunks'
#   compute, all but the warm-up's and the flush's (Megatron-Core's `overlap_p2p_comm`).
# - `cudnn attention`: attention in cuDNN's fused kernel (Megatron-LM's, through Transformer
#   Engine); without it, FlashAttention-2 (PyTorch's).
# - `routing <= 4 nodes`: each token's experts on at most 4 servers (DeepSeek-V3 §2.1.2).
# - `15% SMs on comm`: the share of each GPU's streaming multiprocessors (SMs) that run
#   communication kernels instead of compute; DeepSeek-V3: "we allocate 20 out of the 132
#   SMs available in the H800 GPU for this purpose" (§3.5.1), 15 %.
# - `(zbv)`, `(dualpipe)` after the planner's best: the schedule it picked; ZBV is deep
#   dive 09's zero-bubble V schedule.
# - The parts of a step the model prices: `compute`, `elementwise` (memory-bound kernels),
#   `bubble` (the pipeline's idle time), and each axis's exposed communication: `tp_comm`,
#   `cp_comm`, `pp_comm`, `ep_comm`, `dp_comm`; and `contention`, the compute slowed while
#   a hidden transfer shares the GPU.
# <!-- numbers: 15 because it is 20/132 of the SMs, rounded, as the layouts print it -->
#
# **The planner against the published layouts.** For each setup (model, cluster, GPU
# count, batch, sequence, and the team's precision and routing), the planner's best layout
# beside the team's, each with its step time and memory per GPU ("over memory" past the
# usable share), and the part of the step that separates them most. A layout within the
# planner's tolerance (`ex.WITHIN`, printed first: the same bar the exercise below uses)
# agrees with it:

# %%
# NBVAL_CHECK_OUTPUT
print(f"tolerance: a layout within {ex.WITHIN - 1:.0%} of the planner's best step "
      f"(ex.WITHIN = {ex.WITHIN:.2f}) counts as agreeing with it\n")
versus = {run.source: pub.versus_planner(run) for run in pub.published_runs()
          if run.source in pub.PLANNED}
print(pub.versus_table(versus.values()), end="\n\n")
llama_128k, llama_8k = versus["Llama 3 Table 4, 128K"], versus["Llama 3 Table 4, 16,384 GPUs 8K"]
every("a verdict on a team's layout names the term and its source", versus,
      lambda vs: vs.ratio <= ex.WITHIN or vs.parts[0][0] in pub.WHY)
claim("c grows with the sequence", llama_128k.best.layout.c > llama_8k.best.layout.c,
      numbers=f"the planner's c = {llama_8k.best.layout.c} at 8K, "
              f"{llama_128k.best.layout.c} at 128K")
claim("Meta's three layouts fit as Meta ran them, without recompute, and DeepSeek-V3's as "
      "it ran it, with its own partial recompute",
      all(vs.published.fits for vs in versus.values())
      and versus[pub.PLANNED[-1]].published.layout.recompute == "norm-up",
      numbers="GiB per GPU against the usable, in the order above: " + ", ".join(
          f"{est.memory.total / 2**30:.0f} of {est.memory_capacity_bytes / 2**30:.0f}"
          for est in (vs.published for vs in versus.values())))
every(f"a gap over {ex.WITHIN - 1:.0%} is named", versus, lambda vs: vs.ratio <= ex.WITHIN
      or "What separates them" in pub.explain_versus_planner(vs.run))
every("each team's layout is within the tolerance of the planner's best", versus,
      lambda vs: vs.ratio <= ex.WITHIN)

# %% [markdown]
# Whether a difference is real or a gap of the model is a question for each run; the
# cell below asks it of the two 8K runs. Put any run of the table in `READ` and run it
# again:

# %%
# NBVAL_CHECK_OUTPUT
READ = ["Llama 3 Table 4, 8,192 GPUs 8K", "Llama 3 Table 4, 16,384 GPUs 8K"]
for name in READ:
    print(pub.explain_versus_planner(versus[name].run), end="\n\n")

# %% [markdown]
# **What each memory saving bought.** Each team's layout with one of its savings undone
# (the cost model's memory, GiB per GPU on the busiest GPU, against the usable):

# %%
# NBVAL_CHECK_OUTPUT
for run_name in pub.SAVINGS:
    rows = pub.memory_savings(versus[run_name].run)
    print(run_name)
    for what, est in rows:
        print(f"  {what:<38} {est.memory.total / 2**30:6.1f} of "
              f"{est.memory_capacity_bytes / 2**30:.1f} GiB: "
              f"{'fits' if est.fits else 'does not fit'}")
    every("  undoing each saving costs memory", dict(rows[1:]),
          lambda est, ran=rows[0][1]: est.memory.total > ran.memory.total)
deepseek = versus[pub.PLANNED[-1]].published.memory
print("DeepSeek-V3's busiest GPU (DualPipe's rank with both ends of the model), GiB: "
      + ", ".join(f"{part} {getattr(deepseek, part) / 2**30:.1f}"
                  for part in ("model_state", "activations", "logits", "working")))

# %% [markdown]
# So the planner agrees with both teams: each published layout is within its tolerance of
# the best, which differs in settings (more model chunks per stage, another ZeRO stage)
# worth less than the model's own error. A verdict that a team chose badly would need
# both: the term that separates the layouts, and a source that says the term is real (put
# `v=1` into Meta's layout with `dataclasses.replace` to see one named). Memory: Meta's layouts fit as Meta ran them,
# once the model counts what a Llama layer keeps (measured, lesson 14) and what Meta's FSDP
# holds. DeepSeek-V3's fits once the model keeps what its report says it kept: the norms'
# and MLA's inputs with RMSNorm and the up-projections recomputed (§3.2.3), the MoE's routed
# inputs and SwiGLU's inputs in FP8 and the attention output in E5M6 (§3.3.3), and no
# expert's output, since the gate can scale SwiGLU's recomputed output before the
# down-projection (as Megatron-Core's experts do); and that its busiest GPU is the DualPipe
# rank that holds both ends of the model, the embedding and the output head, which the
# multi-token-prediction module shares (§3.2.3). The report does not print how its 61
# layers and the MTP module fill 16 stages of 4; the model gives the two spare slots to the
# stages with the embedding and the head.
#
# **Why DeepSeek-V3 has no TP.** Its report gives memory as the reason: "we meticulously
# optimize the memory footprint during training, thereby enabling us to train DeepSeek-V3
# without using costly Tensor Parallelism (TP)" (DeepSeek-AI 2024, §3.2), by recomputing
# RMSNorm and the MLA up-projections in the backward, keeping the EMA of the weights in CPU
# memory and sharing the embedding and output head between the first and last stage
# (§3.2.3). Why TP would be costly there is the course's inference, not the report's: TP
# all-reduces every layer's activations twice per layer over NVLink, and the H800's NVLink
# is cut to 400 GB/s (NVIDIA's figure). The report gives NVLink one figure, for its
# all-to-all kernels, and never ties it to TP: "NVLink offers a bandwidth of 160 GB/s,
# roughly 3.2 times that of IB (50 GB/s)" (§3.2.2). Its 64-way expert parallelism spans 8
# servers of 8 GPUs, so its all-to-alls cross the network, which node-limited routing (at
# most 4 nodes per token) and DualPipe's overlap (§3.2.1-3.2.2) are there to contain.

# <div style="border: 2px solid #4c72b0; border-radius: 6px; padding: 10px 14px;">
# <b>Takeaway.</b> Context and expert parallelism are two more axes of the same grid, each
# applied in one place and in one order (the pipeline cut first, then tensor, context and
# data on each stage), and together they still compute exactly what one process computes.
# Context parallelism splits the sequence when activations, not weights, outgrow a GPU;
# expert parallelism splits an MoE layer's experts over the ranks that would otherwise be
# replicas. The planner searches all
# five axes with the schedule, the sharding and the recompute, and says why each value won.
# It is held to the published record first: where it parts from a team's measured figure
# or layout, it names the cost, and a cost the model leaves out is the first suspect.
# </div>
#
# ## Exercise
#
# **1. The design question of today.** Llama 3 405B, 128K-token sequences, 16,384 H100, 128
# sequences per step: which (t, c, p, d), and why each axis? The checker answers axis by
# axis, and accepts a layout only within the planner's tolerance of section 3
# (`ex.WITHIN`): its step at most that many times the planner's best, and one that fits in
# memory. Meta's own layout is an answer, since it ran: the checker estimates it as Meta
# ran it and names the term that separates it from the planner's best.

# %%
long_context = dict(t=None, c=None, p=None, d=None)
ex.check_long_context_layout(**long_context)

# %% tags=["solution", "hide-input", "hide-output"] jupyter={"outputs_hidden": true, "source_hidden": true}
# Solution (click to open)
# NBVAL_CHECK_OUTPUT
# t = 8 fills a server; c = 16 leaves 8K tokens per GPU, as at 8K; p = 16 splits the state;
# d = 16384 / (8*16*16) = 8 replicas of 16 sequences: Llama 3's own answer.
long_context_solution = dict(t=8, c=16, p=16, d=8)
ex.check_long_context_layout(**long_context_solution)
