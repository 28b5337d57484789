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
# # 01 · Why scale: the memory wall and the time wall
#
# **The castle.** Picture a Lego castle with 175 billion bricks, and one builder with one
# table. Two things go wrong. The bricks do not fit on the table (the **memory wall**), and
# even if they did, one builder would need centuries to place them (the **time wall**).
# Every later lesson is a way to bring in more builders and tables: copies of the castle
# plan for each builder (data parallelism, lesson 02), rooms built by different builders
# (model parallelism, 03), one wall split across builders or an assembly line (04), and a
# whole fleet organised in three dimensions (05).
#
# This notebook first **predicts** both walls with the course's cost model
# (`lessonlib.costmodel`, pure arithmetic, tested against the published figures), then
# **measures** this machine training a tiny GPT and extrapolates to GPT-3.
#
# *Watch and read:* Stanford MLSys seminar #83, Deepak Narayanan, "Training Large Language
# Models at Scale", 01:35-03:41 (why one GPU is not enough: the 288 years); Narayanan et
# al., "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM"
# (SC21), §1.

# %%
import matplotlib.pyplot as plt

import lessonlib
from lessonlib import costmodel as cm
from lessonlib import baseline
from lessonlib.instruments.claims import at_least, at_most
from lessonlib.viz import scale
from lessonlib.viz.source import show

# %% [markdown]
# ## 1. The memory wall
#
# Training with Adam in mixed precision keeps **16 bytes per parameter**: 2 for the 16-bit
# weights, 2 for the 16-bit gradients and 12 for the fp32 master weights, momentum and
# variance (ZeRO, Rajbhandari et al. 2020, §3.1). For GPT-3 (175 B parameters) that is:

# %%
# NBVAL_CHECK_OUTPUT
gpt3 = cm.MODELS["gpt3-175B"]
gpt3_state = sum(cm.model_state_bytes(gpt3.params()))
largest = max(cm.GPUS.values(), key=lambda gpu: gpu.memory_bytes)
usable = cm.usable_memory_bytes(largest)
reserved = largest.memory_bytes - usable
print(f"GPT-3: {gpt3.params() / 1e9:.1f} B parameters (Megatron-LM 2021, Eq. 2)")
print(f"model state: 16 bytes x {gpt3.params() / 1e9:.1f} B = {gpt3_state / 1e12:.2f} TB")
print(f"the largest GPU in the presets, {largest.name}, reports {largest.memory_bytes / 2**30:.1f} "
      f"GiB ({largest.memory_bytes / 1e9:.0f} GB); the CUDA context and NCCL's buffers take "
      f"{reserved / 1e9:.1f} GB of it, leaving {usable / 1e9:.0f} GB")
print(f"GPT-3's model state is {gpt3_state / usable:.0f}x that")

# %% [markdown]
# Throughout the course a model **fits** a GPU when it needs at most the GPU's memory as the
# GPU reports it (nvidia-smi's MiB) less named reserves, `cm.memory_reserves()`: the CUDA
# context (an estimate), NCCL's buffers (its default 4 MiB per channel and direction, per
# communicator) and the allocator's fragmentation (not modelled).
#
# Activations come on top: every layer keeps its intermediate tensors for the backward pass,
# `s·b·h·(34 + 5·a·s/h)` bytes per layer in 16-bit without any parallelism (Korthikanti et
# al. 2022, Table 2), for a micro-batch of b sequences of s tokens (the batch one GPU works
# on at once), a hidden size h and a attention heads. The table below puts six models next to the GPUs of the last three generations.

# %%
# NBVAL_CHECK_OUTPUT
print(f"{'model':>16} {'params':>9} {'weights+grads+Adam':>19} {'activations (b=1)':>18}")
for name in scale.MODEL_PRESETS:
    parts = scale.one_gpu_memory(cm.MODELS[name])
    state = parts["weights"] + parts["gradients"] + parts["optimizer"]
    print(f"{name:>16} {cm.MODELS[name].params() / 1e9:>8.2f}B {state / 1e9:>16,.0f} GB "
          f"{parts['activations'] / 1e9:>15,.0f} GB")
print("GPU memory (usable): " + ", ".join(
    f"{g.name} {g.memory_bytes / 1e9:.0f} GB ({cm.usable_memory_bytes(g) / 1e9:.0f})"
    for g in cm.GPUS.values()))

# %% [markdown]
# The activations are the part that techniques other than more GPUs can shrink. For
# GPT-3 (b = 1, all 96 layers, one micro-batch; Korthikanti et al. 2022, Table 2),
# activations per GPU under each technique lesson 04 builds: tensor parallelism over t = 8
# GPUs splits most of them, sequence parallelism splits the rest, and recomputation trades
# FLOPs for bytes (it keeps fewer of a layer's tensors and computes the others again in the
# backward pass: selective recompute only attention's, full recompute all but the layer's
# input).

# %%
# NBVAL_CHECK_OUTPUT
gpt3 = cm.MODELS["gpt3-175B"]
techniques = {"none": dict(recompute="none"), "selective recompute": dict(recompute="selective"),
              "full recompute": dict(recompute="full"), "TP t=8": dict(t=8, recompute="none"),
              "TP+SP t=8": dict(t=8, sequence_parallel=True, recompute="none"),
              "TP+SP t=8 + selective": dict(t=8, sequence_parallel=True, recompute="selective")}
for name, options in techniques.items():
    acts = cm.memory_per_gpu(gpt3, b=1, **options).activations
    print(f"{name:>22}: activations {acts / 1e9:7.1f} GB per GPU")

# %% [markdown]
# The widget puts each part side by side with the GPU sizes on a linear axis, so a bar twice
# as long is twice as many bytes; GPUs with the same memory share one bar, labelled with
# what a job can use. Try it: pick a model, a micro-batch size and a recomputation mode. A
# preset fixes the
# number of layers L and the hidden size h, so their sliders show its values greyed out;
# choose "custom" to move them and build your own model. Full recomputation keeps only each layer's input (`2·s·b·h` bytes)
# and recomputes the rest in the backward pass; it shrinks activations, never the 16 bytes
# per parameter.

# %%
scale.memory_widget()

# %% [markdown]
# ## 2. The time wall
#
# Training costs about **6·P·D** FLOPs for P parameters and D tokens (2PD forward, 4PD
# backward), or 8PD when the forward pass is recomputed. GPT-3 saw 300 B tokens.
# Megatron-LM 2021 (§1) says that training GPT-3 "would require approximately 288 years
# with a single V100", without stating the per-GPU rate behind it. Solve for it:

# %%
# NBVAL_CHECK_OUTPUT
P, D = 175e9, 300e9
years = 288 * cm.SECONDS_PER_YEAR
v100 = cm.get_gpu("V100").peak_flops
for label, recompute in (("6PD", False), ("8PD, recompute", True)):
    flops = cm.training_flops(P, D, recompute)
    rate = cm.rate_for_time(flops, 1, years)
    print(f"{label:>15}: {flops:.2e} FLOPs -> 288 years means {rate / 1e12:.1f} TFLOP/s "
          f"= {rate / v100:.0%} of a V100's {v100 / 1e12:.0f} TFLOP/s peak")
rate_288 = cm.rate_for_time(cm.training_flops(P, D), 1, years)   # the 6PD rate, used below

# %% [markdown]
# Both rates are plausible: Megatron-LM 2019 measured 39 TFLOP/s (30 % of peak) on one V100.
# With many GPUs the time falls, and Megatron-LM 2021 (Eq. 4) estimates it as
# `8·T·P / (n·X)` for T training tokens (the paper's letter for what we called D), P
# parameters and n GPUs that each sustain X FLOP/s (8, not 6: it counts the recomputed
# forward pass). The cost model gives the paper's two worked examples to within a day:
# the paper rounds its results (and its 1T figure sits a little above what Eq. 4 gives
# with the inputs it states; the difference is printed).

# %%
# NBVAL_CHECK_OUTPUT
for label, P_, T, n, X, paper in (("GPT-3 175B", 175e9, 300e9, 1024, 140e12, 34),
                                  ("1T model", 1e12, 450e9, 3072, 163e12, 84)):
    days = cm.megatron_training_days(P_, T, n_gpus=n, flops_per_gpu=X)
    print(f"{label}, {T / 1e9:.0f}e9 tokens, {n} A100 at {X / 1e12:.0f} TFLOP/s: {days:.1f} days "
          f"(paper: {paper}, {days - paper:+.1f} days)")

# %% [markdown]
# The widget below starts one V100 at the rate solved above from "288 years" (6PD), so it
# lands on 288 years. 30 % of the V100's peak, about what Megatron-LM 2019 measured on one
# V100 (39 TFLOP/s), is a slightly faster rate, hence fewer years (move its efficiency
# slider to 30 %). Both are printed here, from the same formula:

# %%
# NBVAL_CHECK_OUTPUT
for why, rate in (("solved from 288 years", rate_288), ("30 % of peak (Megatron-LM 2019)",
                                                        0.3 * v100)):
    t = cm.training_time_s(cm.training_flops(P, D), 1, rate) / cm.SECONDS_PER_YEAR
    print(f"{why:>36}: {rate / 1e12:.1f} TFLOP/s -> {t:.0f} years")

# %%
scale.time_widget(efficiency=rate_288 / v100)

# %% [markdown]
# ## 3. Measured: this machine against GPT-3
#
# Now a real run. `lessonlib.baseline.train_tiny_gpt` trains the course's tiny GPT (its
# shape is printed below the plot) on a generated corpus of sentences about building a
# castle, in this one process. The loss must fall, and the step times give this machine's
# FLOP/s, counted with the same formula the cost model uses for GPT-3.

# %%
run = baseline.train_tiny_gpt(steps=100)
fig, ax = plt.subplots(figsize=(6, 3))
ax.plot(run.losses)
ax.set_xlabel("step")
ax.set_ylabel("cross-entropy")
ax.set_title("tiny GPT on this machine")
plt.show()

# %%
# NBVAL_CHECK_OUTPUT
cfg = run.cfg
print(f"tiny GPT: {cfg.layers} layers, hidden size {cfg.hidden}, {len(run.losses)} steps")
first, last = sum(run.losses[:10]) / 10, sum(run.losses[-10:]) / 10
at_most(f"the mean loss of the last 10 steps (the first 10: {first:.1f})", last,
        round(first - 1, 1), digits=2)

# %%
# NBVAL_IGNORE_OUTPUT
rate = baseline.measured_flops(run)
gpt3_flops = cm.training_flops(175e9, 300e9)
print(f"this machine sustains {rate / 1e9:.1f} GFLOP/s on the tiny GPT")
print(f"GPT-3 at that rate: {gpt3_flops / rate / cm.SECONDS_PER_YEAR:,.0f} years")
print(f"a V100 at {rate_288 / 1e12:.1f} TFLOP/s is {rate_288 / rate:,.0f}x faster; "
      f"it still needs 288 years")
years_here = gpt3_flops / rate / cm.SECONDS_PER_YEAR
at_least("at this machine's rate, GPT-3's training time", years_here, 1000, unit=" years",
         digits=6)

# %% [markdown]
# Small matrices use a CPU (or a GPU) far below its peak, so this rate is a floor, not a
# fair comparison; the point is the order of magnitude: no single device trains GPT-3.
#
# ## 4. The first distributed program
#
# The way out is more devices. Here are four ranks (CPU processes on a laptop, one GPU each
# on a GPU machine), started from this cell. Each contributes its rank to one
# **all-reduce**, the collective operation at the heart of lesson 02, and returns the sum.
# This is the whole program every rank runs:

# %%
show(lessonlib.launcher.demo_rank_sum)

# %%
# NBVAL_CHECK_OUTPUT
results = lessonlib.launch(lessonlib.launcher.demo_rank_sum, 4)
for r in results:
    print(f"rank {r.rank} of {r.world_size}: sum of all ranks = {r.sum:.0f}")

# %%
# NBVAL_CHECK_OUTPUT
# The two walls, from sections 1 and 2
print(f"GPT-3's model state: {gpt3_state / 1e12:.1f} TB = {gpt3_state / usable:.0f}x the "
      f"{usable / 1e9:.0f} GB usable on one {largest.name}")
one_v100 = cm.training_time_s(gpt3_flops, 1, rate_288) / cm.SECONDS_PER_YEAR
print(f"its compute: {gpt3_flops:.3g} FLOPs = {one_v100:.0f} years of one V100 at "
      f"{rate_288 / 1e12:.1f} TFLOP/s")

# %% [markdown]
# > **Takeaway.** GPT-3's model state alone (2.8 TB) is 19 times the usable memory of the
# > largest GPU, and its compute (3.15e23 FLOPs) is centuries of one GPU. Both walls are
# > broken the same way: split the work across many devices, and pay for it in
# > communication. The rest of the course measures that price.
#
# ## Exercises
#
# Each exercise has a cell for your answer: replace `None`, run the cell, and the checker
# below it says whether the answer is right and, if not, which slip gives your number. The
# solution is hidden under it (click to expand); Run All runs it without touching your cell.
#
# **1. The other way round.** The table above turns parameters into bytes. Turn it around:
# what is the largest model (in parameters) whose weights, gradients and Adam state fit in
# the usable memory of one A100-80GB (`cm.usable_memory_bytes`: its memory less the named
# reserves), before any
# activation? Which of the table's models still train on one GPU?

# %%
from lessonlib.exercises import scale as ex

my_params = None
ex.check_largest_model(my_params)

# %% tags=["solution", "hide-input", "hide-output"] jupyter={"outputs_hidden": true, "source_hidden": true}
# Solution (click to open)
# NBVAL_CHECK_OUTPUT
solution_params = cm.usable_memory_bytes(cm.GPUS["A100-80GB"]) / 16
ex.check_largest_model(solution_params)

# %% [markdown]
# **2.** What is the smallest number of A100-80GB GPUs whose usable memory could hold
# GPT-3's model state, before any activation?

# %%
my_gpus = None
ex.check_min_gpus(my_gpus)

# %% tags=["solution", "hide-input", "hide-output"] jupyter={"outputs_hidden": true, "source_hidden": true}
# Solution (click to open)
# NBVAL_CHECK_OUTPUT
import math

usable_a100 = cm.usable_memory_bytes(cm.GPUS["A100-80GB"])
solution_gpus = math.ceil(16 * cm.MODELS["gpt3-175B"].params() / usable_a100)
ex.check_min_gpus(solution_gpus)

# %% [markdown]
# **3. A deadline.** Section 2 gave Megatron-LM's 34 days for GPT-3 on 1024 A100 at
# 140 TFLOP/s each. Your team must train GPT-3 (300 B tokens) in **7 days** at the same
# 140 TFLOP/s per GPU. How many A100 does Eq. 4 ask for? Solve it by hand (no
# `megatron_training_days`); what does the answer assume about communication?

# %%
my_n = None
ex.check_gpus_for_days(my_n)

# %% tags=["solution", "hide-input", "hide-output"] jupyter={"outputs_hidden": true, "source_hidden": true}
# Solution (click to open)
# NBVAL_CHECK_OUTPUT
import math

solution_n = math.ceil(8 * 300e9 * 175e9 / (140e12 * 7 * 86400))
ex.check_gpus_for_days(solution_n)
