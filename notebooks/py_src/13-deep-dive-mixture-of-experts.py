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
# This notebook extends [05 · Hybrid parallelism](05-hybrid-parallelism.ipynb), section 7,
# which plans a trillion-parameter dense model: a model that large can also be a **mixture
# of experts** (MoE), and its answer is different. Among the largest open models are both
# kinds: DeepSeek-V3 is an MoE (671 B parameters, of which 37 B are active per token,
# trained with 64-way expert parallelism, §3.2), and so is the smaller Mixtral 8x7B;
# Llama 3.1 405B is dense.
#
# **Prerequisites:** 05's section 7 (the trillion-parameter question, ZeRO-1 and pipeline
# stages). About 35 minutes to read; Run All takes under half a minute on a 2-core laptop.
# <!-- numbers: 35 because it is the reading time: markdown words / 200 + code lines / 10 +
# output lines / 20 -->
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
# teaches the nurse to spread patients evenly. DeepSeek-V3 drops no one: it keeps the
# load even by nudging the nurse's scores instead of adding a loss, and "does not drop any
# tokens during training" (DeepSeek-AI 2024, §2.1.2). Dropless kernels exist: MegaBlocks'
# block-sparse kernels (Gale et al. 2022) take every token an expert is given, and
# Megatron-Core's MoE is dropless by default. Mixtral's paper names MegaBlocks as an example
# ("MoE layers can be run efficiently on single GPUs with high performance specialized
# kernels", §2.1) and for serving with vLLM; it does not say whether its training dropped
# tokens. This notebook runs GShard's recipe, which is where the ideas come from, and says
# at each step what the dropless runs do.

# %%
import matplotlib.pyplot as plt
import numpy as np

import lessonlib
from lessonlib import bug_switches
from lessonlib import costmodel as cm
from lessonlib.instruments.claims import at_least, at_most, claim, every
from lessonlib.costmodel import moe as cmoe
from lessonlib.costmodel.alpha_beta import fit_alpha_beta
from lessonlib.expert_parallel import ExpertParallelMoE, exchange_counts, layer_runs, measure
from lessonlib.models.moe_routing import route
from lessonlib.instruments.nccl_rules import nccl_hazards
from lessonlib.viz.source import show

# %% [markdown]
# ## 1. Prediction: total parameters are memory, active parameters are compute
#
# The cost model builds the published models from their shapes (`lessonlib.costmodel.moe`)
# and checks them against the published totals. Memory pays for every parameter; a token's
# FLOPs pay only for the dense parts and its k experts: `6 × active` parameters per token.

# %%
# NBVAL_CHECK_OUTPUT
for name, model in cmoe.MOE_MODELS.items():
    published = cmoe.PUBLISHED.get(name)
    said = f"   (published: {published[0] / 1e9:g} B / {published[1] / 1e9:g} B)" \
        if published else ""
    print(cmoe.describe(model) + said)
one_t = cmoe.one_trillion(cm.MODELS["megatron-1T"].params())
print(f"\nthe 1 T question again: the dense megatron-1T and moe-1T both hold "
      f"~{one_t.moe_state_bytes / 1e12:.0f} TB of weights, gradients and Adam state "
      f"(at least {one_t.min_gpus_80GB} H100 80 GB GPUs just for that), but moe-1T costs "
      f"{one_t.flops_ratio_dense_over_moe:.0f} times fewer FLOPs per token: those of a "
      f"{one_t.moe_active / 1e9:.1f} B dense model")

# %% [markdown]
# So the 1 T MoE is a different job: the memory problem is the same (split the state over
# hundreds of GPUs), but each token costs the FLOPs of a 37.6 B dense model, 27 times
# fewer. A budget of FLOPs trains it on 27 times more tokens; in the same time only if it
# ran at the same MFU as the dense model, which its all-to-alls make harder (section 5). Its
# experts are split by expert parallelism, and the cost model picks the smallest e whose
# share of the state fits in a GPU's usable memory, the cost model's
# `usable_memory_bytes` (here for DeepSeek-V3 as it trained, 16 pipeline stages and
# ZeRO-1: "DeepSeek-V3 is trained on a cluster equipped with 2048 NVIDIA H800 GPUs", §3.1):

# %%
# NBVAL_CHECK_OUTPUT
deepseek, h800s = cmoe.MOE_MODELS["deepseek-v3"], cm.CLUSTERS["hgx-h800"]
pick = cmoe.choose_e(deepseek, 2048, h800s, p=16)
print(f"usable: {cm.usable_memory_bytes(h800s.gpu) / 1e9:.0f} of "
      f"{h800s.gpu.memory_bytes / 1e9:.0f} GB per GPU (less cm.memory_reserves())")
print(f"e = {pick.e}: {pick.memory_per_gpu / 1e9:.0f} GB of model state per GPU, "
      f"{'inside one server' if pick.inside_server else 'across servers'}")
# a GPU receives about k T rows per micro-batch of T tokens whatever e is, over E/e experts
rows = {e: e * deepseek.k / deepseek.E for e in (pick.e, 64)}     # per expert, in T
for e, per_expert in rows.items():
    print(f"e = {e:>2}: {deepseek.E // e:>2} experts per GPU and MoE layer, each fed "
          f"{per_expert:g} T rows by the {e} ranks of its group")
print(f"each expert's GEMM is {rows[64] / rows[pick.e]:.0f} times taller at e = 64")

# %% [markdown]
# Memory sets only the smallest e. DeepSeek-V3 trained with e = 64, across 8 servers
# (§3.2). Its paper gives no reason for that choice; it states two things that go with a
# large e. One is a consequence, for memory: "Although DualPipe requires keeping two copies
# of the model parameters, this does not significantly increase the memory consumption
# since we use a large EP size during training" (§3.2.1). The other is said of serving, not
# training: "For the MoE part, we use 32-way Expert Parallelism (EP32), which ensures that
# each expert processes a sufficiently large batch size, thereby enhancing computational
# efficiency" (§3.4.1). The same arithmetic holds in training (the course's reading, from
# the cell above): a GPU receives about k·T rows per micro-batch of T tokens whatever e is,
# but spreads them over E/e experts, so at e = 64 each expert's GEMM is 16 times taller than
# at the smallest e that fits, closer to the GPU's peak.
# <!-- numbers: 32 because it is the quoted sentence's own, the serving EP size -->
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
# k = 2) trains on the course's corpus twice: once with the auxiliary loss in its objective
# and once without. At every step we record how many routing choices each expert of the
# first layer received (before the capacity cut), and at the end the share of choices that
# each capacity factor drops on a batch it never saw:

# %%
STEPS = 60
studies = {balance: measure.balance_study(balance, steps=STEPS) for balance in (True, False)}
print(f"{STEPS} steps; capacity factors tried at the end: {measure.CAPACITY_FACTORS}")
{("with" if b else "without") + " the balancing loss": round(s.losses[-1], 3)
 for b, s in studies.items()}

# %% [markdown]
# The plot sorts each step's experts by their load, so its first bar is that step's
# busiest expert, whichever it was: averaged over the second half of the steps, that bar
# over the even load (the mean) is the busiest / mean that the tables below print.

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 3.6), sharey=True)
for ax, (balance, study) in zip(axes, studies.items()):
    load = np.sort(study.load[STEPS // 2:], axis=1)[:, ::-1]    # (steps, E), busiest first
    even = load.sum(1).mean() / study.E            # every step routes the same k·T choices
    busiest = load[:, 0].mean() / even
    assert np.isclose(busiest, study.imbalance)    # the statistic the tables print
    rank = np.arange(1, study.E + 1)
    ax.bar(rank, load.mean(0), color="#4c72b0", label="mean over the steps")
    ax.errorbar(rank, load.mean(0), yerr=load.std(0), fmt="none", ecolor="k", capsize=3,
                label="± 1 standard deviation over the steps")
    ax.axhline(even, color="k", ls="--", lw=1, label="even load (the mean), k·T/E")
    ax.axhline(np.ceil(1.25 * even), color="#c44e52", lw=1, label="capacity at C = 1.25")
    ax.set_title(f"{'with' if balance else 'without'} the balancing loss:\n"
                 f"busiest / mean = {busiest:.2f}", fontsize=10)
    ax.set_xlabel("expert, by its load that step (1 = busiest)")
    ax.legend(loc="upper right", fontsize=8)
axes[0].set_ylabel(f"routing choices per step\n(steps {STEPS // 2}-{STEPS - 1})")
plt.tight_layout()
plt.show()

# %%
# NBVAL_IGNORE_OUTPUT
print(f"{'capacity factor':>16} " + " ".join(f"{c:>7}" for c in measure.CAPACITY_FACTORS))
for balance, study in studies.items():
    print(f"{'with' if balance else 'without':>8} balance " + " ".join(
        f"{study.dropped_share[c]:>7.1%}" for c in measure.CAPACITY_FACTORS))
with_, without = studies[True], studies[False]
claim("without the balancing loss the load is more uneven",
      without.imbalance > with_.imbalance,
      numbers=f"busiest/mean {without.imbalance:.2f} vs {with_.imbalance:.2f}")
every("the balancing loss drops no more tokens than no balancing",
      {f"C = {c}": (with_.dropped_share[c], without.dropped_share[c])
       for c in measure.CAPACITY_FACTORS}, lambda pair: pair[0] <= pair[1])
every("a larger capacity factor never drops more",
      {("with" if b else "without") + " balance": [s.dropped_share[c]
                                                   for c in measure.CAPACITY_FACTORS]
       for b, s in studies.items()}, lambda shares: shares == sorted(shares, reverse=True))

# %% [markdown]
# The router learns favourites: without the balancing loss a few experts take more than
# their share and every capacity factor drops more, since the busiest expert sets the
# drops. A larger C drops less, at a price that depends on the dispatch. GShard pads every
# expert's buffer to its capacity, C·k·T/E rows (the dispatch tensor of its Algorithm 2),
# and its all-to-alls send those padded buffers, so their bytes and the experts' GEMMs
# grow with C. The all-to-all of section 3 sends only the rows each expert keeps (section 4
# counts them): there a larger C sends more rows only as it drops fewer, never more than
# were routed. Switch uses C between 1 and 2; the balancing loss is what lets C stay small.
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
frontier = {b: measure.balance_study(b, capacity_factor=None, steps=STEPS)
            for b in ("none", "aux", "bias")}
print(f"{'balancing':>10} {'busiest / mean':>15} {'dropped':>8} {'largest aux loss':>17}")
for b, study in frontier.items():
    print(f"{b:>10} {study.imbalance:>15.2f} {study.train_dropped_share:>8.1%} "
          f"{max(study.aux_losses, default=0.0):>17.4f}")
every("dropless routing drops no token",
      {b: s.train_dropped_share for b, s in frontier.items()}, lambda share: share == 0)
claim("the bias brings the busiest expert closer to the mean than no balancing, with no "
      "auxiliary loss", frontier["bias"].imbalance < frontier["none"].imbalance
      and max(frontier["bias"].aux_losses, default=0.0) == 0,
      numbers=f"busiest / mean {frontier['bias'].imbalance:.2f} against "
              f"{frontier['none'].imbalance:.2f}")

# %% [markdown]
# Dropless, every token reaches its experts and the load shows only in the busiest
# expert's share, which sets the step's pace. The bias balances without a term in the
# loss; at this tiny scale whether it also beats the auxiliary loss depends on the gate and
# the capacity (`tests/test_moe_balance.py` checks only that it beats no balancing).
# Which models use which: GShard and Switch, capacity with drops and an auxiliary loss;
# Mixtral, not stated (its paper names MegaBlocks' dropless kernels as an example, §2.1);
# DeepSeek-V3, dropless with the bias and a tiny
# sequence-wise loss (not modelled here: `balance="bias"` has none).
# `python labs/ep.py --balance bias --dropless --gate sigmoid --max-nodes 1 --experts-per-node 4`
# runs DeepSeek-V3's routing over e ranks (each token's experts on at most M pretend nodes).
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
# of it (`data_parallel.ladder.sync_gradients`). Errors are relative to the largest value:

# %%
reports = layer_runs.run_parity(4)
print(f"{'E':>2} {'e':>2} {'k':>2} {'dropped':>8} {'output':>9} {'input grad':>11} "
      f"{'grads':>9} {'weights, 3 steps':>17}")
for i, (E, e, k, C, shared) in enumerate(layer_runs.CASES):
    case = [r[i] for r in reports]
    worst = {w: max(getattr(c, w) for c in case)
             for w in ("output", "input_grad", "grads", "weights_after_steps")}
    print(f"{E:>2} {e:>2} {k:>2} {sum(c.dropped[0] for c in case):>8} "
          f"{worst['output']:>9.1e} {worst['input_grad']:>11.1e} {worst['grads']:>9.1e} "
          f"{worst['weights_after_steps']:>17.1e}" + ("  (+ a shared expert)" if shared else ""))

# %%
# NBVAL_IGNORE_OUTPUT
worst = max(getattr(r, w) for rank in reports for r in rank
            for w in ("output", "input_grad", "grads", "weights_after_steps", "aux_loss"))
EPS = np.finfo(np.float64).eps                   # float64's rounding unit, 2.2e-16
at_most("at e = 1, 2 and 4, the expert-parallel layer's largest relative difference from the "
        "one-process layer, in float64 rounding units,", worst / EPS, 1000)
every("every rank drops the same tokens as one process does on its batch",
      {f"E={E} e={e} k={k}": [reports[rank][i] for rank in range(len(reports))]
       for i, (E, e, k, C, shared) in enumerate(layer_runs.CASES)},
      lambda case: all(r.dropped[0] == r.dropped[1]
                       and r.tokens_per_expert[0] == r.tokens_per_expert[1] for r in case))

# %% [markdown]
# The bug zoo's `ep_expert_grads_wrong_group` averages the experts' gradients over all
# ranks, as for the dense weights: the shapes agree, so nothing fails, and every expert
# learns from the other experts' gradients. The same comparison on 2 ranks with the switch
# on ([Deep dive: the bug zoo](06-deep-dive-bug-zoo.ipynb)):

# %%
# NBVAL_IGNORE_OUTPUT
with bug_switches.enabled("ep_expert_grads_wrong_group"):
    buggy = [r[0] for r in layer_runs.run_parity(2, cases=[(4, 2, 2, 1.0, False)], steps=1)]
at_most("with the wrong group, the output's largest relative difference, in float64 "
        "rounding units,", max(r.output for r in buggy) / EPS, 1000)
at_least("but the gradients' relative difference, on the least affected rank,",
         min(r.grads for r in buggy), 1e-3)

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
for i, (E, e, k, C, _) in enumerate(layer_runs.CASES):
    case = [r[i] for r in reports]
    measured = [layer_runs.sent_and_received(c.events, c.rank) for c in case]
    expected = [layer_runs.expected_bytes(c.stats, E, c.h) for c in case]
    print(f"E={E} e={e} k={k}: sent {[m.sent for m in measured]}, of which to other ranks "
          f"{[m.sent_off_rank for m in measured]}")
    every(f"E={E}, e={e}: a rank sent and received what its routing counts say",
          {f"rank {c.rank}": (m, x) for c, m, x in zip(case, measured, expected)},
          lambda pair: (pair[0].sent, pair[0].received) == (pair[1].sent, pair[1].received))
    hazards = nccl_hazards([c.events for c in case])
    claim(f"E={E}, e={e}: NCCL's rules find no hazard in the trace", hazards == [],
          numbers=f"{sum(len(c.events) for c in case)} calls replayed: "
                  f"{'; '.join(hazards) or 'no hazard'}")

# %% [markdown]
# ## 5. The all-to-all's time against the alpha-beta model, and its share of a step
#
# `labs/ep.py`'s measurement, here on 4 CPU ranks: the MoE layer's own step first (its shape
# is the cell's first line), each all-to-all timed by the ledger; then bare all-to-alls of
# growing size (the fastest of 7 tries each), to fit the alpha-beta model (an all-to-all is
# e-1 exchanges of a 1/e slice: `costmodel.moe.alltoall_terms`; CPU ranks share one
# machine, so its *shared* form), with one more bare all-to-all of the layer's dispatch size
# held out to test the fit.

# %%
# NBVAL_IGNORE_OUTPUT
E, K, C, B, S, H, STEPS_TIMED, WARMUP = 8, 2, 1.25, 4, 64, 128, 8, 2     # per rank
print(f"4 ranks, each a layer of E = {E}, k = {K}, C = {C}, b = {B}, s = {S}, h = {H}")
layer = lessonlib.launch(measure.time_layer, 4, n_experts=E, top_k=K, capacity_factor=C,
                         b=B, s=S, h=H, steps=STEPS_TIMED, warmup=WARMUP)
step = np.array([max(s) for s in zip(*(r.step_s for r in layer))])
a2a = np.array([max(s) for s in zip(*(r.alltoall_s for r in layer))])
dispatch_bytes = max(sum(r.stats["sent_rows"]) for r in layer) * H * 4      # float32
sizes = tuple(2**i for i in range(10, 23))                    # 1 KiB to 4 MiB per rank
# the fastest of 21 tries per size: on two shared cores all 7 of the default can be slowed
*points, held_out = lessonlib.launch(measure.alltoall_sweep, 4, sizes + (dispatch_bytes,),
                                     repeats=21)[0]
fit = fit_alpha_beta([(e, size / e, t) for e, size, t in points], "naive_ring", links="shared")
predicted = cmoe.alltoall_time_s(4, held_out[1], bandwidth=fit.bandwidth_Bps,
                                  latency=fit.alpha_s, links="shared")
# a step's all-to-alls: the counts (E integers), then dispatch and return, forward and backward
bare = cmoe.alltoall_time_s(4, 8 * E, bandwidth=fit.bandwidth_Bps, latency=fit.alpha_s,
                            links="shared") + 4 * predicted
inside, share = float(np.median(a2a)), float(np.median(a2a / step))
print(f"fit: alpha = {fit.alpha_s * 1e6:.0f} us, B = {fit.bandwidth_Bps / 1e9:.2f} GB/s "
      f"(rms error {fit.rms_relative_error:.0%} over {fit.points} sizes)")
print(f"a bare all-to-all of {held_out[1]} bytes per rank: {held_out[2] * 1e3:.2f} ms measured, "
      f"{predicted * 1e3:.2f} ms predicted")
print(f"MoE layer step {np.median(step) * 1e3:.1f} ms, of which all-to-alls "
      f"{inside * 1e3:.1f} ms ({share:.0%}); bare all-to-alls of the same sizes take "
      f"{bare * 1e3:.1f} ms, so {1 - bare / inside:.0%} of the {inside * 1e3:.1f} ms is waiting")
# four CPU ranks time-share two cores with whatever else runs: a wide tolerance, a factor of 4
at_most("a bare all-to-all of the layer's size: its time over the alpha-beta fit's",
        held_out[2] / predicted, 4)
at_least("a bare all-to-all of the layer's size: its time over the alpha-beta fit's",
         held_out[2] / predicted, 1 / 4)
at_least("the all-to-alls' share of the MoE layer's step on CPU ranks", share, 0.2)
at_least("the share of the all-to-alls' time inside the step that is waiting (beyond bare "
         "all-to-alls of the same sizes)", 1 - bare / inside, 0.5)

# %% [markdown]
# The last lines say where the all-to-alls' share of the step goes: bare all-to-alls of
# the same sizes, which the alpha-beta model describes, take less than half of it (here far
# less); the rest is waiting. Inside a step each rank's all-to-all lasts until the slowest
# rank arrives: a rank whose experts got more tokens (or, on CPU ranks that time-share two
# cores, whose core was busy) arrives late, and every other rank waits in its all-to-all.
# That is the price of imbalance, paid in the all-to-all, not in its transfer. On CPU ranks
# the experts are tiny, so the five all-to-alls of a step weigh heavily next to their
# compute; on GPUs the experts' GEMMs are large and the all-to-alls run on NVLink inside a
# server. Across servers they cross the network, which is why DeepSeek-V3 overlaps them
# with compute (DualPipe, §3.2.1).
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
    row = cmoe.ep_vs_tp(model, n, b=1, s=4096, cluster=cluster)
    print(f"{model.name:>13} {n:>4} {'across servers' if row.across_servers else 'one server':>15} "
          f"{row.ep_comm_s * 1e3:>11.2f} {row.tp_comm_s * 1e3:>11.2f} "
          f"{row.tp_comm_s / row.ep_comm_s:>8.1f} "
          f"{row.ep_gemm_width:>13} / {row.tp_gemm_width:<8.0f}")

# %% [markdown]
# At n = k the two move about the same (DeepSeek-V3 sends each token to k = 8 experts);
# beyond it EP wins by about n/k, and across servers TP's all-reduces would cross the
# network every layer, on GEMMs sliced to a few columns. (Mixtral has only 8 experts, so
# its e stops at 8.) What EP pays instead is imbalance: the busiest expert's rank sets the
# pace (sections 2 and 5), which is why every MoE run balances its router: GShard and
# Switch with a loss and a capacity that drops the overflow, DeepSeek-V3 with a bias on the
# scores and no drops. TP never drops a token.
#
# <div style="border: 2px solid #4c72b0; border-radius: 6px; padding: 10px 14px;">
# <b>Takeaway.</b> An MoE layer holds E experts and spends k per token: total parameters
# are memory, active parameters are compute (`6 × active` FLOPs per token), so a 1 T MoE
# holds the state of a 1 T dense model but does only its active parameters' FLOPs, those of
# a dense model of its active size (section 1). A router sends each
# token to its k experts and must keep their load even: GShard's recipe caps each expert
# at ceil(C·k·T/E), lets the overflow ride the residual and adds a balancing loss so that C
# can stay small; DeepSeek-V3 drops no token, and balances with a
# per-expert bias on the routing scores instead of a loss. Expert parallelism splits the
# experts over e ranks with two all-to-alls each way, whose bytes are the routing counts,
# and equals one process to rounding; for the same parameters it moves n/k times less than
# tensor parallelism, and pays in load imbalance.
# </div>
#
# ## Exercise
#
# **1.** A 1 T MoE (`cmoe.MOE_MODELS["moe-1T"]`) on servers of 8 H100 80 GB, with 16
# pipeline stages and ZeRO-1: what is the smallest expert-parallel size e that fits its
# model state in a GPU's usable memory (`cm.usable_memory_bytes`, as in
# section 1), on 2048 GPUs? Use `cmoe.ep_memory_per_gpu(model, e, p=p, d=d, zero1=True)` with
# d = 2048 / 16.

# %%
from lessonlib.exercises import moe as ex

my_e = None
ex.check_smallest_e(my_e)

# %% tags=["solution", "hide-input", "hide-output"] jupyter={"outputs_hidden": true, "source_hidden": true}
# Solution (click to open)
# NBVAL_CHECK_OUTPUT
moe_1t = cmoe.MOE_MODELS["moe-1T"]
usable = cm.usable_memory_bytes(cluster.gpu)
e_solution = next(e_try for e_try in range(1, 129) if moe_1t.E % e_try == 0 and 128 % e_try == 0
                  and cmoe.ep_memory_per_gpu(moe_1t, e_try, p=16, d=128,
                                             zero1=True).total <= usable)
assert e_solution == cmoe.choose_e(moe_1t, 2048, cluster, p=16).e
ex.check_smallest_e(e_solution)
