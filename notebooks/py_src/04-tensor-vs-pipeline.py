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
# # 04 · Tensor vs pipeline parallelism
#
# Lesson 03 cut the castle by floors and watched all but one builder wait. Two ways out:
#
# * **Part 1, tensor parallelism**: the builders share every wall; each matrix is split over
#   t ranks, so all ranks always work, at the price of all-reduces in every layer.
# * **Part 2, pipeline parallelism**: the builders keep their floors, but the order is cut
#   into micro-batches so the line fills up, at the price of a bubble while it fills and drains.
#
# *Watch and read:* Deepak Narayanan, Stanford MLSys seminar #83, 06:56-13:45; Shoeybi et
# al., "Megatron-LM" (2019), §3; Huang et al., "GPipe" (2019), §2; Narayanan et al. (SC21), §2.

# %%
import statistics

import matplotlib.pyplot as plt
from IPython.display import display

import lessonlib
from lessonlib import costmodel as cm
from lessonlib.instruments.claims import at_least, at_most, claim, within
from lessonlib.pipeline import actions, schedule_runs, schedules
from lessonlib.pipeline.executor import PipelineExecutor
from lessonlib.pipeline.validate import ScheduleError, StageTimes, replay, simulate
from lessonlib.tensor_parallel import layer_runs as tp_runs, ops as tp_ops
from lessonlib.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from lessonlib.viz import live
from lessonlib.viz import pipeline as vp
from lessonlib.viz import tp as tpviz
from lessonlib.viz.source import show

# %% [markdown]
# ## Part 1 · Tensor parallelism: many builders on one wall
#
# **The castle.** Now the builders share the *same* wall, each laying a slice of every
# course, and meet after every section: they had better stand close.
#
# The walls are the big matrices. Megatron-LM (2019, §3) splits the MLP `Z = GeLU(X A) B`
# over t ranks: **A by columns**, so rank r computes its slice `Y_r = GeLU(X A_r)` with no
# message (GeLU acts on each element); **B by rows**, so rank r computes `Y_r B_r`, a
# partial sum of `Z`, and one **all-reduce** adds the t of them. Two operators hold it
# together: **g** after B (all-reduce forward, identity backward) and **f** before A
# (identity forward, all-reduce backward: each rank's gradient of X is a partial sum).
# lessonlib's f and g, and the two layers that call them:

# %%
display(show(tp_ops._CopyToTP, tp_ops._ReduceFromTP,
             ColumnParallelLinear.forward, RowParallelLinear.forward))
# attention splits the same way, by heads; each colour is one rank
tpviz.weight_split_widget(heads=8)

# %% [markdown]
# ### 1.1 Prediction: memory falls as 1/t, communication does not
#
# A layer has `12h² + 13h` parameters (Megatron-LM 2021, Eq. 2), about 1/t per rank. Per
# micro-batch it all-reduces a `(b, s, h)` tensor twice forward (the g's) and twice backward
# (the f's), and a ring sends 2(t-1)/t of each per rank: `8bsh(t-1)/t` elements (§3.2). For
# the layer run next (b = 4, s = 32, h = 128, 8 heads, fp32):

# %%
# NBVAL_CHECK_OUTPUT
B, S, H, HEADS, TS = 4, 32, 128, 8, (1, 2, 4)
layer = cm.GPT(L=1, h=H, a=HEADS, s=S, V=64)
print(f"{'t':>2} {'weights per rank':>17} {'sent per rank, fwd+bwd':>23}")
for t in TS:
    print(f"{t:>2} {4 * layer.layer_params() / t:>11,.0f} bytes "
          f"{4 * cm.tp_elements_per_layer(B, S, H, t=t):>17,.0f} bytes")

# %% [markdown]
# ### 1.2 The real run: t = 1, 2 and 4, equal to the dense model
#
# One launch of 4 ranks, in groups of t, splits a dense MLP, a layer and the tiny GPT built
# from one seed (the MLP and layer also with PyTorch's DTensor plans, for reference), trains
# dense and split copies 3 SGD steps and compares them; a ledger records every message.

# %%
# NBVAL_IGNORE_OUTPUT
tp_reports = tp_runs.run_layer_reports(4, ts=TS, b=B, s=S, h=H, heads=HEADS, steps=3,
                                       kinds=("mlp", "block", "gpt"), with_torch=True,
                                       timeout=240)
for t in TS:
    report = tp_reports[0][t]
    print(f"t={t}: " + ", ".join(
        f"{kind} {max(p.output, p.grads, p.weights_after_steps):.1e}"
        for kind, p in (("mlp", report.mlp), ("block", report.block), ("gpt", report.gpt)))
        + " (largest relative error)")

# %%
# NBVAL_CHECK_OUTPUT
TOL = 2e-6   # relative to the largest value; fp32 sums in another order differ around 1e-7
for t in TS:
    for kind in ("mlp", "block", "gpt"):
        ours = [r[t].layer(kind) for r in tp_reports]     # output, input_grad, grads, weights
        same = all(error < TOL for p in ours for error in p.errors().values())
        line = f"t={t} {kind:>5}: equal to the dense model on all 4 ranks: {same}"
        if kind != "gpt":   # PyTorch's plans split the MLP and the layer
            theirs = [p.torch for p in ours]
            line += (f"; DTensor too: "
                     f"{all(max(x.output, x.input_grad, x.grads) < TOL for x in theirs)},"
                     f" same weight bytes: {theirs[0].param_bytes == ours[0].param_bytes}")
        print(line)

# %% [markdown]
# Measured against predicted in rank 0's first step: all-reduces, ring bytes and parameter
# bytes per rank:

# %%
# NBVAL_CHECK_OUTPUT
rows = []
for t in TS:
    mlp, block = tp_reports[0][t].mlp, tp_reports[0][t].block
    sent = block.forward.ring_bytes_per_rank + block.backward.ring_bytes_per_rank
    rows.append({"t": t, "param_bytes": block.param_bytes,
                 "param_bytes_predicted": 4 * layer.layer_params() / t, "comm_bytes": sent,
                 "comm_bytes_predicted": 4 * cm.tp_elements_per_layer(B, S, H, t=t)})
    print(f"t={t}: MLP {mlp.forward.all_reduce} all-reduce forward, "
          f"{mlp.backward.all_reduce} backward | layer {block.forward.all_reduce} + "
          f"{block.backward.all_reduce}, payload {block.forward.payload_bytes // 2:,} "
          f"bytes each, ring {sent:,.0f} bytes per rank (predicted "
          f"{rows[-1]['comm_bytes_predicted']:,.0f})")
    print(f"     weights {block.param_bytes:,} bytes per rank (predicted "
          f"{rows[-1]['param_bytes_predicted']:,.0f}; dense {block.dense_param_bytes:,})")
print("the small weight gap, 6h x 4 x (1 - 1/t) bytes, is what stays whole on every rank: "
      "the two LayerNorms and the biases added after g")
tpviz.plot_tp_scaling(rows)
plt.show()

# %% [markdown]
# ### 1.3 Why tensor parallelism wants NVLink
#
# The all-reduces sit *inside* every layer, on the critical path. The cost model's ring on
# DGX A100 servers (NVLink inside, one 200 Gb/s InfiniBand port per GPU), for one GPT-3
# layer (b = 1, s = 2048, h = 12288, 16-bit), forward + backward; past t = 8 the group spans
# servers, whose 8 ports NCCL drives at once:

# %%
# NBVAL_CHECK_OUTPUT
gpt3, cluster = cm.MODELS["gpt3-175B"], cm.CLUSTERS["dgx-a100"]
payload = 1 * gpt3.s * gpt3.h * 2                      # one (b, s, h) tensor, 16-bit
compute = 3 * cm.compute.layer_forward_flops(gpt3, 1)  # forward + backward = 3 forwards
print(f"per GPU and direction: NVLink {cluster.link(False)[0] / 1e9:.0f} GB/s, "
      f"InfiniBand {cluster.link(True)[0] / 1e9:.0f} GB/s")
link_rows = []
for t in (2, 4, 8):
    times = {}
    for name, spans_nodes in (("nvlink_s", False), ("infiniband_s", True)):
        bandwidth, latency = cluster.link(spans_nodes)
        times[name] = 4 * cm.ring_allreduce_time_s(t, payload, bandwidth, latency=latency)
    link_rows.append({"t": t, **times, "compute_s": compute / t / cluster.gpu.peak_flops})
    r = link_rows[-1]
    print(f"t={t:>2}: all-reduces {r['nvlink_s'] * 1e3:5.2f} ms over NVLink, "
          f"{r['infiniband_s'] * 1e3:5.2f} ms over one InfiniBand port; "
          f"compute {r['compute_s'] * 1e3:5.2f} ms per GPU at peak")
flat_ring = cm.make_cluster("A100", 8, network_ports=1, collectives="flat-ring")
for t in (16, 32):
    took = {}
    for name, c in (("dgx", cluster), ("flat", flat_ring)):
        bandwidth, latency = c.group_link(t, t, 1)
        took[name] = 4 * cm.ring_allreduce_time_s(t, payload, bandwidth, latency=latency)
    print(f"t={t}: all-reduces {took['dgx'] * 1e3:5.2f} ms over DGX servers' 8 ports, "
          f"{took['flat'] * 1e3:5.2f} ms through one port per server; compute "
          f"{compute / t / cluster.gpu.peak_flops * 1e3:4.2f} ms per GPU at peak")
tpviz.plot_link_times(link_rows)
plt.show()
share = {r["t"]: (r["nvlink_s"] / r["compute_s"], r["infiniband_s"] / r["compute_s"])
         for r in link_rows}
at_most("over NVLink the all-reduces' time over the compute, the largest of t = 2, 4, 8",
        max(nv for nv, _ in share.values()), 0.2)
claim("over one InfiniBand port that share grows with t",
      share[2][1] < share[4][1] < share[8][1],
      numbers=", ".join(f"t={t}: {ib:.0%}" for t, (_, ib) in share.items()))
at_least("  and at t = 8 it passes the compute: their time over it", share[8][1], 1)

# %% [markdown]
# Over one InfiniBand port the all-reduces' share grows with t (the compute per GPU falls as
# 1/t, they do not) until they outlast the compute. Leaving the server is a cliff
# (Megatron-LM 2021, Fig. 13: "up to 2x" lower throughput). Sequences too long for one GPU
# get their own axis:
# [deep dive 12](12-deep-dive-long-sequences.ipynb).
#
# <div style="border: 2px solid #4C72B0; border-radius: 6px; padding: 10px;">
# <b>Takeaway.</b> Tensor parallelism splits every layer's matrices over t ranks and keeps
# the model exactly the same: each rank holds 1/t of the weights, all work at once. The
# price, 4 all-reduces per layer (8bsh(t-1)/t elements per rank), hardly shrinks with t and
# sits on the critical path: keep the TP group inside one NVLink server.
# </div>
#
# ### Exercises (Part 1)
#
# **1.** Write Megatron's **f** as its two halves, `my_f_forward(x, group)` and
# `my_f_backward(grad, group)`; the checker runs them as an autograd function on 2 ranks.

# %%
from lessonlib import comm
from lessonlib.exercises import tp as ex


def my_f_forward(x, group):
    raise NotImplementedError


def my_f_backward(grad, group):
    raise NotImplementedError


ex.check_f_operator(my_f_forward, my_f_backward)

# %% tags=["solution", "hide-input", "hide-output"] jupyter={"outputs_hidden": true, "source_hidden": true}
# Solution (click to open)
# NBVAL_CHECK_OUTPUT
def f_forward_solution(x, group):
    return x.clone()


def f_backward_solution(grad, group):
    grad = grad.clone()
    comm.all_reduce(grad, group=group)
    return grad


ex.check_f_operator(f_forward_solution, f_backward_solution)

# %% [markdown]
# **2.** From t = 4 to t = 8 the weights per rank halve. By what factor do the bytes each
# rank *sends* per layer change? Predict it from a ring's cost (1.1 stops at t = 4).

# %%
my_ratio = None     # bytes sent per rank at t = 8, divided by those at t = 4
ex.check_tp_traffic_ratio(my_ratio, t_from=4, t_to=8)

# %% tags=["solution", "hide-input", "hide-output"] jupyter={"outputs_hidden": true, "source_hidden": true}
# Solution (click to open)
# NBVAL_CHECK_OUTPUT
ratio_solution = (cm.tp_elements_per_layer(B, S, H, t=8)
                  / cm.tp_elements_per_layer(B, S, H, t=4))
ex.check_tp_traffic_ratio(ratio_solution, t_from=4, t_to=8)

# %% [markdown]
# *Where a layer's activations go, and how sequence parallelism and recomputation shrink
# them: [deep dive 14](14-deep-dive-sequence-parallelism.ipynb).*
#
# ## Part 2 · Pipeline parallelism: the assembly line with micro-batches
#
# **The assembly line.** In lesson 03 each of p builders idled (p-1)/p of the time. GPipe
# (Huang et al. 2019) cuts the order into **m micro-batches**: while builder 1 works on
# micro-batch 0, builder 0 starts micro-batch 1. The line still fills and drains; that idle
# time is the **bubble**. 1F1B does not shrink it, despite a popular claim: it cuts the
# **memory**, the activations each stage holds for backward. Splitting the backward (section
# 2.5) does.
#
# ### 2.1 A schedule is data
#
# Each stage's order of forwards `F<i>` and backwards `B<i>` of micro-batches `i`. GPipe runs
# all forwards, then all backwards; 1F1B (PipeDream-Flush, Narayanan et al. 2021) lets stage
# `s` run `p - s - 1` warm-up forwards, then alternates one forward and one backward. As
# data, a schedule is checked before any process starts (below: GPipe's order on stage 1
# with 1F1B's elsewhere deadlocks). 1F1B's order, and the executor's step that runs any
# order (units: one F, B or W, or a batch of messages):

# %%
show(schedules.one_f_one_b_order, PipelineExecutor.step)

# %%
# NBVAL_CHECK_OUTPUT
print("GPipe\n" + actions.describe(schedules.gpipe(4, 6)))
print("\n1F1B\n" + actions.describe(schedules.one_f_one_b(4, 6)))
orders = [schedules.one_f_one_b_order(4, 6, s) for s in range(4)]
orders[1] = actions.compute_only(schedules.gpipe(4, 6)[1])
try:
    simulate(actions.add_communication(orders))
except ScheduleError as err:
    print(f"\nmixed: {err}")

# %% [markdown]
# ### 2.2 The prediction: the same bubble, different memory
#
# With p balanced stages both schedules idle p-1 slots of one micro-batch's forward +
# backward: `(p-1)/(m+p-1)` of the **wall** time (GPipe §2.3), `(p-1)/m` of the **ideal**
# compute time (Megatron-LM 2021 §2.2). At the peak GPipe's stages hold m micro-batches of
# activations, 1F1B's stage `s` holds `min(p - s, m)` (PipeDream-Flush §3.2):

# %%
# NBVAL_CHECK_OUTPUT
print(f"{'p':>2} {'m':>3} {'wall (GPipe)':>13} {'ideal (Megatron)':>17} {'simulated GPipe':>16} "
      f"{'simulated 1F1B':>15}   stash GPipe / 1F1B per stage")
print(f"{'':>2} {'':>3} {'(p-1)/(m+p-1)':>13} {'(p-1)/m':>17} {'(wall)':>16} {'(wall)':>15}")
for p, m in ((2, 2), (2, 4), (2, 8), (4, 8)):
    gp, ofob = simulate(schedules.gpipe(p, m)), simulate(schedules.one_f_one_b(p, m))
    print(f"{p:>2} {m:>3} {cm.bubble_fraction(p, m, convention='wall'):>13.1%} "
          f"{cm.bubble_fraction(p, m, convention='ideal'):>17.1%} {gp.bubble[0]:>16.1%} "
          f"{ofob.bubble[0]:>15.1%}   {gp.peak_stash} / {ofob.peak_stash}")

# %% [markdown]
# ### 2.3 The real run
#
# First the proof: a tiny GPT in 2 stages, 2 SGD steps with each schedule (and PyTorch's),
# against one process. Then the timing run: 2 equal stages of Linear + GeLU, each
# rank recording every F, B, send and wait, and what autograd saved.

# %%
# NBVAL_CHECK_OUTPUT
cases = [c for c in schedule_runs.parity_cases(2) if c[1] != "interleaved"]
report = schedule_runs.compare_parity(lessonlib.launch(schedule_runs.rank_parity, 2, cases))
for r in report:
    same = max(r.max_grads_diff, r.max_weights_diff, r.max_losses_diff) < 1e-5
    print(f"{r.engine:>9} {r.schedule:>5} m={r.m}: gradients, weights and losses "
          f"equal one process: {same}")

# %%
# NBVAL_IGNORE_OUTPUT
SIZES = dict(width=1024, layers_per_stage=8, micro=32)   # micro: rows per micro-batch
measured = lessonlib.launch(schedule_runs.measure, 2, ms=(2, 4, 8), engines=("lessonlib",),
                            schedules=("gpipe", "1f1b"), steps=3, warmup=1, timeout=300,
                            **SIZES)
rows = schedule_runs.summarize(measured)
print(f"{len(rows)} cases measured, median step times from "
      f"{min(r.step_time_s for r in rows) * 1e3:.0f} to "
      f"{max(r.step_time_s for r in rows) * 1e3:.0f} ms")

# %% [markdown]
# ### 2.4 Measured against predicted
#
# The median step at m = 4, each measured chart under its theoretical one: blue forwards,
# green backwards, hatched grey waiting for a message, pale red idle.

# %%
for name in ("gpipe", "1f1b"):
    case = ("lessonlib", name, 4, 1)
    step = schedule_runs.median_step(measured, case)
    row = next(r for r in rows if (r.engine, r.schedule, r.m, r.v) == case)
    vp.gantt_pair(name, [r.spans for r in step], p=2, m=4, bubble=row.bubble_per_stage)
    plt.show()

# %% [markdown]
# Every run's bubble next to `(p-1)/(m+p-1)`, a few points off on CPU ranks: each send's
# copy adds idle time, two ranks sharing cores hide some
# ([why](11-deep-dive-laptop-measurements.ipynb)); the last line says which way this run
# went. Memory is exact.

# %%
# NBVAL_IGNORE_OUTPUT
print(f"{'schedule':>8} {'m':>2} {'step ms':>8} {'bubble (wall)':>14} {'theory (wall)':>14} "
      f"{'difference':>11}")
for r in rows:
    print(f"{r.schedule:>8} {r.m:>2} {r.step_time_s * 1e3:>8.1f} "
          f"{r.bubble_mean:>14.1%} {r.bubble_theory_wall:>14.1%} "
          f"{r.bubble_mean - r.bubble_theory_wall:>+11.1%}")
gaps = [r.bubble_mean - r.bubble_theory_wall for r in rows]
print(f"this run: {sum(g > 0 for g in gaps)} of {len(gaps)} bubbles above the theory, "
      f"{sum(g < 0 for g in gaps)} below; the measurement is off by {min(gaps):+.1%} to "
      f"{max(gaps):+.1%} of the step")
vp.bubble_and_memory(rows)
plt.show()

# %%
# NBVAL_CHECK_OUTPUT
for r in rows:
    print(f"{r.schedule:>5} m={r.m}: held per stage {r.peak_stash_per_stage}, "
          f"predicted {r.peak_stash_theory}: "
          f"{r.peak_stash_per_stage == r.peak_stash_theory}")

# %% [markdown]
# 1F1B's first stage held 2 micro-batches whatever m was, GPipe's all m.
#
# ### 2.5 Where the bubble comes from, and how splitting the backward removes most of it
#
# In the 1F1B chart stage 0 waits for the first gradient to come back through every later
# stage's *whole* backward. But a backward does two jobs: the input gradient (**B**),
# which the previous stage waits for, and the weight gradient (**W**), which nobody waits
# for. Zero-bubble schedules (Qi et al., ICLR 2024) send B at once and run W in time the
# stage would idle. **ZB-H1** keeps 1F1B's order and memory and idles
# `(p-1)(T_F + T_B - T_W)` per stage instead of `(p-1)(T_F + T_B + T_W)` (Table 2): a third
# when the three take equal times.
#
# Below, both measured at m = 4 (B green, W gold), then replayed by the simulation, without
# the machine's noise, on equal times and on this run's
# ([deep dive 09](09-deep-dive-interleaved-schedules.ipynb) adds interleaving and ZBV).

# %%
# NBVAL_IGNORE_OUTPUT
zb = lessonlib.launch(schedule_runs.measure, 2, ms=(4,), engines=("lessonlib",),
                      schedules=("1f1b", "zb-h1"), steps=2, warmup=1, timeout=300, **SIZES)
why = {name: schedule_runs.explain_bubble(zb, ("lessonlib", name, 4, 1))
       for name in ("1f1b", "zb-h1")}
fig, axes = plt.subplots(2, 1, figsize=(10, 3.8), constrained_layout=True)
for ax, name in zip(axes, why):
    spans = [r.spans for r in schedule_runs.median_step(zb, ("lessonlib", name, 4, 1))]
    vp.gantt(spans, ax=ax, title=f"{vp.NAMES[name]}, p=2, m=4, measured: bubble "
             f"{statistics.fmean(why[name].measured):.1%} of wall time")
plt.show()
times = why["zb-h1"]    # per stage; stage 0's W runs its whole backward (its B has no input)
for stage in (0, 1):
    print(f"stage {stage}: T_F {times.forward_ms[stage]:.1f} ms, T_B "
          f"{times.backward_ms[stage]:.1f} ms, T_W {times.weight_ms[stage]:.1f} ms")
equal = StageTimes(forward_ms=[1.0, 1.0], backward_ms=[1.0, 1.0], weight_ms=[1.0, 1.0])


def idle_ms(name, stage_ms):
    """Idle time of all stages, ``name`` replayed on ``stage_ms`` (1F1B runs B + W as one)."""
    sim = replay(schedules.make(name, 2, 4), stage_ms)
    return sum(sim.bubble) * sim.makespan


left = {label: idle_ms("zb-h1", ms) / idle_ms("1f1b", ms)
        for label, ms in (("equal", equal), ("measured", times))}
print(f"ZB-H1's idle time over 1F1B's, both replayed: {left['equal']:.2f} at T_F = T_B = T_W, "
      f"{left['measured']:.2f} on the times above")
within("replayed at T_F = T_B = T_W, ZB-H1's idle time over 1F1B's (Table 2's third)",
       left["equal"], expected=1 / 3, tolerance=0.01)
at_most("replayed on the measured times, ZB-H1's idle time over 1F1B's", left["measured"], 1)
split = {f"stage {s}": w / (b + w) for s, (b, w)   # stage 0's B computes nothing
         in enumerate(zip(times.backward_ms, times.weight_ms)) if s > 0}
at_least(f"T_W's share of the backward on the stages with a B ({', '.join(split)})",
         min(split.values()), 0.3)

# %% [markdown]
# Table 2's third assumes equal times. This run's differ: T_W is not T_B, and stage 0 runs
# its whole backward as W while stage 1 splits its own, so the faster stage waits for the
# slower on every micro-batch. Live: one step of the schedule you choose on p real ranks.

# %%
# NBVAL_IGNORE_OUTPUT
live.pipeline_widget()

# %% [markdown]
# <div style="border: 2px solid #4c72b0; border-radius: 6px; padding: 10px 14px;">
# <b>Takeaway.</b> A flush pipeline idles (p-1)/(m+p-1) of its wall time: more
# micro-batches shrink the bubble. 1F1B does <i>not</i>; it caps each stage's activations
# at min(p - stage, m) micro-batches, not GPipe's m, which lets m grow. Splitting each
# backward into B (sent at once) and W (run later) does: ZB-H1 leaves a third of 1F1B's
# idle time when F, B and W take equal times, with the same memory; on unequal stages, the
# share their times give (section 2.5).
# </div>
#
# ### Exercises (Part 2)
#
# **1.** p = 3 stages, m = 5 micro-batches: write **stage 0**'s 1F1B order as a string like
# `"F0 F1 B0 ..."` (the simulation checks it).

# %%
from lessonlib.exercises import pipeline as ex

my_order = None
ex.check_1f1b_order(my_order, p=3, m=5, stage=0)

# %% tags=["solution", "hide-input", "hide-output"] jupyter={"outputs_hidden": true, "source_hidden": true}
# Solution (click to open)
# NBVAL_CHECK_OUTPUT
order_solution = "F0 F1 F2 B0 F3 B1 F4 B2 B3 B4"    # p - 0 - 1 = 2 warm-up forwards first
ex.check_1f1b_order(order_solution, p=3, m=5, stage=0)

# %% [markdown]
# **2.** With p = 8 stages, what is the smallest m that brings the bubble to 10 % of the wall
# time or less? (GPipe's stages would hold all m; 1F1B's at most 8.)

# %%
my_m = None
ex.check_min_microbatches(my_m, p=8, target=0.1)

# %% tags=["solution", "hide-input", "hide-output"] jupyter={"outputs_hidden": true, "source_hidden": true}
# Solution (click to open)
# NBVAL_CHECK_OUTPUT
m_solution = next(m_try for m_try in range(1, 1000)
                  if cm.bubble_fraction(8, m_try, convention="wall") <= 0.1)
ex.check_min_microbatches(m_solution, p=8, target=0.1)

# %% [markdown]
# ## Tensor or pipeline? The bytes decide
#
# Per layer and micro-batch, tensor parallelism moves `8·b·s·h·(t-1)/t` elements per rank
# (Megatron-LM 2021, §3.2); a pipeline moves `b·s·h` per stage boundary, `b·s·h/t` with
# scatter/gather (§4.1), however many layers a stage holds. For GPT-3:

# %%
# NBVAL_CHECK_OUTPUT
g = cm.MODELS["gpt3-175B"]
tp_elems = cm.tp_elements_per_layer(1, g.s, g.h, t=8)
pp_elems = 2 * cm.pp_elements_per_boundary(1, g.s, g.h, t=8)   # activation out, gradient back
print(f"TP, t = 8: {tp_elems * 2 / 1e6:,.0f} MB per layer per micro-batch (forward and backward), "
      f"x {g.L} layers")
print(f"PP with scatter/gather, t = 8: {pp_elems * 2 / 1e6:,.1f} MB per stage boundary per "
      f"micro-batch (the activation forward and its gradient back)")
print(f"ratio for a 12-layer stage: {12 * tp_elems / pp_elems:,.0f}x more bytes for TP")

# %% [markdown]
# > **Takeaway.** Tensor parallelism keeps every GPU busy but talks at every layer: it belongs
# > inside one server, over NVLink. Pipeline parallelism talks only at stage boundaries, so
# > it can cross the slower links between servers, and its bubble shrinks with more
# > micro-batches. Megatron-LM 2021's first takeaway: TP up to a server's GPUs, PP across
# > servers. Lesson 05 adds data parallelism.
