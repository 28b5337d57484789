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

# %%
import json
from pathlib import Path

import matplotlib.pyplot as plt

import lessonlib
from lessonlib import costmodel as cm
from lessonlib import tp_runs
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
tpviz.weight_split_widget(heads=8);

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
# Over InfiniBand, with a fraction of the bandwidth per GPU, they grow towards the compute
# and pass it at t = 8, while the compute per GPU shrinks as 1/t. (Compute at peak is the
# best case; Megatron-LM 2021's runs reach 44-52 % of peak, Table 1, which only delays the
# crossing.) These all-reduces sit on the critical path, so the GPUs would wait on the
# network. Hence Megatron-LM 2021's first takeaway: tensor parallelism up to the GPUs of
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
