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
# # 13 · Deep dive: mixture of experts and expert parallelism
#
# This notebook extends [05 · Hybrid parallelism](05-hybrid-parallelism.ipynb), section 7:
# a trillion-parameter model today is often a **mixture of experts** (MoE), and its answer
# is different. Many of the largest open models of the last two years are MoEs, Mixtral 8x7B
# and DeepSeek-V3 (671 B parameters, of which 37 B are active per token, trained with 64-way
# expert parallelism) among them; not all: Llama 3.1 405B is dense.
#
# **The idea (and the metaphor).** A hospital of specialists. A triage nurse (the *router*,
# one linear layer) looks at each patient (a token) and sends them to the k specialists
# (the *experts*, each an MLP) who suit them best, with a weight for each opinion. The
# hospital holds E specialists' salaries (E times the MLP's parameters) but each patient
# costs only k visits (k MLPs of compute). Split the specialists over e buildings (*expert
# parallelism*) and the patients must be driven to their specialists' building and back:
# two **all-to-alls** per layer (GShard, Lepikhin et al. 2020; Switch Transformer, Fedus et
# al. 2021).
#
# What a hospital does when one specialist is overrun has changed. GShard and Switch gave
# each specialist a fixed number of patients a day (the *capacity*, ceil(C·k·T/E) of a batch
# of T tokens, C the *capacity factor*), sent whoever came over it home untreated (a
# *dropped* token: the block's residual carries it on unchanged), and added a loss that
# teaches the nurse to spread patients evenly. Today's large runs drop no one: DeepSeek-V3
# keeps the load even by nudging the nurse's scores instead of adding a loss, and "does not
# drop any tokens during training" (DeepSeek-AI 2024, §2.1.2); Mixtral runs its experts on
# MegaBlocks' block-sparse kernels (Gale et al. 2022), which take every token an expert is
# given, and Megatron-Core's MoE is dropless by default. This notebook runs GShard's recipe,
# which is where the ideas come from, and says at each step what the dropless runs do.

# %%
import matplotlib.pyplot as plt
import numpy as np

import lessonlib
from lessonlib import bugzoo, comm
from lessonlib import costmodel as cm
from lessonlib.claims import claim, within
from lessonlib.costmodel import moe as cmoe
from lessonlib.costmodel.alpha_beta import fit_alpha_beta
from lessonlib.expert_parallel import ExpertParallelMoE, exchange_counts, measure, runs
from lessonlib.moe_routing import route
from lessonlib.viz.source import show

# %% [markdown]
# ## 1. Prediction: total parameters are memory, active parameters are compute
#
# The cost model builds the published models from their shapes (`lessonlib.costmodel.moe`)
# and checks them against the published totals. Memory pays for every parameter; a token's
# FLOPs pay only for the dense parts and its k experts: 6 × *active* parameters per token.

# %%
# NBVAL_CHECK_OUTPUT
for name, model in cmoe.MOE_MODELS.items():
    published = cmoe.PUBLISHED.get(name)
    said = f"   (published: {published[0] / 1e9:.1f} B / {published[1] / 1e9:.1f} B)" \
        if published else ""
    print(cmoe.describe(model) + said)
one_t = cmoe.one_trillion(cm.MODELS["megatron-1T"].params())
print(f"\nthe 1 T question again: the dense megatron-1T and moe-1T both hold "
      f"~{one_t['moe_state_bytes'] / 1e12:.0f} TB of weights, gradients and Adam state "
      f"(at least {one_t['min_gpus_80GB']} GPUs of 80 GB just for that), but moe-1T costs "
      f"{one_t['flops_ratio_dense_over_moe']:.0f} times fewer FLOPs per token")

# %% [markdown]
# So the 1 T MoE is a different job: the memory problem is the same (split the state over
# hundreds of GPUs), but the compute problem is that of a 37 B dense model, 27 times
# smaller: the same FLOPs train it on 27 times more tokens (in the same time only if both
# ran at the same MFU, which the all-to-alls make harder). Its
# experts are split by expert parallelism, and the cost model picks the smallest e whose
# share of the state fits (here for DeepSeek-V3 on 2048 H100, 16 pipeline stages, ZeRO-1):

# %%
# NBVAL_CHECK_OUTPUT
pick = cmoe.choose_e(cmoe.MOE_MODELS["deepseek-v3"], 2048, cm.CLUSTERS["dgx-h100"], p=16)
print(f"e = {pick['e']}: {pick['memory_per_gpu'] / 1e9:.0f} GB of model state per GPU, "
      f"{'inside one server' if pick['inside_server'] else 'across servers'}")

# %% [markdown]
# DeepSeek-V3 used e = 64 (across 8 servers): memory sets only the smallest e; a larger e
# gives each GPU fewer experts to hold and to update.
#
# ## 2. The router, on real tokens
#
# `route` is the whole of GShard's gating: softmax over the E experts, each token's k best
# (a stable sort: ties go to the lower expert, so every process routes alike), the place of
# each choice in its expert's queue (first choices first, then in batch order), and the cut
# at the capacity. Its auxiliary loss, alpha·E·Σ f_i·P_i (f_i the share of choices that
# pick expert i, P_i its mean router probability; alpha = 0.01), is alpha when the load is
# even and grows as the router favours a few experts:

# %%
show(route)

# %% [markdown]
# The tiny MoE GPT (`lessonlib.models.moe_gpt`: 2 layers, each MLP replaced by E = 8 experts,
# k = 2) trains on the course's corpus for 60 steps twice: once with the auxiliary loss in
# its objective and once without. At every step we record how many routing choices each
# expert of the first layer received (before the capacity cut), and at the end the share
# of choices that capacity factors 1.0, 1.25 and 2.0 drop on a batch it never saw.

# %%
studies = {balance: measure.balance_study(balance) for balance in (True, False)}
{("with" if b else "without") + " the balancing loss": round(s["losses"][-1], 3)
 for b, s in studies.items()}

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 3.4), sharey=True)
for ax, (balance, study) in zip(axes, studies.items()):
    load = np.array(study["load"][30:])                       # (steps, E)
    mean = load.sum(1, keepdims=True) / load.shape[1]
    ax.bar(range(study["E"]), load.mean(0), yerr=load.std(0), color="#4c72b0", capsize=3)
    ax.axhline(mean.mean(), color="k", ls="--", lw=1, label="even load")
    cap = np.ceil(1.25 * load.sum(1).mean() / study["E"])
    ax.axhline(cap, color="#c44e52", lw=1, label="capacity at C = 1.25")
    ax.set_title(f"{'with' if balance else 'without'} the balancing loss: "
                 f"busiest / mean = {study['imbalance']:.2f}")
    ax.set_xlabel("expert")
axes[0].set_ylabel("routing choices per step (steps 30-59)")
axes[0].legend(loc="lower right")
plt.tight_layout()
plt.show()

# %%
# NBVAL_IGNORE_OUTPUT
print(f"{'capacity factor':>16} " + " ".join(f"{c:>7}" for c in measure.CAPACITY_FACTORS))
for balance, study in studies.items():
    print(f"{'with' if balance else 'without':>8} balance " + " ".join(
        f"{study['dropped_share'][c]:>7.1%}" for c in measure.CAPACITY_FACTORS))
with_, without = studies[True], studies[False]
claim("without the balancing loss the load is more uneven",
      without["imbalance"] > with_["imbalance"],
      numbers=f"busiest/mean {without['imbalance']:.2f} vs {with_['imbalance']:.2f}")
claim("the balancing loss drops fewer tokens at every capacity factor",
      all(with_["dropped_share"][c] <= without["dropped_share"][c]
          for c in measure.CAPACITY_FACTORS),
      numbers=", ".join(f"C={c}: {with_['dropped_share'][c]:.1%} vs "
                        f"{without['dropped_share'][c]:.1%}" for c in measure.CAPACITY_FACTORS))
claim("a larger capacity factor never drops more",
      all(s["dropped_share"][1.0] >= s["dropped_share"][1.25] >= s["dropped_share"][2.0]
          for s in studies.values()))

# %% [markdown]
# The router learns favourites: without the balancing loss a few experts take more than
# their share and every capacity factor drops more, since the busiest expert sets the
# drops. A larger C drops less but every expert's buffer (and, across ranks, every
# all-to-all) is sized for C·k·T/E tokens, so compute and bytes grow with C. Switch uses C
# between 1 and 2; the balancing loss is what lets C stay small.
#
# That is the recipe of 2020-2021. DeepSeek-V3 (§2.1.2) changes three parts of it:
# - **no auxiliary loss for balance**: a bias per expert is added to the routing scores to
#   *choose* the k experts (never to weight their outputs) and moved by a fixed step after
#   every training step, up for an expert that got too few tokens and down for one that got
#   too many; only a tiny sequence-wise balance loss remains, so the language-modelling
#   objective is not traded for balance;
# - **sigmoid affinities**, normalised over the k chosen experts, instead of a softmax over
#   all E; and **node-limited routing**: a token's experts lie on at most 4 servers, which
#   bounds the traffic that crosses the network;
# - **no capacity**: every expert takes every token routed to it, so none is dropped; the
#   all-to-all's sizes then vary from step to step, and the bias keeps the busiest expert
#   (which sets the pace) near the mean.
#
# The same tiny MoE GPT, now dropless (`capacity_factor=None`), trained 60 steps three ways:
# no balancing, GShard's auxiliary loss, and DeepSeek-V3's bias (`balance="bias"`, its step
# 0.001, §4.2: `moe.update_biases(model)` after each optimizer step); the busiest expert's
# load over the mean, over steps 30-59:

# %%
# NBVAL_IGNORE_OUTPUT
frontier = {b: measure.balance_study(b, capacity_factor=None) for b in ("none", "aux", "bias")}
print(f"{'balancing':>10} {'busiest / mean':>15} {'dropped':>8} {'largest aux loss':>17}")
for b, study in frontier.items():
    print(f"{b:>10} {study['imbalance']:>15.2f} {study['train_dropped_share']:>8.1%} "
          f"{max(study['aux_losses'], default=0.0):>17.4f}")
claim("dropless routing drops no token", all(s["train_dropped_share"] == 0
                                              for s in frontier.values()))
claim("the bias brings the busiest expert closer to the mean than no balancing, with no "
      "auxiliary loss", frontier["bias"]["imbalance"] < frontier["none"]["imbalance"]
      and max(frontier["bias"]["aux_losses"], default=0.0) == 0,
      numbers=f"busiest / mean {frontier['bias']['imbalance']:.2f} against "
              f"{frontier['none']['imbalance']:.2f}")

# %% [markdown]
# Dropless, every token reaches its experts and the load shows only in the busiest
# expert's share, which sets the step's pace. The bias balances without a term in the
# loss; at this tiny scale whether it also beats the auxiliary loss depends on the gate and
# the capacity (`tests/test_moe_balance.py` checks only that it beats no balancing).
# Which models use which: GShard and Switch, capacity with drops and an auxiliary loss;
# Mixtral, dropless (MegaBlocks' kernels); DeepSeek-V3, dropless with the bias and a tiny
# sequence-wise loss (not modelled here: `balance="bias"` has none). `python labs/ep.py --balance bias --dropless --gate sigmoid
# --max-nodes 1 --experts-per-node 4` runs DeepSeek-V3's routing over e ranks (each token's
# experts on at most M pretend nodes).
#
# ## 3. The real run: E experts over e ranks, against one process
#
# `expert_parallel(moe, group)` keeps the router on every rank and E/e experts on each. Its
# forward is the one-process layer with the exchange in the middle: route this rank's
# tokens, send each routed token to its expert's rank, run the local experts on what
# arrives, send the results back, combine:

# %%
show(ExpertParallelMoE.forward)

# %% [markdown]
# How many rows each rank sends each other rank changes every step (it is the routing), so
# the ranks first trade their counts per expert in a small all-to-all of E integers:

# %%
show(exchange_counts)

# %% [markdown]
# One 4-rank launch checks it, in float64, against the one-process `MoELayer` trained on
# every rank's batch (capacity counted per rank's batch, as GShard does), for e = 1, 2, 4,
# E/e = 1 and 2, k = 1 and 2, with C = 1.0 so that tokens are dropped, and a shared expert
# in one case. Inside data parallelism (Megatron-Core, DeepSeek-V3) the dense weights'
# gradients are averaged over all 4 ranks and each expert's over the ranks holding a copy
# of it (`expert_parallel.sync_gradients`). Errors are relative to the largest value:

# %%
reports = runs.run_parity(4)
print(f"{'E':>2} {'e':>2} {'k':>2} {'dropped':>8} {'output':>9} {'input grad':>11} "
      f"{'grads':>9} {'weights, 3 steps':>17}")
for i, (E, e, k, C, shared) in enumerate(runs.CASES):
    case = [r[i] for r in reports]
    worst = {w: max(c[w] for c in case)
             for w in ("output", "input_grad", "grads", "weights_after_steps")}
    print(f"{E:>2} {e:>2} {k:>2} {sum(c['dropped'][0] for c in case):>8} "
          f"{worst['output']:>9.1e} {worst['input_grad']:>11.1e} {worst['grads']:>9.1e} "
          f"{worst['weights_after_steps']:>17.1e}" + ("  (+ a shared expert)" if shared else ""))

# %%
# NBVAL_CHECK_OUTPUT
worst = max(r[w] for rank in reports for r in rank
            for w in ("output", "input_grad", "grads", "weights_after_steps", "aux_loss"))
claim("at e = 1, 2 and 4 the expert-parallel layer equals the one-process layer to 1e-12",
      worst < 1e-12)
claim("every rank drops the same tokens as one process does on its batch",
      all(r["dropped"][0] == r["dropped"][1] and
          r["tokens_per_expert"][0] == r["tokens_per_expert"][1]
          for rank in reports for r in rank))

# %% [markdown]
# The bug zoo's `ep_expert_grads_wrong_group` averages the experts' gradients over all
# ranks, as for the dense weights: the shapes agree, so nothing fails, and every expert
# learns from the other experts' gradients. The same comparison on 2 ranks with the switch
# on ([Deep dive: the bug zoo](06-deep-dive-bug-zoo.ipynb)):

# %%
# NBVAL_CHECK_OUTPUT
with bugzoo.enabled("ep_expert_grads_wrong_group"):
    buggy = [r[0] for r in runs.run_parity(2, cases=[(4, 2, 2, 1.0, False)], steps=1)]
claim("with the wrong group the output is still exact", max(r["output"] for r in buggy) < 1e-12)
claim("but the expert gradients are far off", min(r["grads"] for r in buggy) > 1e-3)

# %% [markdown]
#
# ## 4. The all-to-alls' bytes, measured
#
# NCCL runs an all-to-all as one group of a send and a receive per peer, and lessonlib's
# ledger records it so. Per rank and step, the routing counts say what must move: 8E bytes
# of counts, then the rows it dispatches and the results it returns, h elements each, and
# the same two trips again in the backward. The ledger of the first step, per rank:

# %%
# NBVAL_CHECK_OUTPUT
for i, (E, e, k, C, _) in enumerate(runs.CASES):
    case = [r[i] for r in reports]
    measured = [runs.sent_and_received(c["events"], c["rank"]) for c in case]
    expected = [runs.expected_bytes(c["stats"], E, c["h"]) for c in case]
    print(f"E={E} e={e} k={k}: sent {[m['sent'] for m in measured]}, of which to other ranks "
          f"{[m['sent_off_rank'] for m in measured]}")
    claim(f"E={E}, e={e}: every rank sent and received what its routing counts say",
          all(m["sent"] == x["sent"] and m["received"] == x["received"]
              for m, x in zip(measured, expected)))
    claim(f"E={E}, e={e}: NCCL's rules find no hazard in the trace",
          comm.nccl_hazards([c["events"] for c in case]) == [])

# %% [markdown]
# ## 5. The all-to-all's time against the alpha-beta model, and its share of a step
#
# `labs/ep.py`'s measurement, here on 4 CPU ranks: the MoE layer's own step first (E = 8,
# k = 2, b = 4, s = 64, h = 128 per rank), each all-to-all timed by the ledger; then bare
# all-to-alls of growing size (the fastest of 7 tries each), to fit the alpha-beta model
# (an all-to-all is e-1 exchanges of a 1/e slice: `costmodel.moe.alltoall_terms`; CPU ranks
# share one machine, so its *shared* form), with one more bare all-to-all of the layer's
# dispatch size held out to test the fit.

# %%
# NBVAL_IGNORE_OUTPUT
layer = lessonlib.launch(measure.time_layer, 4, 8, 2, 1.25, 4, 64, 128, 8, 2)
step = np.array([max(s) for s in zip(*(r["step_s"] for r in layer))])
a2a = np.array([max(s) for s in zip(*(r["alltoall_s"] for r in layer))])
dispatch_bytes = max(sum(r["stats"]["sent_rows"]) for r in layer) * 128 * 4
sizes = tuple(2**i for i in range(10, 23))                    # 1 KiB to 4 MiB per rank
*points, held_out = lessonlib.launch(measure.alltoall_sweep, 4, sizes + (dispatch_bytes,))[0]
fit = fit_alpha_beta([(e, size / e, t) for e, size, t in points], "naive_ring", links="shared")
predicted = cmoe.alltoall_time_s(4, held_out[1], fit["bandwidth_Bps"], fit["alpha_s"], "shared")
# a step's all-to-alls: the counts (E integers), then dispatch and return, forward and backward
predicted_step = cmoe.alltoall_time_s(4, 8 * 8, fit["bandwidth_Bps"], fit["alpha_s"],
                                      "shared") + 4 * predicted
share = float(np.median(a2a / step))
print(f"fit: alpha = {fit['alpha_s'] * 1e6:.0f} us, B = {fit['bandwidth_Bps'] / 1e9:.2f} GB/s "
      f"(rms error {fit['rms_relative_error']:.0%} over {fit['points']} sizes)")
print(f"a bare all-to-all of {held_out[1]} bytes per rank: {held_out[2] * 1e3:.2f} ms measured, "
      f"{predicted * 1e3:.2f} ms predicted")
print(f"MoE layer step {np.median(step) * 1e3:.1f} ms, of which all-to-alls "
      f"{np.median(a2a) * 1e3:.1f} ms ({share:.0%}); bare ones of the same sizes: "
      f"{predicted_step * 1e3:.1f} ms")
# four CPU ranks time-share two cores with whatever else runs: a wide tolerance, a factor of 4
claim("a bare all-to-all of the layer's size is within a factor of 4 of the alpha-beta fit",
      1 / 4 <= held_out[2] / predicted <= 4,
      numbers=f"{held_out[2] * 1e3:.2f} ms vs {predicted * 1e3:.2f} ms")
claim("inside the layer's step the all-to-alls take longer than bare ones of the same sizes",
      np.median(a2a) > predicted_step,
      numbers=f"{np.median(a2a) * 1e3:.1f} ms vs {predicted_step * 1e3:.1f} ms")
claim("on CPU ranks the all-to-alls take a large share of the MoE layer's step",
      share > 0.2, numbers=f"{share:.0%}")

# %% [markdown]
# A bare all-to-all is what the alpha-beta model describes. Inside a step it is also where
# each rank waits for the others: a rank whose experts got more tokens (or whose core was
# busy) arrives late, and every other rank's all-to-all lasts until it does. That is the
# price of imbalance, paid in the all-to-all. On CPU ranks the experts are tiny, so the
# five all-to-alls of a step weigh heavily next to their compute; on GPUs the experts'
# GEMMs are large and the all-to-alls run on NVLink inside a server. Across
# servers they cross the network, which is why DeepSeek-V3 overlaps them with compute
# (DualPipe).
#
# ## 6. When expert parallelism beats tensor parallelism, for the same parameters
#
# Both split the same experts over n GPUs. Tensor parallelism slices every expert n ways:
# the n GPUs work on one micro-batch at a time and all-reduce b·s·h twice per MoE layer
# (f and g). Expert parallelism gives each GPU E/n whole experts and its own micro-batch:
# four all-to-alls of its k·b·s routed tokens, of which (n-1)/n leave the GPU. For n
# micro-batches that is n·4(n-1)/n·b·s·h bytes per GPU for TP and 4k(n-1)/n·b·s·h for EP:
# EP moves n/k times less, and keeps every expert's GEMM whole instead of n times thinner.
# The cost model for Mixtral's layer (h = 4096, k = 2; b = 1, s = 4096) on DGX H100:

# %%
# NBVAL_CHECK_OUTPUT
mixtral, cluster = cmoe.MOE_MODELS["mixtral-8x7B"], cm.CLUSTERS["dgx-h100"]
deepseek = cmoe.MOE_MODELS["deepseek-v3"]
print(f"{'model':>13} {'n':>4} {'where':>15} {'EP comm ms':>11} {'TP comm ms':>11} "
      f"{'TP / EP':>8} {'expert GEMM width EP / TP':>26}")
for model, n in ((mixtral, 2), (mixtral, 4), (mixtral, 8), (deepseek, 8), (deepseek, 64),
                 (deepseek, 256)):
    row = cmoe.ep_vs_tp(model, n, 1, 4096, cluster)
    print(f"{model.name:>13} {n:>4} {'across servers' if row['across_servers'] else 'one server':>15} "
          f"{row['ep_comm_s'] * 1e3:>11.2f} {row['tp_comm_s'] * 1e3:>11.2f} "
          f"{row['tp_comm_s'] / row['ep_comm_s']:>8.1f} "
          f"{row['ep_gemm_width']:>13} / {row['tp_gemm_width']:<8.0f}")

# %% [markdown]
# At n = k the two move about the same (DeepSeek-V3 sends each token to k = 8 experts);
# beyond it EP wins by about n/k, and across servers TP's all-reduces would cross the
# network every layer, on GEMMs sliced to a few columns. (Mixtral has only 8 experts, so
# its e stops at 8.) What
# EP pays instead is imbalance: the busiest expert's rank sets the pace (section 2), which
# is why every MoE run balances its router: GShard and Switch with a loss and a capacity that
# drops the overflow, DeepSeek-V3 with a bias on the scores and no drops. TP never drops a
# token.
#
# <div style="border: 2px solid #4c72b0; border-radius: 6px; padding: 10px 14px;">
# <b>Takeaway.</b> An MoE layer holds E experts and spends k per token: total parameters
# are memory, active parameters are compute (6 × active FLOPs per token), so a 1 T MoE holds
# the state of a 1 T dense model but does the FLOPs of a 37 B one. A router sends each
# token to its k experts and must keep their load even: GShard's recipe caps each expert
# at ceil(C·k·T/E), lets the overflow ride the residual and adds a balancing loss so that C
# can stay small; DeepSeek-V3 and Mixtral drop no token, and DeepSeek-V3 balances with a
# per-expert bias on the routing scores instead of a loss. Expert
# parallelism splits the experts over e ranks with two all-to-alls each way, whose bytes are
# the routing counts, and equals one process exactly; for the same parameters it moves n/k
# times less than tensor parallelism, and pays in load imbalance.
# </div>
#
# ## Exercise
#
# **1.** A 1 T MoE (`cmoe.MOE_MODELS["moe-1T"]`) on servers of 8 H100 80 GB, with 16
# pipeline stages and ZeRO-1: what is the smallest expert-parallel size e that fits its
# model state in 80 % of a GPU, on 2048 GPUs? Use `cmoe.ep_memory_per_gpu(model, e, p, d,
# zero1=True)` with d = 2048 / 16.

# %%
from lessonlib.exercises import moe as ex

my_e = None
ex.check_smallest_e(my_e)

# %% tags=["solution", "hide-input", "hide-output"] jupyter={"outputs_hidden": true, "source_hidden": true}
# NBVAL_CHECK_OUTPUT
moe_1t = cmoe.MOE_MODELS["moe-1T"]
usable = 0.8 * cluster.gpu.memory_bytes
e_solution = next(e_try for e_try in range(1, 129) if moe_1t.E % e_try == 0 and 128 % e_try == 0
                  and cmoe.ep_memory_per_gpu(moe_1t, e_try, 16, 128, zero1=True)["total"] <= usable)
assert e_solution == cmoe.choose_e(moe_1t, 2048, cluster, p=16)["e"]
ex.check_smallest_e(e_solution)
