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
# # 03 · Model parallelism: the rooms of the Lego castle
#
# **The castle.** Lesson 02 gave every builder a full copy of the castle plan. That stops
# working when the castle does not fit on one table at all. The simplest way out: give each
# builder some **rooms**. Builder 0 builds the gate hall, passes the half-built castle to
# builder 1, who adds the great hall, and so on up to the tower. When the inspector at the
# top finds a mistake (the loss), the corrections travel back down the line, room by room.
#
# In a neural network the rooms are **consecutive layers**: p ranks each hold one *stage*.
# The forward pass sends the activation from stage to stage; the backward pass sends the
# gradient of each stage's input back. This is naive (inter-layer) model parallelism.
# It divides memory by p. Does it also divide time? This notebook predicts the answer with
# the cost model, then runs the assembly line for real on 4 ranks and measures it.
#
# *A word on names.* The lesson calls splitting the **layers** across devices "model
# parallelism". The survey it builds on (Ben-Nun and Hoefler, "Demystifying Parallel and
# Distributed Deep Learning", §6.2) uses the same words for splitting each layer's
# **neurons** across devices, which this course, like Megatron-LM, calls tensor parallelism
# (lesson 04). Same words, two ideas: say which one you mean.
#
# *Watch:* Stanford MLSys seminar #83, Deepak Narayanan, "Training Large Language Models at
# Scale", 06:56-13:45 (splitting the model: tensor and pipeline parallelism).

# %%
import matplotlib.pyplot as plt

import lessonlib
from lessonlib import costmodel as cm
from lessonlib import model_parallel as mp
from lessonlib.instruments.claims import every
from lessonlib.data import DATA_DIR
from lessonlib.layer_split import split_summary
from lessonlib.viz import mp as mpviz
from lessonlib.viz import tp as tpviz
from lessonlib.viz.source import show

# %% [markdown]
# ## 1. Prediction: the memory fits, the time does not
#
# GPT-3's model state is 16 bytes per parameter (ZeRO, Rajbhandari et al. 2020, §3.1). Split
# its 96 layers over p GPUs and each holds about 1/p of it. But with one batch going
# through the line, only one stage works at a time: each GPU is idle **(p-1)/p** of the
# step. That is the pipeline *bubble*: with m micro-batches in flight it is (p-1)/(m+p-1) of
# the step (GPipe, Huang et al. 2019, §2.3), and here the one batch is a single micro-batch,
# m = 1. The cost model computes it:

# %%
# NBVAL_CHECK_OUTPUT
gpt3, a100 = cm.MODELS["gpt3-175B"], cm.GPUS["A100-80GB"]
usable = cm.usable_memory_bytes(a100)
print(f"usable per A100-80GB: {usable / 1e9:.0f} GB of its {a100.memory_bytes / 1e9:.0f} GB "
      f"(less the CUDA context and NCCL's buffers)")
print(f"{'p':>3} {'GB per GPU':>11} {'fits':>6} {'idle share':>11}")
fits = {}
for p in (1, 8, 16, 32, 48, 96):
    memory = cm.memory_per_gpu(gpt3, t=1, p=p, b=1, m=1, recompute="full")
    fits[p] = memory.total <= usable
    print(f"{p:>3} {memory.total / 1e9:>11,.1f} {str(fits[p]):>6} "
          f"{cm.bubble_fraction(p, 1):>11.1%}")
p_fit = min(p for p, ok in fits.items() if ok)
print(f"the first p of the table that fits: {p_fit}; at any moment {p_fit - 1} of its "
      f"{p_fit} GPUs wait")

# %% [markdown]
# Move the slider: memory per GPU falls as 1/p (until the embeddings dominate), and the
# idle share climbs towards 1. (The slider accepts any p; where p does not divide the
# layers, some stages hold one layer more, and the cost model sizes every GPU for the
# heaviest, ceil(L/p) layers.)

# %%
tpviz.layer_split_widget()

# %% [markdown]
# At p = 48 the castle fits, and 47 of the 48 GPUs wait at any moment. Now our own castle:
# the course's tiny GPT on the castle corpus, 8 transformer layers plus the embedding and
# the head, cut into 4 stages balanced by parameter count (`lessonlib.layer_split`):
# two transformer layers per stage, the small embedding and head added at the ends. What
# each rank will hold:

# %%
# NBVAL_CHECK_OUTPUT
SETTINGS = dict(model="gpt", layers=8, hidden=64, steps=3, warmup=1, batch=8, lr=0.05, seed=0)
model = mp.make_model("gpt", layers=8, hidden=64)
names = ["embed", *(f"block {i}" for i in range(8)), "head"]
plan = split_summary(model, 4)
for stage in plan:
    print(f"stage {stage.stage}: {', '.join(names[i] for i in stage.layers):<24} "
          f"{stage.params:>7,} parameters = {4 * stage.params:>9,} bytes (fp32)")
print(f"one process: {sum(s.params for s in plan):,} parameters")

# %% [markdown]
# ## 2. The assembly line, for real
#
# `mp.run_assembly_line` checks the settings, then starts 4 ranks. Each builds the full
# model from the same seed, keeps its stage and lets the rest go, and trains 1 warm-up and
# 3 timed SGD steps: receive the activation, forward, send it on; receive the gradient,
# backward, send the input's gradient back (all through `lessonlib.comm`). Every rank
# records when it computed, waited and sent. `mp.single_process` trains the same model on
# the same batches in this one process, as the reference.
#
# Here is the step each rank runs, from `lessonlib.model_parallel`. Each phase is one
# `with record(...)`: the recorder the rank is handed times it (and counts what the forward
# keeps for backward); the step itself holds no clock.

# %%
show(mp.stage_step)

# %%
# NBVAL_IGNORE_OUTPUT
results = mp.run_assembly_line(4, p=4, **SETTINGS)
reference = mp.single_process(**SETTINGS)
print("losses, 4 ranks:   ", [round(x, 4) for x in results[-1].losses])
print("losses, 1 process: ", [round(x, 4) for x in reference.losses])

# %% [markdown]
# Splitting the model must not change what it computes. The parity check compares the
# losses of every step and every weight after the last step:

# %%
# NBVAL_CHECK_OUTPUT
diff = mp.compare_parity(results, reference)
print(f"same losses as one process (to 1e-5):  {diff.loss_max_abs_diff < 1e-5}")
print(f"same weights after 4 steps (to 1e-6):  {diff.weights_max_abs_diff < 1e-6}")

# %% [markdown]
# Now the timeline of the 3 timed steps, one row per rank. Blue is forward, orange
# backward, pink is waiting for a message.

# %%
tpviz.plot_assembly_line(results)
plt.show()

# %% [markdown]
# The staircase is the assembly line: stage 1 cannot start before stage 0 has sent its
# activation, and stage 0's backward waits for the gradient from stage 1. Measured idle
# share of the wall time per rank, against the prediction (p-1)/p:

# %%
# NBVAL_IGNORE_OUTPUT
rows = mp.summarize(results)
for r in rows:
    print(f"stage {r.stage}: worked {r.busy_s * 1e3:6.1f} ms, idle {r.idle_measured:.0%} "
          f"(predicted {r.idle_predicted:.0%} for balanced stages)")

# %% [markdown]
# Timings on a laptop are noisy (here 4 ranks share 2 cores), so single ranks scatter,
# but the idle shares gather around the prediction. And what each rank holds, measured (the parameters it keeps, and the bytes of
# activations autograd stored for its backward pass) next to the plan:

# %%
# NBVAL_CHECK_OUTPUT
for r, stage in zip(rows, plan):
    print(f"stage {r.stage}: parameters {r.param_bytes:>9,} bytes (planned "
          f"{4 * stage.params:>9,}), activations kept {r.stash_bytes:>9,} bytes")
print(f"all stages together: {sum(r.param_bytes for r in rows):,} bytes = "
      f"one process's {reference.param_bytes:,}")

# %%
tpviz.plot_stage_memory(rows, [4 * s.params for s in plan])
plt.show()

# %% [markdown]
# Every boundary carries one activation forward and one gradient back per step, each a
# `(b, s, h)` tensor of fp32 values:

# %%
# NBVAL_CHECK_OUTPUT
shape = mp.boundary_shape("gpt", SETTINGS["batch"], SETTINGS["hidden"])     # (b, s, h)
message = 4 * shape[0] * shape[1] * shape[2]
print(f"one message: {' x '.join(map(str, shape))} fp32 values = {message:,} bytes")
for r in results:
    sent = r.messages.get("send", {"calls": 0, "bytes": 0})
    print(f"stage {r.stage}: {sent['calls']} sends, {sent['bytes']:,} bytes in "
          f"{SETTINGS['steps']} steps")
every("a stage's sends are whole messages", {f"stage {r.stage}": r for r in results},
      lambda r: r.messages.get("send", {"bytes": 0})["bytes"]
      == message * r.messages.get("send", {"calls": 0})["calls"])

# %% [markdown]
# ## 3. Measured against predicted: more rooms, same time
#
# Run the same castle on 2 ranks and compare. If splitting saved time, 4 stages would be
# faster than 2. The prediction says the idle share grows to (p-1)/p instead. One step's
# time, here and in every table and plot below, is the span from its first operation on
# any stage to its last; "ms per step" is the median over the steps (`mp.line_record`):

# %%
# NBVAL_IGNORE_OUTPUT
results_2 = mp.run_assembly_line(2, p=2, **SETTINGS)
this_run = [mp.line_record(results_2), mp.line_record(results)]
print(f"{'p':>2} {'idle predicted':>15} {'idle measured (mean)':>21} {'ms per step':>12}")
for rec in this_run:
    print(f"{rec.p:>2} {rec.idle_predicted:>15.0%} {rec.idle_mean:>21.0%} "
          f"{rec.step_time_s * 1e3:>12.1f}")

# %%
tpviz.plot_assembly_line(results_2, title="the same castle on 2 stages")
plt.show()

# %% [markdown]
# Two values of p make two points. The lab `labs/mp.py` runs the same castle at every p
# from 1 to its world size in one launch: one line of p ranks at a time while the other
# ranks sit out, each run first checked against one process. Its result on this 2-core
# machine is stored in `data/mp_cpu_results.json`. Below, its measurements (circles) and
# this notebook's two runs (diamonds, "this run") over the cost model's lines, for idle
# share, parameter memory and step time:

# %%
# NBVAL_IGNORE_OUTPUT
ROOT = DATA_DIR.parent                  # the course's folder
TABLE = DATA_DIR / "mp_cpu_results.json"
stored = sorted(mpviz.load_table(TABLE), key=lambda r: r["p"])
print(f"{stored[0]['command']}  ({stored[0]['world_size']} {stored[0]['device']} ranks, "
      f"{stored[0]['settings.rounds']} rounds of {stored[0]['settings.steps']} timed steps)")
print(f"{'p':>2} {'idle predicted':>15} {'idle measured (mean)':>21} {'ms per step':>12} "
      f"{'KiB of parameters, per rank':>28}")
for r in stored:
    kib = ", ".join(f"{b / 1024:.0f}" for b in r["param_bytes_per_rank"])
    print(f"{r['p']:>2} {r['idle_predicted']:>15.0%} {r['idle_mean']:>21.0%} "
          f"{r['step_time_s'] * 1e3:>12.1f} {kib:>28}")
mpviz.plot_measured(TABLE, this_run)
plt.show()
one_rank = next(r["step_time_s"] for r in stored if r["p"] == 1)
whole = sum(stored[0]["param_bytes_per_rank"])
split = {f"p={r['p']}": r for r in stored if r["p"] > 1}
every("the stages together hold the whole model, the heaviest on or above the whole / p",
      split, lambda r: sum(r["param_bytes_per_rank"]) == whole
      and max(r["param_bytes_per_rank"]) * r["p"] >= whole)
every(f"a step takes at least the one-rank time ({one_rank * 1e3:.1f} ms), not that time / p",
      split, lambda r: r["step_time_s"] >= one_rank)

# %% [markdown]
# The idle share climbs along (p-1)/p, and the parameters per rank follow the balanced split:
# together the stages hold the whole model, but not in equal parts, since the layers do not
# cut evenly (at p = 3 one rank holds less than the whole / p, another more; the first
# check above). The step time never falls towards the one-rank time / p (the second check):
# it stays above the one-rank time, by the messages between stages, which on CPU ranks
# sharing two cores cost milliseconds each. The grey line is the one-rank time alone; the
# cost model has no message term for CPU ranks, so the gap above it is what the messages
# cost. Memory divides, time does not. (Single ranks scatter because the cores are shared.)
#
# Measure it yourself: the widget runs the assembly line for real at the slider's p (a
# small MLP, two timed steps) and draws each rank's idle share over (p-1)/p, with the
# timeline of the line. (Executed headless, it draws once, at p = 3.)

# %%
# NBVAL_IGNORE_OUTPUT
from lessonlib.viz import live

live.assembly_line_widget()

# %% [markdown]
# <!-- no measured claim: "above" points at the cell with the stored table -->
# **Instructors:** to draw your cluster's numbers instead, run
# `torchrun --nproc-per-node 8 labs/mp.py --json results/mp.json` (or
# `python labs/mp.py --world-size 8 --json results/mp.json` on CPU ranks) from the
# course's root, then set `TABLE = ROOT / "results" / "mp.json"` in the cell above and run
# it again. A folder of such files written by `labs/sweep.py` draws the same way.

# %% [markdown]
# <div style="border: 2px solid #4C72B0; border-radius: 6px; padding: 10px;">
# <b>Takeaway.</b> Splitting a model by layers divides its memory: each rank holds only
# its rooms, their parameters and their activations. It does not divide time: the stages
# run one after another, so each rank is idle about (p-1)/p of the step (75 % at p = 4,
# nearly all of it for GPT-3 split until it fits), and the messages between stages come on
# top. Lesson 04 keeps
# the rooms but fixes the idling twice over: split each layer across builders (tensor
# parallelism), or feed the line with many small batches (pipeline parallelism).
# </div>
#
# ## Exercises
#
# **1.** Write `my_split(n_layers, p)`: p lists of consecutive layer indices, covering
# 0..n_layers-1 in order, with stage sizes that differ by at most one layer.

# %%
from lessonlib.exercises import tp as ex


def my_split(n_layers, p):
    raise NotImplementedError


ex.check_stage_split(my_split)

# %% tags=["solution", "hide-input", "hide-output"] jupyter={"outputs_hidden": true, "source_hidden": true}
# Solution (click to open)
# NBVAL_CHECK_OUTPUT
def split_solution(n_layers, p):
    base, extra = divmod(n_layers, p)
    stages, start = [], 0
    for s in range(p):
        size = base + (1 if s < extra else 0)
        stages.append(list(range(start, start + size)))
        start += size
    return stages


ex.check_stage_split(split_solution)

# %% [markdown]
# **2.** Measure the idle share yourself. Write `my_idle_share(timeline, wall)`: the share
# of `wall` seconds in which the rank did no work. A timeline is a list of spans with
# `.kind`, `.start` and `.end`; working spans are `"F"`, `"B"` and `"OPT"`. The checker runs
# it on the 4-rank timelines measured above.

# %%
def my_idle_share(timeline, wall):
    raise NotImplementedError


ex.check_idle_share(my_idle_share, results)

# %% tags=["solution", "hide-input", "hide-output"] jupyter={"outputs_hidden": true, "source_hidden": true}
# Solution (click to open)
# NBVAL_CHECK_OUTPUT
def idle_share_solution(timeline, wall):
    busy = sum(s.end - s.start for s in timeline if s.kind in ("F", "B", "OPT"))
    return 1 - busy / wall


ex.check_idle_share(idle_share_solution, results)

# %% [markdown]
# **3.** The split above balances *parameters*, a proxy for compute, and the proxy can be
# wrong: an embedding has many parameters but its forward is a table lookup, and attention's
# cost grows with s without a single parameter. Say a cut by parameters leaves the last
# stage (it also computes the head and the loss) the slowest: per step, stages 0, 1 and 2
# compute 1 ms each (forward and backward together) and stage 3 computes 3 ms. Messages are
# free. What share of the step is **stage 0** idle? Think before you answer: is it still
# (p-1)/p?

# %%
my_idle = None      # a share between 0 and 1
ex.check_unbalanced_idle(my_idle, stage_ms=(1, 1, 1, 3), stage=0)

# %% tags=["solution", "hide-input", "hide-output"] jupyter={"outputs_hidden": true, "source_hidden": true}
# Solution (click to open)
# NBVAL_CHECK_OUTPUT
stage_ms_solution = (1, 1, 1, 3)        # one batch visits the stages one after another
idle_solution = 1 - stage_ms_solution[0] / sum(stage_ms_solution)
ex.check_unbalanced_idle(idle_solution, stage_ms=(1, 1, 1, 3), stage=0)
