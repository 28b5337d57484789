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
# # 09 · Deep dive: interleaved schedules
#
# This deep dive extends Part 2 of [04 · Tensor vs pipeline
# parallelism](04-tensor-vs-pipeline.ipynb), where GPipe and 1F1B left the same bubble,
# (p-1)/(m+p-1) of the step. Megatron-LM 2021 (Narayanan et al., SC21, §2.2.2) shrinks it
# further by giving each device **v model chunks** instead of one contiguous stage: the
# interleaved 1F1B schedule. Here we predict what that buys and costs, check that it trains
# the same model, measure it on real ranks, and compare with PyTorch's own schedules. Then
# (§6) the schedules that go further by splitting each backward in two: ZB-H1 and the
# V-shaped ZBV (Qi et al., ICLR 2024).
#
# The same plan as a core lesson: the idea -> a prediction -> a real run -> measured against
# predicted -> a takeaway -> an exercise. About 33 minutes to read, code and outputs included.
# <!-- numbers: 33 because it is the reading time: markdown words / 200 + code lines / 10 + output lines / 20 -->

# %%
import json
from pathlib import Path

import matplotlib.pyplot as plt

import lessonlib
from lessonlib import costmodel as cm
from lessonlib.pipeline import schedule_runs
from lessonlib.pipeline import schedules as S
from lessonlib.pipeline.actions import describe
from lessonlib.pipeline.validate import replay, simulate
from lessonlib.viz import pipeline as vp

# %% [markdown]
# ## 1. The idea: v chunks per device
#
# **The assembly line.** Instead of one run of floors, each builder takes v shorter runs
# spread over the castle: with p = 2 builders and v = 2, builder 0 builds floors 1 and 3,
# builder 1 floors 2 and 4. A micro-batch now visits each builder v times. Each visit is v
# times shorter, so the line fills and drains v times faster; the price is more
# hand-overs: a micro-batch crosses p·v - 1 boundaries instead of p - 1, about v times as
# many.
#
# In the model: cut it into p·v *virtual stages*; device d holds virtual stages d, d+p, ...,
# d+(v-1)p (`lessonlib.pipeline.stages.device_chunks`). The schedule names each chunk's
# work: `F0c1` is the forward of micro-batch 0 through the device's chunk 1. It needs m to
# be a multiple of p (the micro-batches go round the devices in groups of p). For p = 2,
# m = 4, v = 2, from `lessonlib.pipeline`:

# %%
# NBVAL_CHECK_OUTPUT
print(describe(S.interleaved_one_f_one_b(2, 4, 2)))

# %% [markdown]
# Every F and B comes with its messages. Under plain 1F1B the forward of micro-batch `i` on
# stage 1 of 4 first receives stage 0's output (`RECV_F`) and then sends its own to stage 2
# (`SEND_F`); the backward receives a gradient from stage 2 and sends one to stage 0. Stage
# 1's full list for p = 4, m = 6, then the sends per device, plain against interleaved
# ((p·v - 1)/(p - 1) times as many in all: 3 at p = 2, 7/3 at p = 4):

# %%
# NBVAL_CHECK_OUTPUT
print(" ".join(str(a) for a in S.one_f_one_b(4, 6)[1]))
for p, m in ((2, 4), (4, 8)):
    plain, inter = S.one_f_one_b(p, m), S.interleaved_one_f_one_b(p, m, 2)
    sends = [[sum(str(a).startswith("SEND") for a in stage) for stage in s] for s in (plain, inter)]
    print(f"p={p}, m={m}: sends per device, 1F1B {sends[0]}, interleaved v=2 {sends[1]}")

# %% [markdown]
# ## 2. The prediction: v times less bubble, v times the messages
#
# Each chunk's forward and backward take 1/v of a stage's, so the p-1 idle slots while the
# line fills and drains are v times shorter: `(p-1)/(v·m)` of the ideal compute time
# (Megatron-LM 2021 §2.2.2), `(p-1)/(v·m+p-1)` of the wall time. The schedule simulation
# (forward 1/v, backward 2/v time units per chunk) agrees; it also counts the activations
# a device holds at its peak, in (micro-batch, chunk) units, which the last column turns
# into micro-batches' worth (divided by v):

# %%
# NBVAL_CHECK_OUTPUT
print(f"{'p':>2} {'m':>2} {'v':>2} {'wall (p-1)/(vm+p-1)':>20} {'ideal (p-1)/(vm)':>17} "
      f"{'simulated (wall)':>17}   peak stash per device")
for p, m, v in ((2, 4, 1), (2, 4, 2), (2, 8, 2), (4, 8, 1), (4, 8, 2), (4, 8, 4)):
    sim = simulate(S.make("interleaved" if v > 1 else "1f1b", p=p, m=m, v=v), forward=1 / v,
                   backward=2 / v)
    print(f"{p:>2} {m:>2} {v:>2} {cm.bubble_fraction(p, m, v, convention='wall'):>20.1%} "
          f"{cm.bubble_fraction(p, m, v, convention='ideal'):>17.1%} {sim.bubble[0]:>17.1%}   "
          f"{[n / v for n in sim.peak_stash]}")

# %% [markdown]
# Interleaving does not come for free in memory either: its first device holds a little
# more than 1F1B's p micro-batches' worth (Korthikanti et al. 2022 count the factor
# 1 + (p-1)/(p·v)). The theoretical charts for p = 4, m = 8 (forward 1 time unit,
# backward 2, split over the chunks; paler bars are chunk 1): GPipe and 1F1B have the same
# length and the same pale red bubble, interleaving shortens both ends.

# %%
fig, axes = plt.subplots(3, 1, figsize=(10, 6.8), constrained_layout=True, sharex=True)
vp.gantt_schedule("gpipe", 4, 8, ax=axes[0])
vp.gantt_schedule("1f1b", 4, 8, ax=axes[1])
vp.gantt_schedule("interleaved", p=4, m=8, v=2, ax=axes[2])
plt.show()

# %% [markdown]
# ## 3. The real run
#
# First the proof that interleaving trains the same model: the tiny GPT of notebook 04, cut
# into 4 virtual stages on 2 ranks, trained 2 SGD steps, against the same model on the whole
# batch in one process (each micro-batch's loss divided by m).

# %%
# NBVAL_CHECK_OUTPUT
cases = [c for c in schedule_runs.parity_cases(2) if c[1] == "interleaved"]
report = schedule_runs.compare_parity(lessonlib.launch(schedule_runs.rank_parity, 2, cases))
for r in report:
    same = max(r.max_grads_diff, r.max_weights_diff, r.max_losses_diff) < 1e-5
    print(f"{r.engine:>9} {r.schedule:>11} m={r.m} v={r.v}: gradients, weights "
          f"and losses equal one process: {same}")

# %% [markdown]
# Then the measurement, on the stages of notebook 04: 2 ranks, one compute thread each, an
# `mlp_stack` of Linear + GeLU layers (2 stages, or 4 chunks when interleaved; the cell
# prints their width and the micro-batch's rows); 1F1B and interleaved 1F1B (v = 2) for
# m = 2, 4, 8.

# %%
# NBVAL_IGNORE_OUTPUT
WIDTH, LAYERS_PER_STAGE, MICRO = 1024, 8, 32     # the stages' layers; rows per micro-batch
measured = lessonlib.launch(schedule_runs.measure, 2, ms=(2, 4, 8), engines=("lessonlib",),
                            schedules=("1f1b", "interleaved"), width=WIDTH,
                            layers_per_stage=LAYERS_PER_STAGE, micro=MICRO, steps=3, warmup=1,
                            timeout=300)
rows = schedule_runs.summarize(measured)
print(f"{2 * LAYERS_PER_STAGE} layers of width {WIDTH}, micro-batches of {MICRO} rows: "
      f"{len(rows)} cases measured, median step times from "
      f"{min(r.step_time_s for r in rows) * 1e3:.0f} to "
      f"{max(r.step_time_s for r in rows) * 1e3:.0f} ms")

# %% [markdown]
# ## 4. Measured against predicted
#
# The median interleaved step with m = 4 under its theoretical chart:

# %%
step = schedule_runs.median_step(measured, ("lessonlib", "interleaved", 4, 2))
row = next(r for r in rows if (r.schedule, r.m) == ("interleaved", 4))
vp.gantt_pair("interleaved", [r.spans for r in step], p=2, m=4, v=2,
              bubble=row.bubble_per_stage)
plt.show()

# %% [markdown]
# The bubble of every run as a share of the step's wall time, next to `(p-1)/(v·m+p-1)`
# (Megatron's `(p-1)/(v·m)` of ideal time for reference). Step times are the median of 3
# steps on whatever else this machine is doing; the last line sets each interleaved step
# time over 1F1B's at the same m.

# %%
# NBVAL_IGNORE_OUTPUT
print(f"{'schedule':>11} {'m':>2} {'v':>2} {'step ms':>8} {'bubble (wall)':>14} "
      f"{'theory (wall)':>14} {'difference':>11} {'theory (ideal)':>15}")
for r in rows:
    print(f"{r.schedule:>11} {r.m:>2} {r.v:>2} {r.step_time_s * 1e3:>8.1f} "
          f"{r.bubble_mean:>14.1%} {r.bubble_theory_wall:>14.1%} "
          f"{r.bubble_mean - r.bubble_theory_wall:>+11.1%} "
          f"{r.bubble_theory_ideal:>15.1%}")
step_ms = {(r.schedule, r.m): r.step_time_s for r in rows}
ratio = {m: step_ms["interleaved", m] / step_ms["1f1b", m] for m in (2, 4, 8)}
slower = [m for m, x in ratio.items() if x > 1]
print("interleaved step / 1F1B step: " + ", ".join(f"m={m} {x:.2f}" for m, x in ratio.items())
      + (f"; slower than 1F1B at m = {', '.join(map(str, slower))}" if slower
         else "; faster than 1F1B at every m"))

# %% [markdown]
# <!-- no measured claim: the line above states this run's comparison, computed from the table -->
# Halving the theoretical bubble does not halve the step. Each micro-batch now crosses 3
# boundaries instead of 1 and does half the work between two messages, and on CPU ranks the
# sender copies each message on the critical path. What interleaving saves in bubble,
# (p-1)/(m+p-1) - (p-1)/(2m+p-1) of the step, shrinks as m grows; what its messages cost per
# micro-batch does not. Where the last line's ratio is above 1, interleaving made this run's
# step longer (the deep dive [11 · laptop measurements](11-deep-dive-laptop-measurements.ipynb)
# takes the measured bubble apart).

# %% [markdown]
# Memory, from what autograd saved for the backward: micro-batch-chunks held at once per
# stage (interleaved: against the simulated schedule) and the bytes they take.

# %%
# NBVAL_IGNORE_OUTPUT
for r in rows:
    print(f"{r.schedule:>11} m={r.m}: held per stage {r.peak_stash_per_stage} "
          f"(predicted {r.peak_stash_theory}), MiB saved for backward per stage "
          f"{[round(b / 2 ** 20, 1) for b in r.peak_stash_bytes_per_stage]}")

# %% [markdown]
# <!-- no measured claim: "below" points at the stored default view of the widget -->
# Explore the prediction: p stages, m micro-batches, v chunks per device. Left, the bubble
# in both conventions against m (measured points where p matches); right, the activations
# each stage holds at its peak (measured marks where p and m match). The chart below the
# widget is the default view, stored with the notebook.

# %%
vp.widget(measured=rows)

# %%
vp.explore(2, 8, 2, measured=rows)
plt.show()

# %% [markdown]
# ## 5. PyTorch's own schedules
#
# `torch.distributed.pipelining` ships the same schedules as classes: `ScheduleGPipe`,
# `Schedule1F1B`, `ScheduleInterleaved1F1B`, `ScheduleLoopedBFS`, and the zero-bubble
# schedules of §6 (`ScheduleInterleavedZeroBubble`, `ScheduleZBVZeroBubble`). Notebook 04 trained the same model with its
# GPipe and 1F1B to the same gradients as lessonlib's. `labs/pp.py` also times them on the
# stages above, step by step in turn; its result on a 2-core CPU machine, stored with the
# command that made it:

# %%
# NBVAL_IGNORE_OUTPUT
DATA = Path(lessonlib.__file__).resolve().parent.parent / "data"
lab = json.loads((DATA / "pp_cpu_results.json").read_text())
print(lab["command"])
for schedule, ratios in lab["ratio_lessonlib_over_torch"].items():
    print(f"{schedule:>5}: lessonlib's step time / PyTorch's: " + ", ".join(
        f"{m} {ratio:.2f}" for m, ratio in ratios.items()))

# %% [markdown]
# ## 6. Zero bubble: split the backward, fill the bubble
#
# Interleaving shrinks the bubble by making each hop shorter. Qi et al. ("Zero Bubble
# Pipeline Parallelism", ICLR 2024) attack the hop itself. A stage's backward computes two
# things: the gradient with respect to its **input** (**B**), which the previous stage is
# waiting for, and the gradient with respect to its **weights** (**W**), which nobody waits
# for. Send B upstream at once, keep what W needs, and run W whenever the stage would
# otherwise be idle. lessonlib's executor asks autograd for the input gradient only (and
# for each weight-owning layer's output gradient), keeping the graph; W then takes each
# layer's weight gradient from what was kept, the pattern of PyTorch's
# `pipelining/_backward.py`:

# %%
from lessonlib.pipeline import split_backward, zero_bubble
from lessonlib.viz.source import show

show(split_backward.input_grad)

# %%
show(split_backward.weight_grad)

# %% [markdown]
# The executor runs a schedule's actions in order, one handler per kind; its B and W are the
# two halves above, called on what the forward kept for that micro-batch and chunk:

# %%
from lessonlib.pipeline.executor import PipelineExecutor

show(PipelineExecutor.step, PipelineExecutor._backward, PipelineExecutor._weight)

# %% [markdown]
# **ZB-H1** keeps 1F1B's forwards and B's in 1F1B's order; stage s holds back s of its W's
# to fill the end of the step. Per stage it leaves `(p-1)(T_F + T_B - T_W)` of idle time,
# 1F1B `(p-1)(T_F + T_B + T_W)` (Table 2), at the same peak memory (a micro-batch is held
# until its W). **ZBV** (Qi et al. §6, "ZB-V") gives each device two half-size chunks in a V
# (device d runs virtual stages d and 2p-1-d), so the gradient turns round on the last
# device without a message. Its order, the one PyTorch's `ScheduleZBVZeroBubble` builds:
# forwards of chunk 0, then of both chunks, then per micro-batch F B W of chunk 0 and F B W
# of chunk 1, and in the cool-down the W's held back to fill the waits. As pure functions:

# %%
show(zero_bubble.zero_bubble_h1_order)

# %%
show(zero_bubble.zbv_order)

# %% [markdown]
# The prediction, simulated with T_F = T_B = T_W (1F1B and interleaved run B and W as one
# backward of twice the time): idle time per stage, bubble as a share of the ideal time,
# micro-batches held at the peak.

# %%
# NBVAL_CHECK_OUTPUT
p, m = 4, 8
print(f"{'schedule':>17} {'idle per stage':>15} {'bubble (ideal)':>15} {'cost model':>11} "
      f"{'peak (micro-batches)':>21}")
for name, v, times in (("1f1b", 1, dict(forward=1, backward=2)),
                       ("interleaved", 2, dict(forward=0.5, backward=1)),
                       ("zb-h1", 1, dict(forward=1, backward=1, weight=1)),
                       ("zbv", 2, dict(forward=0.5, backward=0.5, weight=0.5))):
    sim = simulate(S.make(name, p=p, m=m, v=v), **times)
    model = schedule_runs.theory(name, p=p, m=m, v=v, convention="ideal")
    print(f"{vp.NAMES[name]:>17} {sim.idle[0]:>15.2f} {sim.bubble_ideal[0]:>15.1%} "
          f"{model:>11.1%} {max(sim.peak_stash) / v:>21.1f}")
print(f"ZB-H1 formula (p-1)(T_F + T_B - T_W) = {(p - 1) * (1 + 1 - 1)}; ZBV's start-up, "
      f"(p-1) chunk forwards = {(p - 1) * 0.5}")

# %%
fig, axes = plt.subplots(2, 1, figsize=(10, 4.6), constrained_layout=True)
vp.gantt_schedule("zb-h1", 4, 8, ax=axes[0])
vp.gantt_schedule("zbv", 4, 8, ax=axes[1])
plt.show()
from lessonlib.instruments.claims import claim, every

M_MAX = 8 * p                   # the largest m simulated below
chunk = dict(forward=0.5, backward=0.5, weight=0.5)      # a chunk forward takes 0.5
zbv_idle = {mm: max(simulate(zero_bubble.zbv(p, mm), **chunk).idle) / 0.5 for mm in range(1, M_MAX + 1)}
one_idle = {mm: simulate(S.one_f_one_b(p, mm), forward=1, backward=2).idle[0] / 0.5
            for mm in range(2 * p - 1, M_MAX + 1)}      # in chunk forwards too
every(f"at equal times (p = {p}) ZBV idles max(p-1, 2(2p-1-m)) chunk forwards at m",
      {mm: (x, max(p - 1, 2 * (2 * p - 1 - mm))) for mm, x in zbv_idle.items()},
      lambda x: abs(x[0] - x[1]) < 1e-9)
every(f"from m = 2p-1 on, that is the start-up alone, p-1 = {p - 1} chunk forwards, a sixth "
      f"of 1F1B's idle time, at m", {mm: (zbv_idle[mm], x) for mm, x in one_idle.items()},
      lambda x: abs(x[0] - (p - 1)) < 1e-9 and abs(x[1] - 6 * x[0]) < 1e-9)

# %% [markdown]
# ZBV's remaining idle time is the start-up alone: device p-1 cannot begin before micro-batch
# 0 has passed p-1 half-size chunks, and every device has the same work, so each idles at
# least (p-1) chunk forwards. No step that starts from an empty pipeline does better (the
# paper's "zero" also overlaps it with the previous step's end, by not synchronising before
# the optimizer step). ZBV reaches that bound, a sixth of 1F1B's bubble, at every m from
# 2p-1 to 32 that the check above simulates for p = 4 (and the cost model's formula,
# max(p-1, 2(2p-1-m)) chunk forwards, says it stays there for any larger m); with fewer
# micro-batches the V does not fill, and below (3p-1)/2 it leaves 2(2p-1-m) chunk forwards.
# The cost model's ZBV column above is the same figure.
#
# The real run: both train the same model as one process, and so do PyTorch's
# `ScheduleInterleavedZeroBubble` (one stage per rank) and `ScheduleZBVZeroBubble` on the
# same stages (PyTorch's ZB-H1 counterpart needs m a multiple of p, so it runs m = 2 here).

# %%
# NBVAL_CHECK_OUTPUT
cases = [c for c in schedule_runs.zero_bubble_cases(2, torch=True) if c[2] > 1]
per_rank = lessonlib.launch(schedule_runs.rank_parity, 2, cases, steps=3)
report = schedule_runs.compare_parity(per_rank, steps=3)
for r in report:
    same = max(r.max_grads_diff, r.max_weights_diff, r.max_losses_diff) < 1e-5
    print(f"{r.engine:>9} {r.schedule:>5} m={r.m}: gradients, weights (3 steps) and "
          f"losses equal one process: {same}")

# %% [markdown]
# Measured: the stages of §3, m = 4, every schedule and PyTorch's zero-bubble schedules
# taking turns step by step. Each measured Gantt chart is drawn with its bubble, and each
# run's own F, B and W times per virtual stage are replayed by the simulation, which removes
# the noise of a shared machine from the schedule's part. To compare the schedules
# themselves, every one is then replayed on the same times, the ZB-H1 run's: each virtual
# stage takes its share of the times of the ZB-H1 stage that holds its layers, so ZBV's
# device 0, which runs the first virtual stage and the last, takes half of stage 0's times
# for its chunk 0 and half of stage 1's for its chunk 1 (`validate.replay`). One
# approximation remains: a virtual stage cut from ZB-H1's stage 0 inherits that stage's
# backward, where B computes nothing and W all of it, so ZBV's virtual stage 1 is replayed
# with no B of its own.

# %%
# NBVAL_IGNORE_OUTPUT
import statistics

zb = lessonlib.launch(schedule_runs.measure, 2, ms=(4,), engines=("lessonlib", "torch"),
                      width=WIDTH, layers_per_stage=LAYERS_PER_STAGE, micro=MICRO,
                      schedules=("1f1b", "interleaved", "zb-h1", "zbv"), steps=3, warmup=1,
                      timeout=300)
zb_rows = {(r.engine, r.schedule): r for r in schedule_runs.summarize(zb)}
ours = {case[1]: case for case in zb[0] if case[0] == "lessonlib"}
ours = {name: ours[name] for name in ("1f1b", "interleaved", "zb-h1", "zbv")}
why = {name: schedule_runs.explain_bubble(zb, case) for name, case in ours.items()}
fig, axes = plt.subplots(4, 1, figsize=(10, 8), constrained_layout=True)
for ax, (name, case) in zip(axes, ours.items()):
    vp.gantt([r.spans for r in schedule_runs.median_step(zb, case)], ax=ax,
             title=f"{vp.NAMES[name]}, p=2, m=4, measured: bubble "
                   f"{statistics.fmean(why[name].measured):.1%} of wall time")
plt.show()
print(f"p = 2, m = 4, layers of width {WIDTH}, micro-batches of {MICRO} rows")
print(f"{'schedule':>17} {'step ms':>8} {'bubble measured':>16} {'replayed':>9} "
      f"{'T_F, T_B, T_W ms (last virtual stage)':>39}")
for name, w in why.items():
    print(f"{vp.NAMES[name]:>17} {w.step_ms:>8.1f} {statistics.fmean(w.measured):>16.1%} "
          f"{statistics.fmean(w.simulated_with_measured_compute):>9.1%} "
          f"{w.forward_ms[-1]:>25.2f} {w.backward_ms[-1]:>6.2f} {w.weight_ms[-1]:>6.2f}")
for name, torch_name in (("zb-h1", "ScheduleInterleavedZeroBubble"),
                         ("zbv", "ScheduleZBVZeroBubble")):
    mine, theirs = zb_rows["lessonlib", name].step_time_s, zb_rows["torch", name].step_time_s
    print(f"lessonlib {vp.NAMES[name]} step / PyTorch's {torch_name}: {mine / theirs:.2f}")
# every schedule replayed on the times this ZB-H1 run measured, per virtual stage
same = {name: statistics.fmean(replay(S.make(name, p=2, m=4, v=case[3]), why["zb-h1"]).bubble)
        for name, case in ours.items()}
claim("replayed on the same measured F, B and W times, ZB-H1 and ZBV leave less bubble "
      "than 1F1B, and ZBV the least of the four",
      max(same["zb-h1"], same["zbv"]) < same["1f1b"] and same["zbv"] == min(same.values()),
      numbers=", ".join(f"{vp.NAMES[n]} {b:.1%}" for n, b in same.items()))

# %% [markdown]
# On a shared 2-core machine the measured bubble and step times move from run to run (the
# numbers above are this run's), and so do the runs' own times (one stage of a run can be
# slowed by a neighbour); the replay on the same times, its bubbles printed on the claim's
# line, is the schedules' part. A split backward gains step time only where the bubble it
# saves is larger than what the split costs: W runs one autograd call per layer where a whole
# backward runs one per stage, and ZB-H1's `(p-1)(T_F + T_B - T_W)` assumes T_W <= T_F;
# compare the table's T_W with its T_F (with 32 rows per micro-batch, a weight gradient
# writes a whole 1024 x 1024 matrix while an input gradient writes 32 x 1024). On the first
# virtual stage (stage 0's only chunk in ZB-H1, chunk 0 of device 0 in ZBV) nobody waits for
# the input gradient, so there B computes nothing and W runs the whole backward in one pass,
# as PyTorch's stages do; the table shows the last virtual stage, the one that computes the
# loss (chunk 1 of device 0 in ZBV). `labs/pp.py --schedules 1f1b zb-h1 zbv` measures the
# step times with more steps.

# %% [markdown]
# <div style="border: 2px solid #4c72b0; border-radius: 6px; padding: 10px 14px;">
# <b>Takeaway.</b> Interleaving v chunks per device divides the bubble's (p-1)/m by v:
# the pipeline idles (p-1)/(v·m+p-1) of its wall time, as if it had v times the
# micro-batches. The price is about v times the messages between devices, m a multiple of
# p, and slightly more activations on the first device. Where a message is cheap next to a chunk's
# compute (GPUs over NVLink or InfiniBand, large layers) that trade pays; where each message
# costs a copy on the critical path (CPU ranks, small layers) it pays least, and at large m,
# where there is little bubble left to save, it can lengthen the step. Splitting each
# backward into B and W attacks the hop itself: ZB-H1 leaves a third of 1F1B's bubble at
# equal F, B and W times with 1F1B's memory, ZBV only the start-up.
# </div>
#
# ## Exercise
#
# **1.** Plain 1F1B on p = 4 stages with m = 16 micro-batches leaves some bubble. With
# interleaved 1F1B and v = 2 chunks per device, what is the smallest number of
# micro-batches that leaves no more bubble (as a share of the wall time)? Remember what m
# this schedule accepts.

# %%
from lessonlib.exercises import pipeline as ex

my_m_interleaved = None
ex.check_interleaved_microbatches(my_m_interleaved, p=4, v=2, m_plain=16)

# %% tags=["solution", "hide-input", "hide-output"] jupyter={"outputs_hidden": true, "source_hidden": true}
# Solution (click to open)
# NBVAL_CHECK_OUTPUT
plain_solution = cm.bubble_fraction(4, 16, convention="wall")
m_interleaved_solution = next(k for k in range(4, 17, 4)     # multiples of p = 4
                              if cm.bubble_fraction(4, k, 2, convention="wall") <= plain_solution)
ex.check_interleaved_microbatches(m_interleaved_solution, p=4, v=2, m_plain=16)
