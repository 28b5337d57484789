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
# # 08 · Deep dive: sharding the replica (ZeRO stages, FSDP units)
#
# This notebook extends [02 · Data parallelism](02-data-parallelism.ipynb), section 6: what
# each ZeRO stage holds and sends, measured to the byte, and the proof that sharding changes
# who holds what, never the numbers.
#
# 1. the formula: bytes per GPU by stage and by d;
# 2. measured against the formula, stage by stage, and why two bars differ;
# 3. every stage trains exactly like one process, and like PyTorch's own;
# 4. FSDP's units: what stage 3 gathers and scatters, call by call;
# 5. when to shard, and when to split the model instead.

# %%
import matplotlib.pyplot as plt
import torch

import lessonlib
from lessonlib import costmodel as cm
from lessonlib.data import corpus_tokens, lm_batch
from lessonlib.data_parallel import zero_runs
from lessonlib.data_parallel.fsdp import FullyShardedDataParallel as FSDP
from lessonlib.data_parallel.fsdp_units import unit_modules
from lessonlib.models import SHARDING_CONFIG, lm_loss
from lessonlib.viz import zero as zviz
from lessonlib.viz.source import show

gpt3 = cm.MODELS["gpt3-175B"]
print(f"GPT-3: {gpt3.params() / 1e9:.0f} B parameters; the tiny GPT here: "
      f"{sum(p.numel() for p in zero_runs.build_model(SHARDING_CONFIG, 0).parameters()):,}")

# %% [markdown]
# ## 1 · The formula
#
# In mixed-precision Adam a replica holds 16 bytes per parameter Ψ: 2 of bf16 weights, 2 of
# gradients, 12 of fp32 master weights, momentum and variance (ZeRO, Rajbhandari et al.
# 2020, §3.1). With d ranks, stage 1 shards the optimizer state (4Ψ + 12Ψ/d bytes per GPU),
# stage 2 the gradients too (2Ψ + 14Ψ/d), stage 3 the weights too (16Ψ/d). PyTorch's FSDP is
# stage 3 cut into units (Zhao et al., VLDB 2023), Megatron's distributed optimizer is
# stage 1. GB per GPU for GPT-3, by stage and d:

# %%
# NBVAL_CHECK_OUTPUT
ds = (1, 8, 64, 1024)
print(f"{'d':>6}" + "".join(f"{'stage ' + s:>11}" for s in zviz.STAGES))
for d in ds:
    row = zviz.predicted_gb(gpt3.params(), d)
    print(f"{d:>6}" + "".join(f"{sum(row[s].values()):>11.1f}" for s in zviz.STAGES))

# %% [markdown]
# Stages 1 and 2 level off at the part they still replicate (4Ψ and 2Ψ bytes); only stage 3
# keeps shrinking as 1/d, and of the d shown it is the only way an 80 GB GPU holds GPT-3's
# state, from d = 64 on (before a single activation).
#
# ## 2 · Measured against the formula
#
# The tiny GPT trained 2 AdamW steps at every stage on 2 ranks, in float32 (4 bytes per
# weight and gradient, 8 of Adam state), `lessonlib.data_parallel`'s `ShardedOptimizer` for
# stage 1 and `FullyShardedDataParallel` for stages 2 and 3 (the run behind notebook 02's
# widget, at d = 2). What rank 0 held after the step, and what one step sent, from the
# ledger:

# %%
# NBVAL_CHECK_OUTPUT
measured = zviz.measure_stages(2)
for stage, r in measured.items():
    print(f"stage {stage}: rank 0 sent {r['sent']:,.0f} bytes, formula {r['sent_formula']:,.0f}; "
          f"held (weights, gradients, optimizer) {r['held']['weights']:,} / "
          f"{r['held']['gradients']:,} / {r['held']['optimizer']:,} B")

# %%
zviz.held_bars(measured, 2)
plt.show()

# %% [markdown]
# The measured bars differ from the formula in two places, and both are the lesson.
# Stage 2 keeps the full weights from forward to backward (light blue) *and* its fp32 slice
# of them (dark blue): that slice is the master copy ZeRO counts inside its 12 bytes of
# optimizer state, and our float32 run has no separate master. Stage 3 holds one unit's
# gathered weights at a time, freed after use: the price of sharding the weights is that
# memory moment, plus traffic. The bytes sent are exactly the formula's: stages 0-2 move an
# all-reduce's 2(d-1)/d x S per rank (a reduce-scatter plus an all-gather), stage 3 gathers
# the weights again for backward, 3(d-1)/d x S, **1.5x**, paid every step, on the slowest
# network the group spans.
#
# ## 3 · Sharding changes who holds what, never the numbers
#
# The tests hold every stage to one process on the whole batch. Here is their check, small:
# each of 2 ranks starts from its *own* random weights (so a pass proves the wrap copies
# rank 0's) and trains 3 AdamW steps in float64 on its shard of every global batch, at
# stages 0-3 and with PyTorch's `ZeroRedundancyOptimizer` (stage 1) and FSDP2's
# `fully_shard` (stage 3), all in one launch:

# %%
stages = ("0", "1", "2", "3", "torch-zero", "torch-fsdp2")
cases = [dict(stage=s, optimizer="adamw", steps=3, global_batch=6) for s in stages]
per_rank = lessonlib.launch(zero_runs.train_cases, 2, cases)

model = zero_runs.build_model(SHARDING_CONFIG, 0, torch.float64)
cls, kwargs = zero_runs.OPTIMIZERS["adamw"]
opt = cls(model.parameters(), **kwargs)
tokens, _ = corpus_tokens()
for step in range(3):                                  # one process, the whole batch
    x, y = lm_batch(tokens, batch=6, seq=SHARDING_CONFIG.seq, step=step, seed=0)
    loss = lm_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
one_process = {k: v.detach() for k, v in model.state_dict().items()}
len(per_rank[0])

# %%
# NBVAL_CHECK_OUTPUT
for i, stage in enumerate(stages):
    gap = max((rank[i].weights[k] - w).abs().max().item()
              for rank in per_rank for k, w in one_process.items())
    print(f"{zero_runs.STAGES[stage]:<66} = one process (1e-9): {gap < 1e-9}")

# %% [markdown]
# Equal to summation order, on both ranks, for ours and PyTorch's alike. (The tests also
# run 3 ranks, whose shards need padding, SGD with momentum, tied and frozen weights, and
# bf16 compute against FSDP2's `MixedPrecisionPolicy`.)
#
# ## 4 · FSDP's units: gather, compute, free
#
# Stage 3 never holds the whole model. It cuts the model into **units** (here the embedding,
# each transformer block and the head, as FSDP2 users call `fully_shard` on each block).
# Before a unit's forward, every rank all-gathers the unit's weights; after it, the gathered
# copy is freed. Backward gathers each unit again, computes its gradients and
# reduce-scatters them, so each rank keeps only its shard's sum. Per step: two all-gathers
# and one reduce-scatter per unit. In lessonlib's `FullyShardedDataParallel` those are the
# unit's steps, each a function (step 5, the reduce-scatter, is `FSDP.reduce_scatter`, run
# when backward has computed the unit's gradients):

# %%
show(FSDP._gather_for_forward, FSDP._free_after_forward, FSDP._gather_for_backward)

# %% [markdown]
# Why `_gather_for_forward` notes where each gathered weight lies: autograd saves a layer's
# weight for its backward, and ZeRO-3 must not keep that gathered copy alive until then.
# The saved-tensor hooks (`FSDP._pack`, `FSDP._unpack`) swap such a tensor for a ticket when
# it is saved and, in backward, hand out the same view of the *re-gathered* weight instead.
# The ledger of the stage 3 run above counts the calls:

# %%
# NBVAL_CHECK_OUTPUT
units = [name for name, _ in unit_modules(zero_runs.build_model(SHARDING_CONFIG, 0))]
ledger = per_rank[0][stages.index("3")].ledgers[-1]
print(f"units: {units}")
for op in ("all_gather", "reduce_scatter", "all_reduce"):
    calls = ledger.get(op, {}).get("calls", 0)
    print(f"{op:>15}: {calls} calls in one step ({calls / len(units):g} per unit)")

# %% [markdown]
# An all-gather sends (d-1)/d of a unit's weights per rank, a reduce-scatter (d-1)/d of its
# gradients: two gathers and a scatter make the 3(d-1)/d x S of section 2, against the
# 2(d-1)/d x S of an all-reduce. FSDP hides the gathers behind compute by prefetching the
# next unit's weights while the current one computes; the lab `labs/zero.py` times stages
# 0-3 against PyTorch's `fully_shard`, in one run:
# `python labs/zero.py --world-size 2 --json results/zero.json`.
#
# ## 5 · When to shard, and when to split the model
#
# Shard when the model *state* does not fit but one layer's weights and activations do, and
# the network can carry 1.5x an all-reduce every step (ZeRO §7.2.2); stage 3 also needs one
# sample or more per GPU in the global batch, since every GPU is a replica. Split the model when a
# single layer or its activations do not fit, or the network between servers is too slow:
# tensor parallelism inside a server, pipeline parallelism across servers (lessons 03 and
# 04). Large runs do both (lesson 05).
