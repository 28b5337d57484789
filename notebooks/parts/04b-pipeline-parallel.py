# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# ## Part 2 · Pipeline parallelism: the assembly line with micro-batches
#
# **The assembly line.** In lesson 03 the castle was cut by floors: builder 0 builds the
# ground floor of the whole order, passes it up, and waits while builder 1 builds the next
# floor. Only one builder works at a time; with p builders each one idles (p-1)/p of the
# time. GPipe (Huang et al. 2019) cuts the order into **m micro-batches**: while builder 1
# works on micro-batch 0, builder 0 already starts micro-batch 1. The line still has to fill
# at the start and drain at the end, and that idle time is the **bubble**.
#
# The popular claim that the 1F1B schedule "shrinks the bubble" is wrong: it keeps the
# bubble and cuts the **memory** (the activations each stage holds for its backward pass).
# This part predicts both, runs both on real ranks, and measures both.
#
# Plan: schedules as data -> a prediction from the cost model -> a real run on 2 ranks ->
# measured against predicted -> takeaway -> exercises.

# %%
import matplotlib.pyplot as plt

import lessonlib
from lessonlib import costmodel as cm
from lessonlib.pipeline import runs
from lessonlib.pipeline import schedules as S
from lessonlib.pipeline.validate import ScheduleError, simulate
from lessonlib.viz import pipeline as vp

# %% [markdown]
# ### 2.1 A schedule is data
#
# A pipeline schedule is, for every stage, the order of its forwards `F<i>` and backwards
# `B<i>` of the micro-batches `i`. GPipe runs all forwards, then all backwards. 1F1B
# (PipeDream-Flush, Narayanan et al. 2021) lets stage `s` run `p - s - 1` warm-up
# forwards, then alternates one forward and one backward, then drains the backwards.
# Here are both for p = 4 stages and m = 6 micro-batches, straight from `lessonlib.pipeline`:

# %%
# NBVAL_CHECK_OUTPUT
print("GPipe\n" + S.describe(S.gpipe(4, 6)))
print("\n1F1B\n" + S.describe(S.one_f_one_b(4, 6)))

# %% [markdown]
# Each F and B comes with its messages: the forward of micro-batch `i` on stage 1 first
# receives stage 0's output (`RECV_F`) and then sends its own to stage 2 (`SEND_F`); the
# backward receives a gradient from stage 2 and sends one to stage 0. Stage 1's full list:

# %%
# NBVAL_CHECK_OUTPUT
print(" ".join(str(a) for a in S.one_f_one_b(4, 6)[1]))

# %% [markdown]
# Because the schedule is data, it can be checked before any process starts. The validator
# plays it as a simulation (sends never wait, a receive waits for its message) and rejects
# what cannot run, naming the stage and the action. Mixing the two schedules (GPipe's order
# on stage 1, 1F1B's on the others) deadlocks:

# %%
# NBVAL_CHECK_OUTPUT
orders = [S.one_f_one_b_order(4, 6, s) for s in range(4)]
orders[1] = S.compute_only(S.gpipe(4, 6)[1])
try:
    simulate(S.add_communication(orders))
except ScheduleError as err:
    print(err)

# %% [markdown]
# ### 2.2 The prediction: the same bubble, different memory
#
# With p balanced stages, both schedules leave each stage idle for p-1 slots of one
# micro-batch's forward + backward. Two papers write that one fact two ways, so every number
# below says which:
#
# * share of the step's **wall** time: `(p-1)/(m+p-1)` (GPipe §2.3);
# * relative to the **ideal** (bubble-free) compute time: `(p-1)/m` (Megatron-LM 2021 §2.2);
#   interleaving v model chunks per device divides it by v: `(p-1)/(v·m)`.
#
# Memory is where the schedules differ: GPipe's stages all hold m micro-batches of
# activations at the peak, 1F1B's stage `s` holds `min(p - s, m)` (PipeDream-Flush §3.2).
# The cost model (`lessonlib.costmodel`) and the simulated schedules agree:

# %%
# NBVAL_CHECK_OUTPUT
print(f"{'p':>2} {'m':>3} {'wall (GPipe)':>13} {'ideal (Megatron)':>17} {'simulated GPipe':>16} "
      f"{'simulated 1F1B':>15}   stash GPipe / 1F1B per stage")
for p, m in ((2, 2), (2, 4), (2, 8), (4, 8)):
    gp, ofob = simulate(S.gpipe(p, m)), simulate(S.one_f_one_b(p, m))
    print(f"{p:>2} {m:>3} {cm.bubble_fraction(p, m, convention='wall'):>13.1%} "
          f"{cm.bubble_fraction(p, m, convention='ideal'):>17.1%} {gp.bubble[0]:>16.1%} "
          f"{ofob.bubble[0]:>15.1%}   {gp.peak_stash} / {ofob.peak_stash}")

# %% [markdown]
# The theoretical charts for p = 4, m = 8 (forward 1 time unit, backward 2): the same
# length, the same pale red bubble, but 1F1B starts backwards early, so a micro-batch's
# activations are freed sooner.

# %%
fig, axes = plt.subplots(2, 1, figsize=(10, 4.6), constrained_layout=True)
vp.gantt_schedule("gpipe", 4, 8, ax=axes[0])
vp.gantt_schedule("1f1b", 4, 8, ax=axes[1])
plt.show()

# %% [markdown]
# ### 2.3 The real run
#
# Two ranks, one stage each, one compute thread each (so the stages do not share a core).
# The model is an `mlp_stack` of 16 equal Linear + GeLU layers of width 1024, cut into 2
# balanced stages of 8 layers; a micro-batch is 128 rows. Every stage does the same matmul
# work per micro-batch (stage 0 also computes the gradient of its input, as every later
# stage must), and that work is large next to a message: a boundary activation is 128 x
# 1024 floats (512 KiB), a forward through a stage 8 matmuls of 128 x 1024 x 1024.
# lessonlib's `PipelineExecutor` runs GPipe, 1F1B and interleaved 1F1B (v = 2) for
# m = 2, 4, 8. Every rank records a timeline of each step (start and end of every F, B,
# send and wait for a message) and counts what autograd saved for its backward.
# (`labs/pp.py` runs the same measurement against PyTorch's own `ScheduleGPipe` /
# `Schedule1F1B` on the same stages and compares the step times.)

# %%
# NBVAL_IGNORE_OUTPUT
measured = lessonlib.launch(runs.measure, 2, ms=(2, 4, 8), engines=("lessonlib",),
                            schedules=("gpipe", "1f1b", "interleaved"), steps=5, warmup=1)
rows = runs.summarize(measured)
print(f"{len(rows)} cases measured, median step times from "
      f"{min(r['step_time_s'] for r in rows) * 1e3:.0f} to "
      f"{max(r['step_time_s'] for r in rows) * 1e3:.0f} ms")

# %% [markdown]
# First, the proof that a pipeline trains the same model: a tiny GPT, cut into 2 stages
# (4 virtual stages when interleaved), trained 2 SGD steps with every schedule, compared
# with the same model trained on the whole batch in one process. The loss of each
# micro-batch is divided by m before its backward, so the gradients summed over the
# micro-batches are those of the whole batch's mean loss.

# %%
# NBVAL_CHECK_OUTPUT
report = runs.parity_report(lessonlib.launch(runs.parity, 2, runs.parity_cases(2)))
for r in report:
    same = max(r["max_grads_diff"], r["max_weights_diff"], r["max_losses_diff"]) < 1e-5
    print(f"{r['engine']:>9} {r['schedule']:>11} m={r['m']} v={r['v']}: gradients, weights "
          f"and losses equal one process: {same}")

# %% [markdown]
# ### 2.4 Measured against predicted
#
# The median step of GPipe and of 1F1B with m = 4, each measured chart under its
# theoretical one. Rows are the two ranks; blue forwards, green backwards, hatched grey
# the time a rank waits for a message, pale red the idle time.

# %%
for name in ("gpipe", "1f1b"):
    case = ("lessonlib", name, 4, 1)
    step = runs.median_step(measured, case)
    row = next(r for r in rows if (r["engine"], r["schedule"], r["m"], r["v"]) == case)
    vp.gantt_pair(name, [r.spans for r in step], 2, 4, bubble=row["bubble_per_stage"])
    plt.show()

# %% [markdown]
# The bubble of every run, as a share of the step's wall time, next to the theory
# `(p-1)/(v·m+p-1)` (the same convention; Megatron's `(p-1)/(v·m)` of ideal time for
# reference). Step times are the median of 5 steps on whatever else this machine is doing.

# %%
# NBVAL_IGNORE_OUTPUT
print(f"{'engine':>9} {'schedule':>11} {'m':>2} {'v':>2} {'step ms':>8} {'bubble (wall)':>14} "
      f"{'theory (wall)':>14} {'difference':>11} {'theory (ideal)':>15}")
for r in rows:
    print(f"{r['engine']:>9} {r['schedule']:>11} {r['m']:>2} {r['v']:>2} "
          f"{r['step_time_s'] * 1e3:>8.1f} {r['bubble_mean']:>14.1%} "
          f"{r['bubble_theory_wall']:>14.1%} {r['bubble_mean'] - r['bubble_theory_wall']:>+11.1%} "
          f"{r['bubble_theory_ideal']:>15.1%}")

# %% [markdown]
# Where the measured bubble is off the theory, the timeline says why. The formula assumes
# equal stages and free messages. Below, the median step's measured times are fed back into
# the schedule simulation: first only the forwards and backwards of each stage (stages that
# ran at different speeds: the last one adds the loss, and on a shared machine one rank may
# get less of its core than the other), then also the time each send kept its stage busy.
# On CPU ranks a message is copied through the operating system by the sending process, and
# in a pipeline the receiver is usually already waiting, so that copy sits on the critical
# path, twice per micro-batch in the 1F1B steady state; what remains after both is the
# transfer latency a receiver waits for and per-action overhead. Interleaving doubles the messages
# per micro-batch and halves the work between them, which is why it gains least here.
# A measured bubble *below* the theory has the opposite cause: the forwards and backwards
# themselves ran slower while both ranks were busy (they share the machine's cores and
# memory bandwidth), which the formula does not know about either.

# %%
# NBVAL_IGNORE_OUTPUT
def percent(values):
    return "[" + ", ".join(f"{x:.1%}" for x in values) + "]"


for name, m in (("gpipe", 8), ("1f1b", 8), ("interleaved", 8)):
    why = runs.explain_bubble(measured, ("lessonlib", name, m, 2 if name == "interleaved" else 1))
    print(f"{name} m={m}: per stage F {[round(x, 1) for x in why['forward_ms']]} ms, "
          f"B {[round(x, 1) for x in why['backward_ms']]} ms, "
          f"send {[round(x, 1) for x in why['send_ms']]} ms (medians)")
    print(f"   bubble of wall time: theory {why['theory']:.1%} | simulated with measured F, B "
          f"{percent(why['simulated_with_measured_compute'])} | with the sends too "
          f"{percent(why['simulated_with_measured_compute_and_sends'])} | measured "
          f"{percent(why['measured'])}")

# %% [markdown]
# Memory is exact, not statistical: the number of micro-batches whose activations a stage
# held at once, counted from what autograd saved (the lab puts the same meter on PyTorch's
# stages):

# %%
# NBVAL_CHECK_OUTPUT
for r in rows:
    if r["schedule"] != "interleaved":
        print(f"{r['engine']:>9} {r['schedule']:>5} m={r['m']}: held per stage "
              f"{r['peak_stash_per_stage']}, predicted {r['peak_stash_theory']}: "
              f"{r['peak_stash_per_stage'] == r['peak_stash_theory']}")

# %%
# NBVAL_IGNORE_OUTPUT
for r in rows:
    if r["engine"] == "lessonlib":
        print(f"{r['schedule']:>11} m={r['m']}: MiB saved for backward per stage "
              f"{[round(b / 2 ** 20, 1) for b in r['peak_stash_bytes_per_stage']]}")

# %% [markdown]
# The finding in one picture: per m, GPipe and 1F1B leave the same share of the step idle,
# while 1F1B's first stage holds 2 micro-batches of activations whatever m is, and GPipe's
# holds all m.

# %%
vp.bubble_and_memory(rows)
plt.show()

# %% [markdown]
# Explore the prediction: p stages, m micro-batches, v chunks per device for interleaved
# 1F1B. Left, the bubble in both conventions against m (measured points where p matches);
# right, the activations each stage holds at its peak (measured marks where p and m match).
# The chart below the widget is the default view, stored with the notebook.

# %%
vp.widget(measured=rows)

# %%
vp.explore(2, 8, 2, measured=rows)
plt.show()

# %% [markdown]
# <div style="border: 2px solid #4c72b0; border-radius: 6px; padding: 10px 14px;">
# <b>Takeaway.</b> A pipeline idles (p-1)/(m+p-1) of its wall time: more micro-batches
# shrink the bubble, interleaving v chunks per device shrinks it v-fold at v times the
# messages. 1F1B does <i>not</i> shrink the bubble; it caps each stage's activations at
# min(p - stage, m) micro-batches instead of GPipe's m, which is what lets m grow. Both
# were measured here on real ranks, and PyTorch's own schedules train the same model to the
# same gradients.
# </div>
#
# ### Exercises
#
# **1.** Write stage 1's compute order under 1F1B for p = 4 stages and m = 6 micro-batches,
# as a string like `"F0 F1 B0 ..."`. The checker runs it with the other stages' 1F1B
# orders through the validator and the simulation.

# %%
from lessonlib.exercises import pipeline as ex

my_order = None
ex.check_1f1b_order(my_order, p=4, m=6, stage=1)

# %% tags=["solution", "hide-input"] jupyter={"source_hidden": true}
# NBVAL_CHECK_OUTPUT
my_order = "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5"
assert ex.check_1f1b_order(my_order, p=4, m=6, stage=1)

# %% [markdown]
# **2.** Write `bubble(p, m)`: the idle share of the step's wall time for p balanced stages
# and m micro-batches. The checker compares it with the simulated GPipe schedule.

# %%
def bubble(p, m):
    return None


ex.check_bubble(bubble)

# %% tags=["solution", "hide-input"] jupyter={"source_hidden": true}
# NBVAL_CHECK_OUTPUT
def bubble(p, m):
    return (p - 1) / (m + p - 1)


assert ex.check_bubble(bubble)

# %% [markdown]
# **3.** A model is cut into p = 8 stages. What is the smallest number of micro-batches that
# brings the bubble to 10 % of the wall time or less?

# %%
my_m = None
ex.check_min_microbatches(my_m, p=8, target=0.1) if my_m is not None else print("fill in my_m")

# %% tags=["solution", "hide-input"] jupyter={"source_hidden": true}
# NBVAL_CHECK_OUTPUT
my_m = next(m for m in range(1, 1000) if cm.bubble_fraction(8, m, convention="wall") <= 0.1)
assert ex.check_min_microbatches(my_m, p=8, target=0.1)
