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
# Lesson 03 cut the castle by floors and watched all but one builder wait. There are two
# ways out, and this lesson runs both for real:
#
# * **Part 1, tensor parallelism**: the builders share every wall. Each matrix is split
#   over t ranks (Megatron-LM's column- and row-parallel layers), so every rank works all
#   the time, at the price of two all-reduces per layer forward and two backward.
# * **Part 2, pipeline parallelism**: the builders keep their floors, but the order is cut
#   into micro-batches so the line fills up (GPipe, 1F1B). The price is the bubble while
#   the line fills and drains, and the activations each stage keeps.
#
# Each part follows the same plan: the idea, a prediction from the cost model, a real run on
# CPU ranks (GPUs with NCCL when you have them), measured against predicted, a takeaway and
# exercises. The end compares the two.

# %% [markdown]
# ## Part 1 · Tensor parallelism: many builders on one wall
#
# **The castle.** In lesson 03 each builder took whole rooms, and all but one waited. Now
# the builders stand side by side at the *same* wall: each lays its own vertical slice of
# every course of bricks, and at the end of each section they line their slices up so the
# next section starts from one straight wall. Nobody waits for another room, but they must
# meet often, so they had better stand close together.
#
# In a transformer the walls are the big matrices. Megatron-LM (Shoeybi et al. 2019, §3)
# splits the MLP `Z = GeLU(X A) B` like this:
#
# * **A by columns** over t ranks: rank r computes `Y_r = GeLU(X A_r)`, its own slice of
#   the hidden layer. GeLU acts on each element, so no message is needed before it.
# * **B by rows**: rank r computes `Y_r B_r`, a partial sum of `Z`. One **all-reduce**
#   adds the t partial sums.
#
# Two operators hold it together. **g** sits after B: all-reduce forward, identity backward.
# **f** sits before A: identity forward (every rank already has X), all-reduce backward
# (each rank's gradient of X is only a partial sum). So an MLP costs exactly one all-reduce
# forward and one backward. Attention splits the same way, by heads: Q, K and V by columns
# (a/t heads per rank), the output projection by rows.
#
# *Watch and read:* Stanford MLSys seminar #83, Deepak Narayanan, "Training Large Language
# Models at Scale", 06:56-13:45 (tensor and pipeline parallelism); Shoeybi et al.,
# "Megatron-LM" (2019), §3; Huang et al., "GPipe" (2019), §2; Narayanan et al. (SC21), §2.

# %%
import json
from pathlib import Path

import matplotlib.pyplot as plt

import lessonlib
from lessonlib import costmodel as cm
from lessonlib.tensor_parallel import runs as tp_runs
from lessonlib.viz import tp as tpviz

# %% [markdown]
# ### 1.1 Who holds what
#
# Each colour is one rank. Rank r holds column block r of A, row block r of B, and heads
# r·a/t to (r+1)·a/t - 1 of attention.

# %%
tpviz.draw_weight_split(t=2, heads=8)
plt.show()

# %% [markdown]
# Slide t to see the split at other degrees:

# %%
tpviz.weight_split_widget(heads=8)

# %% [markdown]
# ### 1.2 Prediction: memory falls as 1/t, communication does not
#
# One transformer layer has `12h² + 13h` parameters (Megatron-LM 2021, Eq. 2): tensor
# parallelism splits nearly all of them, so a rank holds about 1/t. The price: per layer and
# micro-batch, 2 all-reduces forward (g after attention, g after the MLP) and 2 backward
# (the two f's), each of a `(b, s, h)` tensor. A ring all-reduce of S bytes sends
# 2(t-1)/t·S bytes per rank, so one layer sends `4 · 2(t-1)/t · bsh = 8bsh(t-1)/t` elements
# per rank (Megatron-LM 2021, §3.2). It barely shrinks as t grows. For the layer we are
# about to run (b = 4, s = 32, h = 128, 8 heads, fp32):

# %%
# NBVAL_CHECK_OUTPUT
B, S, H, HEADS, TS = 4, 32, 128, 8, (1, 2, 4)
layer = cm.GPT(L=1, h=H, a=HEADS, s=S, V=64)
print(f"{'t':>2} {'weights per rank':>17} {'sent per rank, fwd+bwd':>23}")
for t in TS:
    print(f"{t:>2} {4 * layer.layer_params() / t:>11,.0f} bytes "
          f"{4 * cm.tp_elements_per_layer(B, S, H, t):>17,.0f} bytes")

# %% [markdown]
# ### 1.3 The real run: t = 1, 2 and 4 in one launch
#
# `tp_runs.run_layer_reports` starts 4 ranks and forms groups of t consecutive ranks, so t
# = 1 (4 groups of one), 2 and 4 run in one launch. For each t it builds the dense MLP, a
# transformer layer and the whole tiny GPT from one seed, splits them (`parallelize_gpt`
# also splits the embedding and the head by vocabulary rows), trains the dense and the split
# copy side by side for 3 SGD steps, and compares everything; the ledger records each
# message. It also splits the same weights with PyTorch's DTensor, for section 1.4.

# %%
# NBVAL_IGNORE_OUTPUT
runs = tp_runs.run_layer_reports(4, ts=TS, b=B, s=S, h=H, heads=HEADS, steps=3,
                                 kinds=("mlp", "block", "gpt"), with_torch=True, timeout=240)
for t in TS:
    print(f"t={t}: " + ", ".join(
        f"{kind} {max(runs[0][t][kind][k] for k in ('output', 'grads', 'weights_after_steps')):.1e}"
        for kind in ("mlp", "block", "gpt")) + " (largest relative error)")

# %% [markdown]
# Parity with the dense model, on every rank: outputs, the gradient of the input, every
# weight and bias gradient, and every weight after 3 optimizer steps (relative to the
# largest value; fp32 sums in another order differ around 1e-7):

# %%
# NBVAL_CHECK_OUTPUT
TOL = 2e-6
for t in TS:
    for kind in ("mlp", "block", "gpt"):
        checks = ("output", "input_grad", "grads", "weights_after_steps")
        same = all(r[t][kind][c] < TOL for r in runs for c in checks if c in r[t][kind])
        print(f"t={t} {kind:>5}: equal to the dense model on all 4 ranks: {same}")

# %% [markdown]
# What the ledger saw in the first step, on rank 0:

# %%
# NBVAL_CHECK_OUTPUT
for t in TS:
    mlp, block = runs[0][t]["mlp"], runs[0][t]["block"]
    sent = block["forward"]["ring_bytes_per_rank"] + block["backward"]["ring_bytes_per_rank"]
    print(f"t={t}: MLP {mlp['forward']['all_reduce']} all-reduce forward, "
          f"{mlp['backward']['all_reduce']} backward | layer {block['forward']['all_reduce']} + "
          f"{block['backward']['all_reduce']}, payload {block['forward']['payload_bytes'] // 2:,} "
          f"bytes each, ring {sent:,.0f} bytes per rank "
          f"(8bsh(t-1)/t x 4 = {4 * cm.tp_elements_per_layer(B, S, H, t):,.0f})")

# %% [markdown]
# The ledger records each all-reduce's payload, `b·s·h·4 = 65,536` bytes; a ring moves
# 2(t-1)/t of it per rank, and four of them make the formula. Memory, measured from the
# parameters each rank holds, against the cost model's `(12h² + 13h)/t`:

# %%
# NBVAL_CHECK_OUTPUT
rows = []
for t in TS:
    block = runs[0][t]["block"]
    rows.append({"t": t, "param_bytes": block["param_bytes"],
                 "param_bytes_predicted": 4 * layer.layer_params() / t,
                 "comm_bytes": block["forward"]["ring_bytes_per_rank"]
                 + block["backward"]["ring_bytes_per_rank"],
                 "comm_bytes_predicted": 4 * cm.tp_elements_per_layer(B, S, H, t)})
    print(f"t={t}: {block['param_bytes']:>7,} bytes per rank, predicted "
          f"{rows[-1]['param_bytes_predicted']:>9,.0f}; dense {block['dense_param_bytes']:,}")
print(f"the gap, 6h x 4 x (1 - 1/t) bytes, is what stays whole on every rank: the two "
      f"LayerNorms and the biases added after g")

# %%
tpviz.plot_tp_scaling(rows)
plt.show()

# %% [markdown]
# ### 1.4 The same layers in PyTorch: DTensor
#
# PyTorch ships tensor parallelism as `ColwiseParallel` and `RowwiseParallel` plans applied
# with `parallelize_module` on a `DeviceMesh` (`torch.distributed.tensor.parallel`). The
# launch above also split the *same* dense weights that way:

# %%
# NBVAL_CHECK_OUTPUT
for t in TS:
    for kind in ("mlp", "block"):
        theirs = [r[t][kind]["torch"] for r in runs]
        same = all(max(x["output"], x["input_grad"], x["grads"]) < TOL for x in theirs)
        print(f"t={t} {kind:>5}: DTensor equals the dense model: {same}; weight bytes per "
              f"rank {theirs[0]['param_bytes']:,} (lessonlib {runs[0][t][kind]['param_bytes']:,})")

# %% [markdown]
# Same model, same memory. What about speed? `labs/tp.py` times both on the same shapes
# (the two alternate step by step). Its result on a 2-core CPU machine, stored in
# `data/tp_cpu_results.json` with the command that made it:

# %%
# NBVAL_IGNORE_OUTPUT
DATA = Path(lessonlib.__file__).resolve().parent.parent / "data"
lab = json.loads((DATA / "tp_cpu_results.json").read_text())
print(lab["command"])
for kind, ratio in lab["paired_ratio_lessonlib_over_torch"].items():
    ours, theirs = (lab["results"][n]["layers"][kind] for n in ("lessonlib", "torch"))
    print(f"{kind:>5}: lessonlib {ours['step_time_s'] * 1e3:.1f} ms, DTensor "
          f"{theirs['step_time_s'] * 1e3:.1f} ms (median step-by-step ratio {ratio:.2f}); "
          f"all-reduces {ours['all_reduces']} vs {theirs['all_reduces']}")
tpviz.plot_lab(lab)
plt.show()

# %% [markdown]
# Two differences show. DTensor wraps every tensor that crosses a parallel module and
# decides its layout at run time; plain f and g autograd functions skip that work, which
# matters most for small layers. And in the transformer layer DTensor sends 6 all-reduces
# instead of 4: Q, K and V are three `ColwiseParallel` modules, and each reduces its own
# input gradient, where lessonlib fuses them into one column-parallel layer behind one f,
# as Megatron-LM does.
#
# ### 1.5 Why tensor parallelism wants NVLink
#
# The all-reduces sit *inside* every layer, forward and backward, so their time adds to the
# step. The cost model's alpha-beta ring (`cm.ring_allreduce_time_s`) on a DGX A100 cluster
# preset: NVLink inside a server, 200 Gb/s InfiniBand per GPU between servers. For one
# GPT-3 layer (b = 1, s = 2048, h = 12288, 16-bit), per micro-batch, forward + backward:

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
        times[name] = 4 * cm.ring_allreduce_time_s(t, payload, bandwidth, latency)
    link_rows.append({"t": t, **times, "compute_s": compute / t / cluster.gpu.peak_flops})
    r = link_rows[-1]
    print(f"t={t}: all-reduces {r['nvlink_s'] * 1e3:5.2f} ms over NVLink, "
          f"{r['infiniband_s'] * 1e3:5.2f} ms over InfiniBand; "
          f"compute {r['compute_s'] * 1e3:5.2f} ms per GPU at peak")

# %%
tpviz.plot_link_times(link_rows)
plt.show()

# %% [markdown]
# Over NVLink the all-reduces cost a small fraction of the layer's compute, even at t = 8.
# The InfiniBand column is one GPU's own port, 25 GB/s: what a TP group gets when each of
# its members sits in a different server, or on a cluster with one port per server. Over it
# the all-reduces grow towards the compute and pass it at t = 8, while the compute per GPU
# shrinks as 1/t. (Compute at peak is the best case; Megatron-LM 2021's runs reach 44-52 %
# of peak, Table 1, which only delays the crossing.)
#
# A TP group of 16 on DGX servers fares better than one port suggests: each server holds 8
# of its members, each with its own port, and NCCL drives all 8 ports at once (200 GB/s
# together; NCCL's documentation, nccl-tests' PERFORMANCE.md). The cost model's link for a
# group of t GPUs on servers of 8, both ways:

# %%
# NBVAL_CHECK_OUTPUT
flat_ring = cm.make_cluster("A100", 8, network_ports=1, collectives="flat-ring")
for t in (16, 32):
    took = {}
    for name, c in (("dgx", cluster), ("flat", flat_ring)):
        bandwidth, latency = c.group_link(t, t, 1)
        took[name] = 4 * cm.ring_allreduce_time_s(t, payload, bandwidth, latency)
    print(f"t={t}: all-reduces {took['dgx'] * 1e3:5.2f} ms over DGX servers' 8 ports, "
          f"{took['flat'] * 1e3:5.2f} ms through one port per server; compute "
          f"{compute / t / cluster.gpu.peak_flops * 1e3:4.2f} ms per GPU at peak")

# %% [markdown]
# Leaving the server is a real cliff, but not the tenfold one that one port suggests:
# Megatron-LM 2021's Fig. 13 reports "up to 2x" lower throughput for other (t, p) than t = 8,
# and the cost model predicts about 1.3x at t = 16 and 2x at t = 32 (notebook 05 prints it). These all-reduces sit on the critical path, so the GPUs wait on
# the network. Hence Megatron-LM 2021's first takeaway: tensor parallelism up to the GPUs of
# one server, pipeline parallelism across servers.
#
# <div style="border: 2px solid #4C72B0; border-radius: 6px; padding: 10px;">
# <b>Takeaway.</b> Tensor parallelism splits every layer's matrices over t ranks (A by
# columns, B by rows, attention by heads) and keeps the model exactly the same: each rank
# holds 1/t of the weights and all ranks work at once. The price is 2 all-reduces forward
# and 2 backward per layer, 8bsh(t-1)/t elements per rank, which hardly shrinks with t and
# sits on the critical path: keep the TP group inside one NVLink server.
# </div>
#
# ### Exercises (Part 1)
#
# **1.** Write the forward pass of a column-parallel linear layer that returns the full
# output on every rank: `my_column_forward(x, weight, bias, group)` receives this rank's
# rows of the dense `weight` (shape `(out/t, in)`) and of `bias`. Compute your slice with
# `F.linear`, then gather the slices of all ranks along the last dim with `comm.all_gather`
# (same signature as `torch.distributed.all_gather`). Your function may use `torch`, `F`,
# `dist` and `comm`; the checker runs it on 2 ranks.

# %%
import torch
import torch.distributed as dist
import torch.nn.functional as F

from lessonlib import comm
from lessonlib.exercises import tp as ex


def my_column_forward(x, weight, bias, group):
    raise NotImplementedError


ok = ex.check_column_forward(my_column_forward)

# %% tags=["solution", "hide-input"] jupyter={"source_hidden": true}
# NBVAL_CHECK_OUTPUT
def my_column_forward(x, weight, bias, group):
    y = F.linear(x, weight, bias).contiguous()                  # (b, s, out/t)
    slices = [torch.empty_like(y) for _ in range(dist.get_world_size(group))]
    comm.all_gather(slices, y, group=group)
    return torch.cat(slices, dim=-1)                            # (b, s, out)


assert ex.check_column_forward(my_column_forward)

# %% [markdown]
# **2.** Write Megatron's **f** as its two halves: `my_f_forward(x, group)` and
# `my_f_backward(grad, group)`. The checker wraps them in an autograd function and runs it
# on 2 ranks.

# %%
def my_f_forward(x, group):
    raise NotImplementedError


def my_f_backward(grad, group):
    raise NotImplementedError


ok = ex.check_f_operator(my_f_forward, my_f_backward)

# %% tags=["solution", "hide-input"] jupyter={"source_hidden": true}
# NBVAL_CHECK_OUTPUT
def my_f_forward(x, group):
    return x.clone()


def my_f_backward(grad, group):
    grad = grad.clone()
    comm.all_reduce(grad, group=group)
    return grad


assert ex.check_f_operator(my_f_forward, my_f_backward)

# %% [markdown]
# **3.** Write `my_tp_bytes(b, s, h, t)`: the bytes one rank sends per transformer layer
# and micro-batch in fp32 with ring all-reduces. Check it against GPT-3's layer at t = 8.

# %%
def my_tp_bytes(b, s, h, t):
    raise NotImplementedError


ok = ex.check_tp_bytes(my_tp_bytes)

# %% tags=["solution", "hide-input"] jupyter={"source_hidden": true}
# NBVAL_CHECK_OUTPUT
def my_tp_bytes(b, s, h, t):
    all_reduces, payload = 4, b * s * h * 4
    return all_reduces * 2 * (t - 1) / t * payload


assert ex.check_tp_bytes(my_tp_bytes)

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
print(f"{'':>2} {'':>3} {'(p-1)/(m+p-1)':>13} {'(p-1)/m':>17} {'(wall)':>16} {'(wall)':>15}")
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
                            schedules=("gpipe", "1f1b", "interleaved"), steps=5, warmup=1,
                            timeout=300)   # 18 cases; a loaded laptop may need over 2 minutes
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
# The difference can also come out negative when other work loads the machine: the
# theory counts idle slots as long as busy ones, but while the line fills and drains one
# rank works alone, at full speed, and in the steady state the two ranks slow each other
# down, so the idle slots come out shorter. Every bubble below is a share of the step's
# wall time, the convention of `(p-1)/(v·m+p-1)`.

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
# And measured while you watch: the widget runs one step of the chosen schedule on p real
# ranks with m micro-batches and draws its Gantt chart and bubble. (Executed headless, it
# draws once, with its defaults.)

# %%
# NBVAL_IGNORE_OUTPUT
from lessonlib.viz import live

live.pipeline_widget()

# %% [markdown]
# <div style="border: 2px solid #4c72b0; border-radius: 6px; padding: 10px 14px;">
# <b>Takeaway.</b> A pipeline idles (p-1)/(m+p-1) of its wall time, which is (p-1)/m
# of the ideal, bubble-free compute time (Megatron-LM 2021's way of writing the same idle
# time): more micro-batches shrink the bubble, and interleaving v chunks per device divides
# the (p-1)/m by v, at v times the messages. 1F1B does <i>not</i> shrink the bubble; it caps each stage's activations at
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

# %% [markdown]
# ## Tensor or pipeline? The bytes decide where each one goes
#
# Per transformer layer and micro-batch, tensor parallelism moves `8·b·s·h·(t-1)/t` elements
# per rank (Megatron-LM 2021, §3.2); a pipeline moves `b·s·h` elements per stage boundary,
# `b·s·h/t` with scatter/gather (§4.1), however many layers a stage holds. For GPT-3's
# shape, with the cost model's functions:

# %%
# NBVAL_CHECK_OUTPUT
from lessonlib import costmodel as cm

g = cm.MODELS["gpt3-175B"]
tp_elems = cm.tp_elements_per_layer(1, g.s, g.h, 8)
pp_elems = cm.pp_elements_per_boundary(1, g.s, g.h, t=8)
print(f"TP, t = 8: {tp_elems * 2 / 1e6:,.0f} MB per layer per micro-batch, x {g.L} layers")
print(f"PP with scatter/gather, t = 8: {pp_elems * 2 / 1e6:,.1f} MB per stage boundary per micro-batch")
print(f"ratio for a 12-layer stage: {12 * tp_elems / pp_elems:,.0f}x more bytes for TP")

# %% [markdown]
# > **Takeaway.** Tensor parallelism keeps every GPU busy but talks at every layer, so it
# > belongs where bandwidth is highest: inside one server, over NVLink. Pipeline parallelism
# > talks only at stage boundaries, so it can cross the slower links between servers, and
# > its bubble, (p-1)/(m+p-1) of the wall time, shrinks with more micro-batches. 1F1B keeps GPipe's bubble and cuts the
# > activations each stage holds. Megatron-LM 2021's first takeaway says the same: TP up to
# > the GPUs of a server, PP across servers. Lesson 05 puts them together with data
# > parallelism.
