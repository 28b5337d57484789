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
# Lesson 03 cut the castle by floors and watched all but one builder wait. Two ways out,
# both run here for real:
#
# * **Part 1, tensor parallelism**: the builders share every wall. Each matrix is split
#   over t ranks, so every rank works all the time, at the price of all-reduces in every
#   layer.
# * **Part 2, pipeline parallelism**: the builders keep their floors, but the order is cut
#   into micro-batches so the line fills up (GPipe, 1F1B). The price is the bubble while
#   the line fills and drains, and the activations each stage keeps.
#
# Each part: the idea, a prediction from the cost model, a real run on CPU ranks (GPUs with
# NCCL when you have them), measured against predicted, a takeaway, exercises.
#
# *Watch and read:* Stanford MLSys seminar #83, Deepak Narayanan, "Training Large Language
# Models at Scale", 06:56-13:45; Shoeybi et al., "Megatron-LM" (2019), §3; Huang et al.,
# "GPipe" (2019), §2; Narayanan et al. (SC21), §2.

# %%
import json
from pathlib import Path

import matplotlib.pyplot as plt

import lessonlib
from lessonlib import costmodel as cm
from lessonlib.claims import claim
from lessonlib.pipeline import runs
from lessonlib.pipeline import schedules
from lessonlib.pipeline.validate import ScheduleError, simulate
from lessonlib.tensor_parallel import runs as tp_runs
from lessonlib.viz import live
from lessonlib.viz import pipeline as vp
from lessonlib.viz import tp as tpviz

# %% [markdown]
# ## Part 1 · Tensor parallelism: many builders on one wall
#
# **The castle.** Now the builders stand side by side at the *same* wall, each laying its
# own vertical slice of every course of bricks; after each section they line their slices
# up. Nobody waits for another room, but they meet often, so they had better stand close.
#
# In a transformer the walls are the big matrices. Megatron-LM (2019, §3) splits the MLP
# `Z = GeLU(X A) B` over t ranks:
#
# * **A by columns**: rank r computes `Y_r = GeLU(X A_r)`, its slice of the hidden layer
#   (GeLU acts on each element, so no message is needed).
# * **B by rows**: rank r computes `Y_r B_r`, a partial sum of `Z`; one **all-reduce**
#   adds the t partial sums.
#
# Two operators hold it together. **g** sits after B: all-reduce forward, identity backward.
# **f** sits before A: identity forward (every rank already has X), all-reduce backward
# (each rank's gradient of X is only a partial sum). Attention splits the same way, by
# heads. Below, each colour is one rank; the widget shows other t.

# %%
tpviz.weight_split_widget(heads=8)

# %% [markdown]
# ### 1.1 Prediction: memory falls as 1/t, communication does not
#
# One transformer layer has `12h² + 13h` parameters (Megatron-LM 2021, Eq. 2); a rank holds
# about 1/t of them. The price, per layer and micro-batch: 2 all-reduces forward (g after
# attention and after the MLP) and 2 backward (the two f's), each of a `(b, s, h)` tensor.
# A ring all-reduce of S bytes sends 2(t-1)/t·S per rank, so a layer sends
# `8bsh(t-1)/t` elements per rank (§3.2). For the layer we are about to run (b = 4,
# s = 32, h = 128, 8 heads, fp32):

# %%
# NBVAL_CHECK_OUTPUT
B, S, H, HEADS, TS = 4, 32, 128, 8, (1, 2, 4)
layer = cm.GPT(L=1, h=H, a=HEADS, s=S, V=64)
print(f"{'t':>2} {'weights per rank':>17} {'sent per rank, fwd+bwd':>23}")
for t in TS:
    print(f"{t:>2} {4 * layer.layer_params() / t:>11,.0f} bytes "
          f"{4 * cm.tp_elements_per_layer(B, S, H, t):>17,.0f} bytes")

# %% [markdown]
# ### 1.2 The real run: t = 1, 2 and 4, equal to the dense model
#
# `tp_runs.run_layer_reports` starts 4 ranks in groups of t (t = 1, 2 and 4 in one launch),
# builds the dense MLP, a transformer layer and the tiny GPT from one seed, splits them,
# trains dense and split copies side by side for 3 SGD steps and compares outputs,
# gradients and weights; the ledger records every message.

# %%
# NBVAL_IGNORE_OUTPUT
tp_reports = tp_runs.run_layer_reports(4, ts=TS, b=B, s=S, h=H, heads=HEADS, steps=3,
                                       kinds=("mlp", "block", "gpt"), with_torch=True,
                                       timeout=240)
for t in TS:
    print(f"t={t}: " + ", ".join(
        f"{kind} {max(tp_reports[0][t][kind][k] for k in ('output', 'grads', 'weights_after_steps')):.1e}"
        for kind in ("mlp", "block", "gpt")) + " (largest relative error)")

# %%
# NBVAL_CHECK_OUTPUT
TOL = 2e-6   # relative to the largest value; fp32 sums in another order differ around 1e-7
for t in TS:
    for kind in ("mlp", "block", "gpt"):
        checks = ("output", "input_grad", "grads", "weights_after_steps")
        same = all(r[t][kind][c] < TOL for r in tp_reports for c in checks if c in r[t][kind])
        print(f"t={t} {kind:>5}: equal to the dense model on all 4 ranks: {same}")

# %% [markdown]
# Measured against predicted: the all-reduces the ledger saw in the first step on rank 0
# (each a `(b, s, h)` payload, of which a ring moves 2(t-1)/t per rank), and the bytes of
# parameters each rank holds, next to `(12h² + 13h)/t`:

# %%
# NBVAL_CHECK_OUTPUT
rows = []
for t in TS:
    mlp, block = tp_reports[0][t]["mlp"], tp_reports[0][t]["block"]
    sent = block["forward"]["ring_bytes_per_rank"] + block["backward"]["ring_bytes_per_rank"]
    rows.append({"t": t, "param_bytes": block["param_bytes"],
                 "param_bytes_predicted": 4 * layer.layer_params() / t, "comm_bytes": sent,
                 "comm_bytes_predicted": 4 * cm.tp_elements_per_layer(B, S, H, t)})
    print(f"t={t}: MLP {mlp['forward']['all_reduce']} all-reduce forward, "
          f"{mlp['backward']['all_reduce']} backward | layer {block['forward']['all_reduce']} + "
          f"{block['backward']['all_reduce']}, payload {block['forward']['payload_bytes'] // 2:,} "
          f"bytes each, ring {sent:,.0f} bytes per rank (predicted "
          f"{rows[-1]['comm_bytes_predicted']:,.0f})")
    print(f"     weights {block['param_bytes']:,} bytes per rank (predicted "
          f"{rows[-1]['param_bytes_predicted']:,.0f}; dense {block['dense_param_bytes']:,})")
print("the small weight gap, 6h x 4 x (1 - 1/t) bytes, is what stays whole on every rank: "
      "the two LayerNorms and the biases added after g")
tpviz.plot_tp_scaling(rows)
plt.show()

# %% [markdown]
# ### 1.3 The same layers in PyTorch: DTensor
#
# PyTorch ships tensor parallelism as `ColwiseParallel` and `RowwiseParallel` plans applied
# with `parallelize_module` on a `DeviceMesh`. The launch above also split the *same* dense
# weights that way; below it, speed: `labs/tp.py` timed both, step by step in turn, on a
# 2-core CPU machine (stored with its command).

# %%
# NBVAL_CHECK_OUTPUT
for t in TS:
    for kind in ("mlp", "block"):
        theirs = [r[t][kind]["torch"] for r in tp_reports]
        same = all(max(x["output"], x["input_grad"], x["grads"]) < TOL for x in theirs)
        print(f"t={t} {kind:>5}: DTensor equals the dense model: {same}; weight bytes per "
              f"rank {theirs[0]['param_bytes']:,} (lessonlib "
              f"{tp_reports[0][t][kind]['param_bytes']:,})")

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
# <!-- no measured claim: the lab's ratios are printed above; 200 Gb/s is a port's speed -->
# Same model, same memory. DTensor decides each tensor's layout at run time, work that
# plain f and g skip, and its transformer layer sends 6 all-reduces instead of 4: Q, K and
# V are three `ColwiseParallel` modules, where lessonlib fuses them behind one f.
#
# ### 1.4 Why tensor parallelism wants NVLink
#
# The all-reduces sit *inside* every layer, so their time adds to the step. The cost
# model's alpha-beta ring on a DGX A100 cluster (NVLink inside a server, one 200 Gb/s
# InfiniBand port per GPU), for one GPT-3 layer (b = 1, s = 2048, h = 12288, 16-bit),
# forward + backward. The last rows are groups larger than a server of 8: NCCL drives the
# server's 8 ports at once, far better than one port per server.

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
    print(f"t={t:>2}: all-reduces {r['nvlink_s'] * 1e3:5.2f} ms over NVLink, "
          f"{r['infiniband_s'] * 1e3:5.2f} ms over one InfiniBand port; "
          f"compute {r['compute_s'] * 1e3:5.2f} ms per GPU at peak")
flat_ring = cm.make_cluster("A100", 8, network_ports=1, collectives="flat-ring")
for t in (16, 32):
    took = {}
    for name, c in (("dgx", cluster), ("flat", flat_ring)):
        bandwidth, latency = c.group_link(t, t, 1)
        took[name] = 4 * cm.ring_allreduce_time_s(t, payload, bandwidth, latency)
    print(f"t={t}: all-reduces {took['dgx'] * 1e3:5.2f} ms over DGX servers' 8 ports, "
          f"{took['flat'] * 1e3:5.2f} ms through one port per server; compute "
          f"{compute / t / cluster.gpu.peak_flops * 1e3:4.2f} ms per GPU at peak")
tpviz.plot_link_times(link_rows)
plt.show()
share = {r["t"]: (r["nvlink_s"] / r["compute_s"], r["infiniband_s"] / r["compute_s"])
         for r in link_rows}
claim("over NVLink the all-reduces cost under a fifth of the compute, even at t = 8",
      all(nv < 0.2 for nv, _ in share.values()),
      numbers=", ".join(f"t={t}: {nv:.0%}" for t, (nv, _) in share.items()))
claim("over one InfiniBand port they grow with t and pass the compute at t = 8",
      share[2][1] < share[4][1] < 1 < share[8][1],
      numbers=", ".join(f"t={t}: {ib:.0%}" for t, (_, ib) in share.items()))

# %% [markdown]
# Over NVLink the all-reduces cost a small fraction of the compute, even at t = 8; over one
# InfiniBand port their share grows with t, because the compute per GPU falls as 1/t while
# the all-reduces do not, and at t = 8 they take longer than the compute (the checks
# above). Leaving the server is a cliff (Megatron-LM 2021's Fig. 13:
# "up to 2x" lower throughput), because these all-reduces sit on the critical path.
# When it is a long sequence, not the weights, that does not fit, a fourth axis splits the tokens themselves over a ring of ranks: [Deep dive: long sequences](12-deep-dive-long-sequences.ipynb).
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
# `F.linear`, then gather all slices along the last dim with `comm.all_gather` (the
# signature of `torch.distributed.all_gather`). The checker runs it on 2 ranks.

# %%
import torch
import torch.distributed as dist
import torch.nn.functional as F

from lessonlib import comm
from lessonlib.exercises import tp as ex


def my_column_forward(x, weight, bias, group):
    raise NotImplementedError


ex.check_column_forward(my_column_forward)

# %% tags=["solution", "hide-input", "hide-output"] jupyter={"outputs_hidden": true, "source_hidden": true}
# NBVAL_CHECK_OUTPUT
def column_forward_solution(x, weight, bias, group):
    y = F.linear(x, weight, bias).contiguous()                  # (b, s, out/t)
    slices = [torch.empty_like(y) for _ in range(dist.get_world_size(group))]
    comm.all_gather(slices, y, group=group)
    return torch.cat(slices, dim=-1)                            # (b, s, out)


ex.check_column_forward(column_forward_solution)

# %% [markdown]
# **2.** Write Megatron's **f** as its two halves: `my_f_forward(x, group)` and
# `my_f_backward(grad, group)`. The checker wraps them in an autograd function and runs it
# on 2 ranks.

# %%
def my_f_forward(x, group):
    raise NotImplementedError


def my_f_backward(grad, group):
    raise NotImplementedError


ex.check_f_operator(my_f_forward, my_f_backward)

# %% tags=["solution", "hide-input", "hide-output"] jupyter={"outputs_hidden": true, "source_hidden": true}
# NBVAL_CHECK_OUTPUT
def f_forward_solution(x, group):
    return x.clone()


def f_backward_solution(grad, group):
    grad = grad.clone()
    comm.all_reduce(grad, group=group)
    return grad


ex.check_f_operator(f_forward_solution, f_backward_solution)

# %% [markdown]
# **3.** Going from t = 4 to t = 8 halves the weights each rank holds. By what factor does
# the number of bytes each rank *sends* per layer and micro-batch change? Predict it from
# the cost of a ring all-reduce before computing anything (the table in 1.1 stops at t = 4).

# %%
my_ratio = None     # bytes sent per rank at t = 8, divided by those at t = 4
ex.check_tp_traffic_ratio(my_ratio, t_from=4, t_to=8)

# %% tags=["solution", "hide-input", "hide-output"] jupyter={"outputs_hidden": true, "source_hidden": true}
# NBVAL_CHECK_OUTPUT
ratio_solution = cm.tp_elements_per_layer(B, S, H, 8) / cm.tp_elements_per_layer(B, S, H, 4)
ex.check_tp_traffic_ratio(ratio_solution, t_from=4, t_to=8)

# %% [markdown]
# ## Where a layer's activations go
#
# The weights split as 1/t; the activations do not. Korthikanti et al. (2022, Table 2)
# count the bytes one layer keeps for backward, in 16-bit: `sbh·(34 + 5as/h)` without
# parallelism. Tensor parallelism splits the `24sbh + 5as²b` that live between f and g,
# but **replicates `10sbh`** on every rank: the two LayerNorms' inputs, their outputs
# (the inputs of the column layers) and two dropout masks. Three ways to shrink it:
#
# * **Sequence parallelism (SP)** runs the LayerNorms on s/t rows per rank. A ring
#   all-reduce is a reduce-scatter followed by an all-gather, so g's all-reduce becomes a
#   reduce-scatter along the sequence and the all-gather moves to the next column layer's
#   input: the same bytes, and now **every** activation is split, `sbh·(34 + 5as/h)/t`.
# * **Selective recompute** keeps no softmax for backward and recomputes the attention
#   core there: the `5as²b` term, which grows with s², for a few percent more FLOPs.
# * **Full recompute** keeps only the layer's input (`2sbh`) and runs the whole layer again
#   in backward: about a third more compute.
#
# Recompute trades FLOPs for bytes; SP costs neither. Here are SP's two operators, beside f
# and g in `ops.py` (Korthikanti calls f and g "f and f̄", and this pair "g and ḡ"):

# %%
from lessonlib.tensor_parallel import ops as tp_ops
from lessonlib.tensor_parallel import sequence as tp_sequence
from lessonlib.tensor_parallel import sequence_runs as sp_runs
from lessonlib.claims import claim, within
from lessonlib.costmodel import korthikanti2022 as k22
from lessonlib.costmodel import memory as cm_memory
from lessonlib.viz import activations as actviz
from lessonlib.viz.source import show

show(tp_ops._GatherSequence)

# %%
show(tp_ops._ReduceScatterSequence)

# %% [markdown]
# A LayerNorm on s/t rows has one catch: its weight and bias are whole on every rank, but
# each rank's rows give only part of their gradient. f, placed on the weights themselves,
# sums them (Megatron all-reduces its "sequence-parallel" parameters for the same reason;
# the bug zoo's `sp_layernorm_grad_not_summed` leaves it out, and only the gradients show
# it). And a column layer under SP keeps just its s/t rows of input for backward, gathering
# them again there: keeping the gathered input would replicate it once more.

# %%
show(tp_sequence.SequenceParallelLayerNorm.forward)

# %% [markdown]
# ### Prediction: Table 2, and the course's own layer
#
# For one GPT-3 layer (b = 1, t = 8), Table 2 in GB per layer. The course's layer is not
# Megatron's, so its exact count differs term by term: CPU's attention kernel keeps one
# log-sum-exp per row instead of the s × s softmax (selective recompute inside the kernel),
# there is no dropout, and each LayerNorm also keeps its mean and 1/std.

# %%
# NBVAL_CHECK_OUTPUT
modes = {"none (t = 1)": (1, False, "none"), "TP": (8, False, "none"),
         "TP+SP": (8, True, "none"), "TP + selective": (8, False, "selective"),
         "TP+SP + selective": (8, True, "selective"), "full recompute": (8, False, "full")}
for name, (t, sp, recompute) in modes.items():
    gb = cm.activation_bytes_per_layer(gpt3, 1, t, sp, recompute) / 1e9
    print(f"{name:>18}: {gb:6.3f} GB per layer per GPU")
print()
print(f"{'term':<46} {'Table 2 (x sbh)':>15}  {'course layer':>13}  why")
for row in cm_memory.course_vs_table2():
    print(f"{row['term']:<46} {row['table2']:>15}  {row['course']:>13}  {row['why']}")

# %% [markdown]
# ### The real run: saved bytes measured, to the byte
#
# `lessonlib.activations.saved_bytes` counts what autograd keeps during one forward pass
# (each storage once, the weights left out; a checkpoint's kept input counted too). One
# launch of 4 ranks measures the layer (b = 2, s = 16, h = 32, 4 heads, float64) in every
# mode at t = 1, 2, 4, beside `course_layer_activation_bytes`, the formula in
# `costmodel/memory.py`.

# %%
# NBVAL_IGNORE_OUTPUT
acts = sp_runs.run(4, sp_runs.lesson_report, timeout=240)
print(f"{len(acts)} ranks measured")

# %%
# NBVAL_CHECK_OUTPUT
print(f"{'mode':>16} " + " ".join(f"{f't={t} measured / formula':>26}" for t in (1, 2, 4)))
every = []
for mode in ["dense", *sp_runs.MODES]:
    cells = []
    for t in (1, 2, 4):
        got = [r["bytes"][t][mode] for r in acts]
        every += [(g["measured"], g["formula"]) for g in got]
        cells.append(f"{got[0]['measured']:>12,} / {got[0]['formula']:<11,}")
    print(f"{mode:>16} " + " ".join(cells))
claim("on every rank, in every mode and at every t, the measured bytes equal the formula",
      all(m == f for m, f in every), numbers=f"{len(every)} measurements")
for t in (2, 4):
    sp_kept, dense = acts[0]["bytes"][t]["tp+sp"]["measured"], acts[0]["bytes"][t]["dense"]["measured"]
    claim(f"at t = {t} TP+SP keeps 1/t of the dense layer's bytes on each rank",
          sp_kept * t == dense, numbers=f"{sp_kept:,} x {t} = {dense:,}")

# %% [markdown]
# SP at t ranks keeps exactly 1/t of the dense layer; TP alone keeps the replicated part
# (`4bsh + 4bs` elements here) on every rank, whatever t.
#
# And the parallel layer is still the dense layer, in every mode (float64, 3 SGD steps),
# and equal to PyTorch's own plan: `SequenceParallel` on the LayerNorms,
# `PrepareModuleInput` gathering the sequence, `ColwiseParallel` and
# `RowwiseParallel(output_layouts=Shard(1))`, on the same weights:

# %%
# NBVAL_CHECK_OUTPUT
for t in (2, 4):
    for mode in ("tp+sp", "tp+sp+selective", "full", "gpt+sp"):
        worst = max(r["parity"][t][mode][k] for r in acts
                    for k in ("output", "grads", "weights_after_steps"))
        print(f"t={t} {mode:>16}: equal to the dense model: {worst < 1e-12}")
    theirs = max(max(r["parity"][t]["torch+sp"].values()) for r in acts)
    print(f"t={t} PyTorch's SP plan: equal to the dense layer and to ours: {theirs < 1e-12}")

# %% [markdown]
# ### What each sends
#
# The ledger of one forward and backward of the layer at t = 2 and 4: SP's all-gathers and
# reduce-scatters move exactly the ring bytes of TP's all-reduces. On top come two
# all-gathers in backward that re-gather the column layers' kept rows (the price of keeping
# 1/t; Megatron overlaps them with the input-gradient GEMM) and six all-reduces of h
# elements that sum the LayerNorm and bias gradients. Full recompute repeats the forward's
# collectives in backward, all but the last (PyTorch's checkpoint stops once it has rebuilt
# what backward needs, and nothing keeps the MLP's summed output).

# %%
# NBVAL_CHECK_OUTPUT
from lessonlib.tensor_parallel.runs import ring_bytes_per_rank
from types import SimpleNamespace


def ring(events, t):
    return sum(ring_bytes_per_rank(SimpleNamespace(op=op, bytes=n, group_size=t))
               for op, n in events)


for t in (2, 4):
    led = acts[0]["ledger"][t]
    e, bsh, h = led["element_size"], led["b"] * led["s"] * led["h"], led["h"]
    tp_ev = led["tp"]["forward"]["events"] + led["tp"]["backward"]["events"]
    sp_ev = led["tp+sp"]["forward"]["events"] + led["tp+sp"]["backward"]["events"]
    regather = [("all_gather", bsh * e // t)] * 2
    sums = [ev for ev in sp_ev if ev[0] == "all_reduce"]
    conjugates = [ev for ev in sp_ev if ev[0] != "all_reduce"]
    for ev in regather:
        conjugates.remove(ev)
    kinds = lambda evs: ", ".join(f"{sum(1 for x in evs if x[0] == k)} {k}"  # noqa: E731
                                  for k in ("all_reduce", "all_gather", "reduce_scatter"))
    print(f"t={t}: TP    {kinds(tp_ev)}: {ring(tp_ev, t):,.0f} bytes per rank")
    print(f"     TP+SP {kinds(conjugates)}: {ring(conjugates, t):,.0f} bytes per rank, "
          f"+ 2 re-gathers {ring(regather, t):,.0f} + 6 gradient sums of h "
          f"{ring(sums, t):,.0f}")
    claim(f"at t = {t} SP's gathers and reduce-scatters send exactly TP's all-reduce bytes",
          ring(conjugates, t) == ring(tp_ev, t),
          numbers=f"{ring(conjugates, t):,.0f} = {ring(tp_ev, t):,.0f}")
    again = list(led["full"]["backward"]["events"])
    for ev in led["tp"]["backward"]["events"]:
        again.remove(ev)
    print(f"     full recompute repeats in backward: {kinds(again)} of the forward's "
          f"{kinds(led['tp']['forward']['events'])}")

# %% [markdown]
# ### Activation memory against sequence length
#
# Left, any preset at any t (Table 2's formulas, all L layers, one micro-batch); right, the
# course's layer: the exact formula as lines and the bytes measured above as dots, at s =
# 8, 16 and 32. The attention term makes "no parallelism" and TP curve upward with s;
# SP + selective is a straight line, 1/t of the dense layer's 34sbh.

# %%
points = [(mode, s, acts[0]["bytes_by_s"][s][mode]["measured"])
          for s in acts[0]["bytes_by_s"] for mode in actviz.MEASURED_AS]
measured = {"b": 2, "h": 32, "a": 4, "t": 2, "element_size": 8, "points": points}
actviz.activation_plot("gpt3-175B", t=8, b=1, measured=measured)
plt.show()
actviz.activation_widget(measured)

# %% [markdown]
# ### What recompute costs: the cost model against Korthikanti's Tables 4 and 5
#
# Nothing here is fitted to these tables: the cost model's constants were fixed once on
# Megatron-LM 2021's Table 1, so each row is a **check**. Table 4 times one layer of a
# 22B model (t = 8, micro-batch 4) on A100s; the model's layer time is the difference of
# two one-stage estimates (L = 2 minus L = 1). Table 5 times whole iterations.

# %%
# NBVAL_CHECK_OUTPUT
print(f"{'Table 4, one 22B layer':<32} {'published':>9} {'predicted':>9}   overhead pub / pred")
for r in k22.table4_rows():
    print(f"{r['mode']:<32} {r['published_ms']:7.1f}ms {r['predicted_ms']:7.1f}ms   "
          f"{r['published_overhead']:+6.1%} / {r['predicted_overhead']:+6.1%}")
    within(f"{r['mode']}: the published layer time", r["published_ms"], r["predicted_ms"], 0.15)
rows4 = {r["mode"]: r for r in k22.table4_rows()}
share = (rows4["selective recompute"]["predicted_overhead"]
         / rows4["selective recompute"]["published_overhead"])
claim("the model gives selective recompute about half the paper's overhead: it counts the "
      "attention core's FLOPs and bytes, not how poorly its small kernels run",
      0.3 < share < 0.7, numbers=f"{share:.2f} of it")
print()
for r in k22.table5_rows():
    print(f"Table 5 {r['model']:>5} {r['mode']:<15} published {r['published_s']:6.2f} s, "
          f"predicted {r['predicted_s']:6.2f} s ({r['error']:+.1%})")
for r in k22.table5_rows()[:4]:
    within(f"{r['model']} {r['mode']}: the published iteration", r["published_s"],
           r["predicted_s"], 0.15)
slow = [r["error"] for r in k22.table5_rows()[4:]]
claim("530B and 1T come out 15-25 % slow, the bias the one GEMM efficiency has on the "
      "largest models (Megatron-LM 2021's Table 1 shows it too)",
      all(0.15 < err < 0.25 for err in slow), numbers=", ".join(f"{x:+.1%}" for x in slow))
for r in k22.table5_speedups():
    within(f"{r['model']}: full recompute / selective+SP, published", r["published"],
           r["predicted"], 0.15)

# %% [markdown]
# **MFU or hardware FLOPs?** A TFLOP/s figure means nothing until it says what it counts.
# Table 5 reports both: *model* FLOPs utilization counts the FLOPs the model needs
# (`72BLsh²(1 + s/6h + V/12hL)`, App. A), whatever the implementation does; *hardware*
# FLOPs utilization also counts what recompute repeats (with selective recompute,
# `s/3h` in place of `s/6h`). The same step, counted two ways: the ratio of the two counts
# is the ratio of the published utilizations. Megatron-LM 2021's TFLOP/s (Table 1, the
# cost model's `tflops_per_gpu`) count full recompute's extra forward, so they are hardware
# FLOPs, above the MFU of the same run (`Estimate.mfu`).

# %%
# NBVAL_CHECK_OUTPUT
for r in k22.utilization_rows():
    print(f"{r['model']:>5}: MFU {r['mfu']:.1f} %, HFU {r['hfu']:.1f} %")
    within(f"{r['model']}: HFU / MFU published", r["published"], r["predicted"], 0.01)

# %% [markdown]
# On CPU ranks, each mode's step, lessonlib against PyTorch's plan on the same weights
# (`labs/tp.py`, 2 ranks, b = 8, s = 128, h = 256, 8 heads, fp32; stored with its command):

# %%
# NBVAL_IGNORE_OUTPUT
sp_lab = json.loads((DATA / "tp_sp_cpu_results.json").read_text())
for record in sp_lab["runs"]:
    mode = ("TP+SP" if record["settings"]["sequence_parallel"] else "TP") + \
        f", recompute {record['settings']['recompute']}"
    ours, theirs = (record["results"][n]["layers"]["block"] for n in ("lessonlib", "torch"))
    ratio = record["paired_ratio_lessonlib_over_torch"]["block"]
    print(f"{mode:<28} layer step lessonlib {ours['step_time_s'] * 1e3:6.1f} ms, PyTorch "
          f"{theirs['step_time_s'] * 1e3:6.1f} ms (ratio {ratio:.2f}); kept for backward "
          f"{record['saved_bytes']['block']['lessonlib']:,} vs "
          f"{record['saved_bytes']['block']['torch']:,} bytes")
    print(f"{'':<28} {record['command']}")
sp_records = [r for r in sp_lab["runs"] if r["settings"]["sequence_parallel"]]
claim("under SP PyTorch's plan keeps more bytes for backward than lessonlib, in every mode",
      all(r["saved_bytes"]["block"]["torch"] > r["saved_bytes"]["block"]["lessonlib"]
          for r in sp_records if r["settings"]["recompute"] != "full"),
      numbers="recompute none and selective")

# %% [markdown]
# PyTorch's plan keeps more bytes under SP: its column layers keep the gathered input, where
# lessonlib keeps only this rank's rows and gathers them again in backward (with full
# recompute both keep only the layer's input). The step times come from a shared 2-core
# machine: read them as "same order", not as the cost of recompute, which the cost model
# above measures against the paper.
#
# <div style="border: 2px solid #4C72B0; border-radius: 6px; padding: 10px;">
# <b>Takeaway.</b> Tensor parallelism splits the weights by t but leaves 10sbh of every
# layer's activations replicated. Sequence parallelism splits those along the sequence for
# the same communication bytes (all-gathers and reduce-scatters instead of all-reduces), so
# each rank keeps 1/t of the layer: that is why Megatron turns it on whenever t > 1.
# Selective recompute then drops the attention term that grows with s², for a few percent
# more FLOPs; full recompute keeps only each layer's input, for about a third more compute.
# </div>

# %% [markdown]
# **Exercise.** One GPT-3 layer on t = 8 GPUs (b = 1): by what factor does turning on
# sequence parallelism shrink the activations each GPU keeps for backward? Predict it from
# Table 2 before computing (5as/h = 80 for GPT-3).

# %%
my_sp_ratio = None     # activations per GPU with TP alone, divided by those with TP+SP
ex.check_sp_activation_ratio(my_sp_ratio, "gpt3-175B", t=8)

# %% tags=["solution", "hide-input", "hide-output"] jupyter={"outputs_hidden": true, "source_hidden": true}
# NBVAL_CHECK_OUTPUT
sp_ratio_solution = (cm.activation_bytes_per_layer(gpt3, 1, 8)
                     / cm.activation_bytes_per_layer(gpt3, 1, 8, sequence_parallel=True))
ex.check_sp_activation_ratio(sp_ratio_solution, "gpt3-175B", t=8)

# %% [markdown]
# ## Part 2 · Pipeline parallelism: the assembly line with micro-batches
#
# **The assembly line.** In lesson 03 each of p builders idled (p-1)/p of the time. GPipe
# (Huang et al. 2019) cuts the order into **m micro-batches**: while builder 1 works on
# micro-batch 0, builder 0 starts micro-batch 1. The line still fills and drains; that
# idle time is the **bubble**. The popular claim that the 1F1B schedule "shrinks the
# bubble" is wrong: it keeps the bubble and cuts the **memory**, the activations each stage
# holds for its backward pass. Nor is the bubble a law of nature: §2.5 splits each backward
# in two and fills most of the bubble with the half nobody waits for.
#
# ### 2.1 A schedule is data
#
# A schedule is, for every stage, the order of its forwards `F<i>` and backwards `B<i>` of
# the micro-batches `i`. GPipe runs all forwards, then all backwards. 1F1B (PipeDream-Flush,
# Narayanan et al. 2021) lets stage `s` run `p - s - 1` warm-up forwards, then alternates
# one forward and one backward, then drains the backwards. Being data, a schedule can be
# validated before any process starts: GPipe's order on stage 1 with 1F1B's on the others
# deadlocks.

# %%
# NBVAL_CHECK_OUTPUT
print("GPipe\n" + schedules.describe(schedules.gpipe(4, 6)))
print("\n1F1B\n" + schedules.describe(schedules.one_f_one_b(4, 6)))
orders = [schedules.one_f_one_b_order(4, 6, s) for s in range(4)]
orders[1] = schedules.compute_only(schedules.gpipe(4, 6)[1])
try:
    simulate(schedules.add_communication(orders))
except ScheduleError as err:
    print(f"\nmixed: {err}")

# %% [markdown]
# ### 2.2 The prediction: the same bubble, different memory
#
# With p balanced stages, both schedules leave each stage idle for p-1 slots of one
# micro-batch's forward + backward: `(p-1)/(m+p-1)` of the step's **wall** time (GPipe
# §2.3), or `(p-1)/m` of the **ideal** compute time (Megatron-LM 2021 §2.2), which
# interleaving v model chunks per device divides by v ([Deep dive: interleaved
# schedules](09-deep-dive-interleaved-schedules.ipynb)). Memory differs: at the peak
# GPipe's stages hold m micro-batches of activations, 1F1B's stage `s` holds
# `min(p - s, m)` (PipeDream-Flush §3.2). Cost model and simulated schedules agree:

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
# First the proof that a pipeline trains the same model: a tiny GPT cut into 2 stages,
# trained 2 SGD steps with each schedule, against the whole batch in one process (each
# micro-batch's loss divided by m), and the same through PyTorch's own `ScheduleGPipe` and
# `Schedule1F1B` (`torch.distributed.pipelining`). Then the timing run: 2 ranks, one
# compute thread each, an `mlp_stack` of 16 Linear + GeLU layers of width 1024 in 2 stages
# of 8, micro-batches of 32 rows; every rank records each F, B, send and wait, and counts
# what autograd saved for its backward.

# %%
# NBVAL_CHECK_OUTPUT
cases = [c for c in runs.parity_cases(2) if c[1] != "interleaved"]
report = runs.parity_report(lessonlib.launch(runs.parity, 2, cases))
for r in report:
    same = max(r["max_grads_diff"], r["max_weights_diff"], r["max_losses_diff"]) < 1e-5
    print(f"{r['engine']:>9} {r['schedule']:>5} m={r['m']}: gradients, weights and losses "
          f"equal one process: {same}")

# %%
# NBVAL_IGNORE_OUTPUT
measured = lessonlib.launch(runs.measure, 2, ms=(2, 4, 8), engines=("lessonlib",),
                            schedules=("gpipe", "1f1b"), micro=32, steps=3, warmup=1,
                            timeout=300)
rows = runs.summarize(measured)
print(f"{len(rows)} cases measured, median step times from "
      f"{min(r['step_time_s'] for r in rows) * 1e3:.0f} to "
      f"{max(r['step_time_s'] for r in rows) * 1e3:.0f} ms")

# %% [markdown]
# ### 2.4 Measured against predicted
#
# The median step of GPipe and of 1F1B with m = 4, each measured chart under its
# theoretical one: blue forwards, green backwards, hatched grey waiting for a message, pale
# red idle.

# %%
for name in ("gpipe", "1f1b"):
    case = ("lessonlib", name, 4, 1)
    step = runs.median_step(measured, case)
    row = next(r for r in rows if (r["engine"], r["schedule"], r["m"], r["v"]) == case)
    vp.gantt_pair(name, [r.spans for r in step], 2, 4, bubble=row["bubble_per_stage"])
    plt.show()

# %% [markdown]
# The bubble of every run as a share of the step's wall time, next to `(p-1)/(m+p-1)`.
# Expect the measurement within a few points of the theory, not on it: on CPU ranks each
# message is copied by its sender on the critical path, which adds idle time, and two ranks
# sharing a laptop's cores slow each other in the steady state more than while the line
# fills and drains, which hides some ([why, step by step](11-deep-dive-laptop-measurements.ipynb)).
# The last line below says which way this run went. Memory is exact, not statistical: the
# micro-batches whose activations a stage held at once, counted from what autograd saved.

# %%
# NBVAL_IGNORE_OUTPUT
print(f"{'schedule':>8} {'m':>2} {'step ms':>8} {'bubble (wall)':>14} {'theory (wall)':>14} "
      f"{'difference':>11}")
for r in rows:
    print(f"{r['schedule']:>8} {r['m']:>2} {r['step_time_s'] * 1e3:>8.1f} "
          f"{r['bubble_mean']:>14.1%} {r['bubble_theory_wall']:>14.1%} "
          f"{r['bubble_mean'] - r['bubble_theory_wall']:>+11.1%}")
gaps = [r["bubble_mean"] - r["bubble_theory_wall"] for r in rows]
print(f"this run: {sum(g > 0 for g in gaps)} of {len(gaps)} bubbles above the theory, "
      f"{sum(g < 0 for g in gaps)} below; the measurement is off by {min(gaps):+.1%} to "
      f"{max(gaps):+.1%} of the step")
vp.bubble_and_memory(rows)
plt.show()

# %%
# NBVAL_CHECK_OUTPUT
for r in rows:
    print(f"{r['schedule']:>5} m={r['m']}: held per stage {r['peak_stash_per_stage']}, "
          f"predicted {r['peak_stash_theory']}: "
          f"{r['peak_stash_per_stage'] == r['peak_stash_theory']}")

# %% [markdown]
# Per m, the same share idle; 1F1B's first stage holds 2 micro-batches whatever m is,
# GPipe's all m.
#
# ### 2.5 Where the bubble comes from, and how splitting the backward removes most of it
#
# Look at stage 0 in the 1F1B chart: after its warm-up forwards it waits for the first
# gradient, which travels back through every later stage, each running a *whole* backward
# before it sends. But a backward does two jobs: the gradient with respect to the stage's
# input (**B**), which the previous stage is waiting for, and the gradient with respect to
# its weights (**W**), which nobody waits for. Zero-bubble schedules (Qi et al., ICLR 2024)
# send B upstream at once and run W later, in time the stage would otherwise sit idle.
# **ZB-H1** keeps 1F1B's order and its peak memory and leaves `(p-1)(T_F + T_B - T_W)` of
# idle time per stage instead of 1F1B's `(p-1)(T_F + T_B + T_W)` (Table 2): a third of it
# when the three take the same time. The executor's B asks autograd only for the input
# gradient and keeps the graph; W takes each layer's weight gradient from what B kept.
#
# The same 2 ranks and stages, 1F1B and ZB-H1 with m = 4 (B green, W gold), measured; each
# run's own F, B and W times replayed by the schedule simulation say how much bubble each
# schedule leaves once the machine's noise is taken out ([deep dive 09](09-deep-dive-interleaved-schedules.ipynb)
# adds the V-shaped ZBV).

# %%
# NBVAL_IGNORE_OUTPUT
import statistics

from lessonlib.claims import claim

zb = lessonlib.launch(runs.measure, 2, ms=(4,), engines=("lessonlib",),
                      schedules=("1f1b", "zb-h1"), micro=32, steps=2, warmup=1, timeout=300)
why = {name: runs.explain_bubble(zb, ("lessonlib", name, 4, 1)) for name in ("1f1b", "zb-h1")}
fig, axes = plt.subplots(2, 1, figsize=(10, 3.8), constrained_layout=True)
for ax, name in zip(axes, why):
    spans = [r.spans for r in runs.median_step(zb, ("lessonlib", name, 4, 1))]
    vp.gantt(spans, ax=ax, title=f"{vp.NAMES[name]}, p=2, m=4, measured: bubble "
             f"{statistics.fmean(why[name]['measured']):.1%} of wall time")
plt.show()
sim = {name: statistics.fmean(w["simulated_with_measured_compute"]) for name, w in why.items()}
claim("replayed with the F, B and W times measured here, ZB-H1 leaves less bubble than 1F1B",
      sim["zb-h1"] < sim["1f1b"], numbers=f"{sim['zb-h1']:.1%} vs {sim['1f1b']:.1%} of wall time")
claim("the W's took a real share of ZB-H1's backward",
      min(why["zb-h1"]["weight_ms"]) > 0.2 * min(why["zb-h1"]["backward_ms"]),
      numbers=f"T_B {[round(t, 1) for t in why['zb-h1']['backward_ms']]} ms, "
              f"T_W {[round(t, 1) for t in why['zb-h1']['weight_ms']]} ms per stage")

# %% [markdown]
# Measured on two ranks that share a loaded laptop, the bubble itself moves from run to run;
# the replay with each run's own times is the schedule's part of it. Now measured while you
# watch: the widget runs one step of the chosen schedule (GPipe, 1F1B, ZB-H1 or ZBV) on p
# real ranks and draws its Gantt chart (executed headless, it draws once).

# %%
# NBVAL_IGNORE_OUTPUT
live.pipeline_widget()

# %% [markdown]
# <div style="border: 2px solid #4c72b0; border-radius: 6px; padding: 10px 14px;">
# <b>Takeaway.</b> A flush pipeline idles (p-1)/(m+p-1) of its wall time, (p-1)/m of the
# ideal compute time: more micro-batches shrink the bubble. 1F1B does <i>not</i> shrink it;
# it caps each stage's activations at min(p - stage, m) micro-batches instead of GPipe's m,
# which is what lets m grow. Splitting each backward into B (input gradient, sent at once)
# and W (weight gradient, run later) does shrink it: ZB-H1 leaves a third of 1F1B's bubble
# at equal times and the same memory. All were measured here on real ranks, and PyTorch's
# own schedules train the same model to the same gradients.
# </div>
#
# ### Exercises (Part 2)
#
# **1.** A new pipeline: p = 3 stages, m = 5 micro-batches. Write **stage 0**'s compute
# order under 1F1B as a string like `"F0 F1 B0 ..."`. The checker runs it with the other
# stages' 1F1B orders through the validator and the simulation.

# %%
from lessonlib.exercises import pipeline as ex

my_order = None
ex.check_1f1b_order(my_order, p=3, m=5, stage=0)

# %% tags=["solution", "hide-input", "hide-output"] jupyter={"outputs_hidden": true, "source_hidden": true}
# NBVAL_CHECK_OUTPUT
order_solution = "F0 F1 F2 B0 F3 B1 F4 B2 B3 B4"    # p - 0 - 1 = 2 warm-up forwards first
ex.check_1f1b_order(order_solution, p=3, m=5, stage=0)

# %% [markdown]
# **2.** Memory decides. Each stage of a p = 4 pipeline has room for the activations of at
# most 4 micro-batches. What is the smallest bubble, as a share of the step's wall time,
# that GPipe can reach? (Then ask yourself what 1F1B could reach.)

# %%
my_bubble = None
ex.check_capped_bubble(my_bubble, p=4, capacity=4)

# %% tags=["solution", "hide-input", "hide-output"] jupyter={"outputs_hidden": true, "source_hidden": true}
# NBVAL_CHECK_OUTPUT
bubble_solution = cm.bubble_fraction(4, 4, convention="wall")   # GPipe holds all m: m <= 4
ex.check_capped_bubble(bubble_solution, p=4, capacity=4)

# %% [markdown]
# **3.** A model is cut into p = 8 stages. What is the smallest number of micro-batches that
# brings the bubble to 10 % of the wall time or less?

# %%
my_m = None
ex.check_min_microbatches(my_m, p=8, target=0.1)

# %% tags=["solution", "hide-input", "hide-output"] jupyter={"outputs_hidden": true, "source_hidden": true}
# NBVAL_CHECK_OUTPUT
m_solution = next(m_try for m_try in range(1, 1000)
                  if cm.bubble_fraction(8, m_try, convention="wall") <= 0.1)
ex.check_min_microbatches(m_solution, p=8, target=0.1)

# %% [markdown]
# ## Tensor or pipeline? The bytes decide where each one goes
#
# Per transformer layer and micro-batch, tensor parallelism moves `8·b·s·h·(t-1)/t` elements
# per rank (Megatron-LM 2021, §3.2); a pipeline moves `b·s·h` elements per stage boundary,
# `b·s·h/t` with scatter/gather (§4.1), however many layers a stage holds. For GPT-3:

# %%
# NBVAL_CHECK_OUTPUT
g = cm.MODELS["gpt3-175B"]
tp_elems = cm.tp_elements_per_layer(1, g.s, g.h, 8)
pp_elems = 2 * cm.pp_elements_per_boundary(1, g.s, g.h, t=8)   # activation out, gradient back
print(f"TP, t = 8: {tp_elems * 2 / 1e6:,.0f} MB per layer per micro-batch (forward and backward), "
      f"x {g.L} layers")
print(f"PP with scatter/gather, t = 8: {pp_elems * 2 / 1e6:,.1f} MB per stage boundary per "
      f"micro-batch (the activation forward and its gradient back)")
print(f"ratio for a 12-layer stage: {12 * tp_elems / pp_elems:,.0f}x more bytes for TP")

# %% [markdown]
# > **Takeaway.** Tensor parallelism keeps every GPU busy but talks at every layer, so it
# > belongs where bandwidth is highest: inside one server, over NVLink. Pipeline parallelism
# > talks only at stage boundaries, so it can cross the slower links between servers, and
# > its bubble shrinks with more micro-batches. Megatron-LM 2021's first takeaway: TP up to
# > the GPUs of a server, PP across servers. Lesson 05 adds data parallelism.
