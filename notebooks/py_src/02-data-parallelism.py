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
# # 02 · Data parallelism: the four chefs
#
# **The four chefs.** Four chefs in four kitchens are perfecting one soup recipe. Each
# tastes a different pot (a **shard of the batch**) and writes down how the recipe should
# change (a **gradient**). Before anyone touches a recipe card, they phone each other and
# **average their notes** (an **all-reduce**). They started from the same card and apply the
# same averaged note, so their four cards stay identical, and each round they tasted four
# pots instead of one.
#
# That is data parallelism, five steps: **replicate** the model, **shard** the batch,
# compute **local gradients**, **all-reduce** them, **update**. Every step runs for real
# below, on CPU ranks of this machine. The engineering is all in step four, so the notebook
# follows it down to the wire:
#
# 1. predict what the phone call costs (the alpha-beta cost model);
# 2. run four ranks and check they train exactly like one process;
# 3. watch the ladder from naive to PyTorch-style DDP: buckets and overlap;
# 4. measure the parameter server against the ring, and compare with the prediction;
# 5. explore world size, message size and bucket size with widgets;
# 6. put lessonlib's DDP next to PyTorch's, then write parts of it yourself (exercises).
#
# *Watch and read:* Ben-Nun and Hoefler, "Demystifying Parallel and Distributed Deep
# Learning: An In-Depth Concurrency Analysis" (ACM Computing Surveys, 2019), §6 (data
# parallelism and its communication); Li et al., "PyTorch Distributed: Experiences on
# Accelerating Data Parallel Training" (VLDB 2020). A minimal DDP script, the way PyTorch's
# own tutorials write it and corrected for CPU ranks, is `labs/minimal_ddp.py` (section 6).

# %%
import json
from pathlib import Path

import matplotlib.pyplot as plt
import torch

import lessonlib
from lessonlib import costmodel as cm
from lessonlib.costmodel import alpha_beta
from lessonlib.data_parallel import bench as dp_bench, runs as dp_runs
from lessonlib.models import TEN_M, TIMELINE_MODEL, TINY, TinyGPT, count_parameters
from lessonlib.viz import dp as viz

STORED = json.loads(Path("../data/dp_cpu_results.json").read_text())
MiB = 2 ** 20
print(STORED["about"])

# %% [markdown]
# ## 1 · Predict: what does averaging the notes cost?
#
# Two ways to make the call. A **parameter server**: every chef sends their notes to one
# head chef, who averages and sends the result back. The head chef's line carries
# `(n-1)·S` bytes in each direction per round (n-1 notes in, n-1 averages out), growing with
# the number of chefs n. A **ring**: cut the notes into n pieces and pass pieces around the
# circle, first summing (reduce-scatter), then sharing the finished pieces (all-gather).
# Each rank sends `2(n-1)/n·S` bytes and receives as many, which hardly grows with n: the
# ring is bandwidth-optimal (Baidu's ring all-reduce; MPICH's collective cost comments).
# Counted the same way, per direction, the server's link carries n/2 times a ring rank's.
#
# Real parameter servers are **sharded**: the parameters are split into key ranges spread
# over many server machines, so each server link carries only its slice (Li et al., "Scaling
# Distributed Machine Learning with the Parameter Server", OSDI 2014). The single server
# here is the simplest case, the one that shows why the central link is the problem.
#
# With the alpha-beta model (a message costs alpha + bytes/B), here are both for the
# gradients of the GPT that `labs/ddp.py` trains, over one 200 Gb/s InfiniBand link per
# GPU, as in a DGX A100 (Megatron-LM 2021, §5; the `dgx-a100` preset of the cost model):

# %%
# NBVAL_CHECK_OUTPUT
P = count_parameters(TinyGPT(TEN_M))
S = 4 * P                                                        # float32 gradient bytes
bandwidth, alpha = cm.get_cluster("dgx-a100").link(spans_nodes=True)
print(f"{P / 1e6:.1f} M parameters: S = {S / 1e6:.1f} MB of gradients")
print(f"link: {bandwidth / 1e9:.0f} GB/s per GPU, alpha {alpha * 1e6:.0f} us")
print("MB are per direction: what one rank's link sends (and, as much again, receives)")
print(f"{'n':>5} {'ring MB/rank':>13} {'ring ms':>8} {'server link MB':>15} {'server ms':>10}")
for n in (2, 4, 8, 64, 1024):
    print(f"{n:>5} {cm.ring_allreduce_bytes_per_rank(n, S) / 1e6:>13.1f} "
          f"{cm.ring_allreduce_time_s(n, S, bandwidth, alpha) * 1e3:>8.2f} "
          f"{cm.parameter_server_bytes(n, S) / 2 / 1e6:>15.0f} "
          f"{cm.parameter_server_time_s(n, S, bandwidth, alpha) * 1e3:>10.1f}")

# %% [markdown]
# The ring's time levels off near `2·S/B`; the server's grows linearly with n. The ring pays
# instead in latency, `2(n-1)` steps of alpha, which is why large clusters use trees and
# hierarchies for small messages (and why DDP packs gradients into big buckets, below).
#
# ## 2 · The real run: four ranks, one model
#
# `dp_runs.train_replicas` runs on each rank: build the tiny GPT from **its own** random
# seed (so the replicas start different), wrap it in `lessonlib.data_parallel.DataParallel`
# (which first copies rank 0's weights to everyone), then train with AdamW, each rank on
# a quarter of every batch. `train_single` trains one process on the full batches.

# %%
single = dp_runs.train_single(steps=20, global_batch=16)
runs = lessonlib.launch(dp_runs.train_replicas, 4, "bucketed", steps=20, global_batch=16)
start_spread = max((r["start"] - runs[0]["start"]).abs().max().item() for r in runs)
replica_spread = max((r["weights"] - runs[0]["weights"]).abs().max().item() for r in runs)
vs_single = (runs[0]["weights"] - single["weights"]).abs().max().item()
mean_losses = torch.tensor([r["losses"] for r in runs]).mean(0)
loss_gap = (mean_losses - torch.tensor(single["losses"])).abs().max().item()
viz.plot_replicas(single["losses"], mean_losses, n=4)
plt.show()

# %%
# NBVAL_CHECK_OUTPUT
print(f"the 4 ranks started from different weights:        {start_spread > 0.01}")
steps = len(single["losses"])
print(f"after {steps} steps the 4 replicas are bit-identical:   {replica_spread == 0.0}")
print(f"replicas equal the one-process weights (to 1e-4):  {vs_single < 1e-4}")
print(f"mean shard loss equals the full-batch loss (1e-4): {loss_gap < 1e-4}")
calls = [step["all_reduce"]["calls"] for step in runs[0]["comm"]]
print(f"buckets: {runs[0]['buckets']}; all-reduces per step: {sorted(set(calls))}")

# %% [markdown]
# Bit-identical, not merely close: every rank adds the same averaged gradient to the same
# weights. Against one process the weights agree to float32 rounding (the sum of four shard
# means is not added in the same order as one mean over the full batch).
#
# ## 3 · The ladder: from naive to PyTorch's DDP
#
# All rungs give the same numbers (the tests check each against one process, at 2 and 3
# ranks, and against `torch.nn.parallel.DistributedDataParallel`). They differ in *how* the
# gradients travel:
#
# | rung | code | what is sent |
# |---|---|---|
# | (a) naive | `data_parallel.ladder.allreduce_gradients` after backward | one blocking all-reduce per parameter |
# | (b) flat | `data_parallel.ladder.allreduce_flat_gradients` after backward | one all-reduce of everything |
# | (c) async | `data_parallel.ladder.AsyncGradientHooks` | one all-reduce per parameter, launched by its gradient hook during backward |
# | (d) buckets | `data_parallel.DataParallel` | one all-reduce per bucket, launched as the bucket fills |
#
# The ledger counts the messages of one step of the tiny GPT on 2 ranks:

# %%
# NBVAL_CHECK_OUTPUT
sent = lessonlib.launch(dp_runs.ladder_messages, 2, bucket_cap_mb=0.01)[0]
print(f"the tiny GPT has {len(list(TinyGPT(TINY).parameters()))} parameter tensors")
for rung, summary in sent.items():
    calls = summary["all_reduce"]["calls"]
    print(f"{dp_runs.RUNGS[rung]:<68} {calls:>3} all-reduces, "
          f"{summary['all_reduce']['bytes'] / calls / 1024:7.1f} KiB each on average")

# %% [markdown]
# Rung (b) sends one message but only after backward is over; (c) starts early but pays the
# latency once per parameter. Buckets (PyTorch's DDP; Li et al., VLDB 2020) take the best
# of both: parameters are packed **in reverse order** (the last layer's gradients are ready
# first) into buckets of about `bucket_cap_mb` (PyTorch's default: 25 MiB), and each
# bucket's all-reduce starts while backward is still computing earlier layers.
#
# One step of a bigger GPT (`TIMELINE_MODEL`) on 2 ranks, naive against buckets of
# 2 MiB. Each rank has a compute row and a communication row:

# %%
# NBVAL_IGNORE_OUTPUT
timeline = lessonlib.launch(dp_runs.step_timeline, 2)
viz.plot_step_timeline(timeline)
plt.show()
for rung in ("naive", "bucketed"):
    end = max(b for _, _, b in timeline[0][rung])
    print(f"{rung:>9}: step {end * 1e3:.0f} ms on rank 0")
print(f"{count_parameters(TinyGPT(TIMELINE_MODEL)) / 1e6:.1f} M parameters")

# %% [markdown]
# In the naive step the communication row stays empty until backward ends; then the
# all-reduces, one per parameter, run back to back. With buckets the first all-reduce
# starts early in backward, and when backward finishes little is left to send. (On a
# 2-core laptop the overlap is not free: gloo's thread and backward share the cores, so
# backward itself runs slower while buckets fly. On GPUs, NCCL runs on its own stream.)
#
# ## 4 · Parameter server against ring, measured
#
# `lessonlib.data_parallel` builds all three all-reduces from point-to-point messages through the
# ledger, so the bytes can be checked as well as timed. A fresh measurement on 2 and 4
# ranks (a few seconds), every algorithm checked against `dist.all_reduce` first:

# %%
fresh_sizes = [64 * 1024, MiB, 16 * MiB]
fresh_runs = {n: lessonlib.launch(dp_bench.allreduce_bench, n, fresh_sizes, budget_s=0.6,
                                  max_iters=6) for n in (2, 4)}
fresh = {alg: [] for alg in dp_bench.ALL_ALGORITHMS}
for n, ranks in fresh_runs.items():
    for size in fresh_sizes:
        for alg in fresh:
            t = dp_bench.slowest_rank_median([r["sizes"][size][alg]["times"] for r in ranks])
            fresh[alg].append({"world_size": n, "size_bytes": size, "time_s": t})
len(fresh["ring"])

# %% [markdown]
# The bytes at n = 4, S = 16 MiB, from the ledger, against the theory, counted per direction
# (sent and received separately) for every link:

# %%
# NBVAL_CHECK_OUTPUT
row, n, size = fresh_runs[4][0]["sizes"][16 * MiB], 4, 16 * MiB
sent_ring = [r["sizes"][size]["ring"]["bytes_sent"] for r in fresh_runs[4]]
received_ring = [r["sizes"][size]["ring"]["bytes_received"] for r in fresh_runs[4]]
sent_naive = fresh_runs[4][1]["sizes"][size]["naive_ring"]["bytes_sent"]
server_out, server_in = (row["parameter_server"][k] for k in ("bytes_sent", "bytes_received"))
server = server_out + server_in                                    # both directions together
errors = max(r["sizes"][s][a]["max_error"] for r in fresh_runs[4] for s in fresh_sizes
             for a in ("ring", "naive_ring", "parameter_server"))
ring_theory = cm.ring_allreduce_bytes_per_rank(n, size)
print(f"{'':18} {'sent':>11} {'received':>11}   theory, each way")
print(f"ring, each rank:   {sent_ring[0]:>11,} {received_ring[0]:>11,}   2(n-1)/n x S = "
      f"{ring_theory:>11,.0f}")
print(f"naive ring, rank 1:{sent_naive:>11,} {'':>11}   (n-1) x S    = {(n - 1) * size:>11,}")
print(f"server's link:     {server_out:>11,} {server_in:>11,}   (n-1) x S    = "
      f"{cm.parameter_server_bytes(n, size) // 2:>11,}")
print(f"each way, server's link / a ring rank's: {server_out / sent_ring[0]:.1f} (n/2 = {n / 2:g})")
print(f"every algorithm equals dist.all_reduce to 1e-4: {errors < 1e-4}")

# %% [markdown]
# **Why the naive exchange hangs on GPUs.** Each step of a ring receives from the left and
# sends to the right. On CPU ranks (gloo), posting `irecv(left)` and then `isend(right)`
# works. NCCL is stricter: the first unbatched message to a new peer creates a two-rank
# communicator and blocks until that peer joins, and calls on one communicator run in order
# on one stream. With 2 ranks each receive waits behind the other rank's receive; with 3 or
# more every rank blocks creating the link to its left while its left neighbour does the
# same (NVIDIA/nccl issues 479 and 783; pytorch/pytorch issue 109401). Posting the send and
# the receive together as one batch (`comm.batch_isend_irecv`, as PyTorch's pipelining
# does) is how `exchange` does it now. `comm.nccl_hazards` replays a recorded trace under
# these rules, so the course checks its GPU code on CPU:

# %%
# NBVAL_CHECK_OUTPUT
from lessonlib import comm


def ring(n, batched):
    call = lambda op, peer, i: comm.Event(op, n, 16, peer=peer, dtype="torch.float32", order=i,
                                          batch=0 if batched else None, waited=2)
    return [[call("recv", (r - 1) % n, 0), call("send", (r + 1) % n, 1)] for r in range(n)]


for n in (2, 3):
    print(f"{n} ranks, irecv then isend:", *comm.nccl_hazards(ring(n, False)), sep="\n  ")
print("3 ranks, one batch:", comm.nccl_hazards(ring(3, True)) or "no hazard")

# %% [markdown]
# Now the time. The stored sweep (`labs/allreduce.py --sweep`, its command printed below)
# gives the points the alpha-beta model is fitted to, twice. With **a link per rank**, the
# assumption of section 1 and the truth of GPUs on NVLink or InfiniBand, the pace is set by
# the busiest link. With **one shared medium**, the truth of CPU ranks on one laptop (they
# share two cores and one memory bus), the pace is set by the bytes *all* ranks move, and
# that is `2(n-1)·S` for the ring and the parameter server alike. Which fits this machine?

# %%
# NBVAL_IGNORE_OUTPUT
sweep = STORED["allreduce_sweep"]
points = {alg: res["points"] for alg, res in sweep["results"].items()}
print(sweep["settings"]["command"])
print(f"{'algorithm':>17} {'rms error, link per rank':>25} {'rms error, shared':>18}")
fits = {}
for alg, res in sweep["results"].items():
    own, shared = res["fit"], res["fit_shared"]
    fits[alg] = min(shared, own, key=lambda f: f["rms_relative_error"])   # a tie keeps shared
    print(f"{alg:>17} {own['rms_relative_error']:>25.0%} {shared['rms_relative_error']:>18.0%}")
for alg, fit in fits.items():
    print(f"kept for {alg:>17}: {fit['links']:>9} links, alpha = {fit['alpha_s'] * 1e6:5.0f} us, "
          f"B = {fit['bandwidth_Bps'] / 1e9:5.2f} GB/s")

# %% [markdown]
# The errors are large at small messages, where an oversubscribed laptop's time is the
# operating system's scheduling more than any alpha. Measured (in this notebook) against
# predicted (by the model fitted to the stored sweep), side by side:

# %%
# NBVAL_IGNORE_OUTPUT
print(f"{'algorithm':>17} {'n':>2} {'size':>9} {'measured ms':>12} {'predicted ms':>13}")
for alg in ("ring", "parameter_server", "torch"):
    for q in fresh[alg]:
        guess = alpha_beta.predict_from_fit(alg, q["world_size"], q["size_bytes"], fits[alg])
        print(f"{alg:>17} {q['world_size']:>2} {q['size_bytes'] // 1024:>7}Ki "
              f"{q['time_s'] * 1e3:>12.2f} {guess * 1e3:>13.2f}")

# %%
viz.plot_allreduce(points, fits, world_size=4, size_bytes=16 * MiB, fresh=fresh)
plt.show()

# %% [markdown]
# What this laptop can and cannot show. In the right panel the parameter server's time
# climbs with the number of ranks, but so does the ring's, about as steeply: CPU ranks on
# two cores share one medium, so time here follows the bytes *all* ranks move, the same for
# both. The server's problem is its one busy link, and that needs a link per rank to show up
# in time. A least-squares line through the 16 MiB measurements (the server's theory,
# `2·alpha + 2(n-1)·S/B`, is a straight line in n - 1) says how each one climbs:

# %%
# NBVAL_IGNORE_OUTPUT
for alg in ("parameter_server", "ring", "torch"):
    at = sorted((q["world_size"] - 1, q["time_s"]) for q in points[alg]
                if q["size_bytes"] == 16 * MiB)
    extra, seconds = torch.tensor(at, dtype=torch.float64).T
    slope, intercept = torch.linalg.lstsq(torch.stack([extra, torch.ones_like(extra)], 1),
                                          seconds[:, None]).solution.flatten().tolist()
    fitted = slope * extra + intercept
    r2 = 1 - ((seconds - fitted) ** 2).sum() / ((seconds - seconds.mean()) ** 2).sum()
    print(f"{alg:>17}: " + ", ".join(f"n={int(e) + 1}: {t * 1e3:4.0f} ms" for e, t in at)
          + f"  -> {slope * 1e3:4.1f} ms per extra rank, R^2 = {r2:.2f}")

# %% [markdown]
# The ring's flat line in section 1 is a property of the *network*, where every rank brings
# its own link. Here all ranks share one medium, both algorithms move `2(n-1)·S` bytes
# through it in all, and the ring only spreads the additions over every rank instead of
# piling them on the server. What the laptop *can* measure is where the bytes go: the
# ledger counts what each rank's link carries, and the busiest link is the server's, growing
# as (n-1)·S each way while a ring rank's stays under 2·S:

# %%
viz.plot_busiest_link(fresh_runs, 16 * MiB)
plt.show()

# %% [markdown]
# On GPUs with a link each, time follows that busiest link, which is what section 1 predicts.
# At 1 KiB everything is latency, and the server's two hops beat the ring's `2(n-1)` steps.
# For large messages the hand-written ring keeps close to gloo's own C++ ring
# (`dist.all_reduce`), which is what the lab checks:

# %%
# NBVAL_IGNORE_OUTPUT
lab = STORED["allreduce"]
print(lab["settings"]["command"])
for alg, res in lab["results"].items():
    print(f"{alg:>17}: median {res['time_s'] * 1e3:7.1f} ms, busbw {res['busbw_GBps']:.2f} GB/s")
print(f"ring / dist.all_reduce bus bandwidth: {lab['ring_vs_torch_busbw']:.0%}")

# %% [markdown]
# Bus bandwidth is nccl-tests' figure of merit (doc/PERFORMANCE.md): `busbw = S/t ·
# 2(n-1)/n` for an all-reduce, so that it compares with the link's speed whatever n is.
#
# ## 5 · Explore: world size, message size, bucket size
#
# Move the sliders: the lines are the fitted model, the markers measurements (hollow: the
# stored sweep; filled: this notebook's). The widget opens on the view drawn in section 4.

# %%
# NBVAL_IGNORE_OUTPUT
viz.allreduce_explorer(points, fits, fresh)

# %% [markdown]
# The explorer redraws the model and stored points. The next widget measures: each move of a
# slider starts that many real ranks, runs both all-reduces at that size, and draws the
# time and the bytes through the busiest link (one direction, counted by the ledger) beside
# what the model predicts. (Executed headless, it draws once, with its defaults.)

# %%
# NBVAL_IGNORE_OUTPUT
from lessonlib.viz import live

live.allreduce_widget(fits)

# %% [markdown]
# Buckets trade latency against overlap. One big bucket cannot start until backward is
# over; tiny buckets start early but each pays alpha. Here is a fresh measurement on 2 ranks
# (the timeline's GPT, several bucket caps): the communication still running after
# backward's compute, against the model of `alpha_beta.bucketed_step` with this machine's
# fitted `dist.all_reduce` (gradients assumed ready at a steady rate during backward):

# %%
# NBVAL_IGNORE_OUTPUT
buckets = lessonlib.launch(dp_runs.bucket_sweep, 2)
caps = buckets[0]["caps"]
grad_bytes = buckets[0]["gradient_bytes"]
backward_s = min(c["backward_s"] for c in caps.values())
torch_fit = fits["torch"]
measured = {cap: max(b["caps"][cap]["exposed_s"] for b in buckets) for cap in caps}
print(f"{'cap MiB':>8} {'buckets':>8} {'backward ms':>12} {'left after, measured':>21} "
      f"{'predicted':>10}")
for cap, c in caps.items():
    guess = alpha_beta.bucketed_step(grad_bytes, 2, cap * MiB, backward_s, torch_fit)["exposed_s"]
    print(f"{cap:>8} {c['buckets']:>8} {c['backward_s'] * 1e3:>12.1f} "
          f"{measured[cap] * 1e3:>18.1f} ms {guess * 1e3:>7.1f} ms")

# %% [markdown]
# The model is optimistic on this laptop: it lets communication run beside backward for
# free, while here the two compete for the same two cores (backward's own time, in the
# table, grows when many buckets fly beside it). The model's curve has the shape to look
# for: one huge bucket waits for the end of backward, many tiny ones pay alpha each, and the
# best cap lies in between. On a busy laptop the measured points scatter around it by more
# than the differences it predicts; on GPUs the differences are what DDP tunes for.

# %%
viz.plot_buckets(grad_bytes, 2, 4 * MiB, backward_s, torch_fit, measured)
plt.show()

# %%
# NBVAL_IGNORE_OUTPUT
viz.bucket_explorer(grad_bytes, backward_s, torch_fit, measured, measured_world_size=2)

# %% [markdown]
# ## 6 · The lab: lessonlib's DDP against PyTorch's
#
# `labs/ddp.py` trains the GPT of section 1 with buckets (rung d), the naive rung (a) and
# `torch.nn.parallel.DistributedDataParallel`, taking turns, and reports the median step
# time of the slowest rank. These figures were measured on a 2-core CPU machine by the
# commands printed below (too slow to repeat inside this notebook; run them yourself):

# %%
# NBVAL_IGNORE_OUTPUT
ddp, ddp_sweep = STORED["ddp"], STORED["ddp_sweep"]
print(ddp["settings"]["command"])
print(ddp_sweep["settings"]["command"])
print(f"lessonlib buckets / torch DDP step time: {ddp['lessonlib_vs_torch_step_time']:.3f}")
print(f"naive / lessonlib buckets step time:     {ddp['naive_vs_lessonlib_step_time']:.2f}")
viz.plot_ddp_lab(ddp, ddp_sweep)
plt.show()

# %% [markdown]
# Weak-scaling efficiency on this machine is low for an honest reason: its ranks share two
# cores, so adding a rank takes compute away from the others. With one GPU per rank, each
# rank brings its own compute and links, and PyTorch's DDP paper reports "near-linear
# scalability using 256 GPUs" (Li et al., VLDB 2020); `torchrun --nproc-per-node 8
# labs/ddp.py` measures what your machines give.
#
# **Your own DDP script.** The snippet often shown for DDP moves the model with
# `.to(rank)` and passes `device_ids=[rank]` while asking for the gloo backend: on CPU ranks
# there is no device `rank`, and on a multi-node GPU job the global rank is not the local
# GPU index. The corrected minimal script, with a `DistributedSampler`, runs unchanged on
# CPU ranks (gloo) and one GPU per rank (NCCL):

# %%
# NBVAL_CHECK_OUTPUT
script = (Path("..") / "labs" / "minimal_ddp.py").read_text()
print(script[script.index("def main"):script.index('if __name__')].rstrip())

# %% [markdown]
# Run it from the course's folder with `torchrun --standalone --nproc-per-node 2
# labs/minimal_ddp.py` (a test runs exactly that), or with `--nproc-per-node 8` on a GPU
# server.
#
# ## 7 · Sharding the replica (ZeRO, FSDP)
#
# Every replica above holds the whole model state: in mixed-precision Adam, 16 bytes per
# parameter (2 of bf16 weights, 2 of gradients, 12 of fp32 master weights, momentum and
# variance; ZeRO, Rajbhandari et al. 2020, §3.1). d replicas hold d identical copies. ZeRO
# keeps **one** copy, spread over the d ranks, and each rank fetches what it lacks just
# before it needs it: stage 1 shards the optimizer state (4Ψ + 12Ψ/d bytes per GPU for Ψ
# parameters), stage 2 the gradients too (2Ψ + 14Ψ/d), stage 3 the weights too (16Ψ/d).
# PyTorch's FSDP is stage 3 cut into units (Zhao et al., VLDB 2023), Megatron's
# distributed optimizer is stage 1. The prediction for GPT-3 on 1024 GPUs:

# %%
# NBVAL_CHECK_OUTPUT
from lessonlib.viz import zero as zviz

gpt3 = cm.MODELS["gpt3-175B"]
for stage, parts in zviz.predicted_gb(gpt3.params(), 1024).items():
    print(f"stage {stage}: {sum(parts.values()):8.1f} GB per GPU  (" + ", ".join(
        f"{k} {v:.1f}" for k, v in parts.items()) + ")")

# %% [markdown]
# Now for real: the tiny GPT trained 2 AdamW steps at every stage on d ranks, in float32 (4
# bytes per weight and gradient, 8 of Adam state), `lessonlib.data_parallel`'s
# `ShardedOptimizer` for stage 1 and `FullyShardedDataParallel` for stages 2 and 3. The
# bars are what rank 0 held after the step, measured, next to ZeRO's formula with the same
# bytes per value; the line under them is what one step sent, from the ledger. Move d: the
# ranks run again. (Executed headless, it draws once, at d = 2.)

# %%
# NBVAL_IGNORE_OUTPUT
zviz.sharding_widget()

# %% [markdown]
# The measured bars differ from the formula in two places, and both are the lesson.
# Stage 2 keeps the full weights from forward to backward (light blue) *and* its fp32 slice
# of them (dark blue): that slice is the master copy ZeRO counts inside its 12 bytes of
# optimizer state, and our float32 run has no separate master. Stage 3 holds one unit's
# gathered weights at a time, freed after use: the price of sharding the weights is that
# memory moment, plus traffic. The bytes sent are exactly the formula's: stages 0-2 move an
# all-reduce's 2(d-1)/d x S per rank (a reduce-scatter plus an all-gather), stage 3 gathers
# the weights again for backward, 3(d-1)/d x S, **1.5x**, paid every step, on the slowest
# network the group spans. Checked for d = 2:

# %%
# NBVAL_CHECK_OUTPUT
measured = zviz.measure_stages(2)
for stage, r in measured.items():
    print(f"stage {stage}: rank 0 sent {r['sent']:,.0f} bytes, formula {r['sent_formula']:,.0f}; "
          f"held (weights, gradients, optimizer) {r['held']['weights']:,} / "
          f"{r['held']['gradients']:,} / {r['held']['optimizer']:,} B")

# %% [markdown]
# When to shard, and when to split the model instead (lessons 03 and 04)? Shard when the
# model *state* does not fit but one layer's weights and activations do, and the network
# can carry 1.5x an all-reduce every step; stage 3 also needs at least one sample per GPU in
# the global batch, since every GPU is a replica. Split the model when a single layer or its
# activations do not fit, or the network between servers is too slow: tensor parallelism
# inside a server, pipeline parallelism across servers. Large runs do both (lesson 05).
# The lab `labs/zero.py` times stages 0-3 against PyTorch's `fully_shard`, in one run:
# `python labs/zero.py --world-size 2 --json results/zero.json`.
#
# <div style="border: 2px solid #4C72B0; border-radius: 6px; padding: 10px;">
# <b>Takeaway.</b> Data parallelism copies the model to n ranks, gives each a shard of the
# batch and averages the gradients with one all-reduce per step, and then every replica
# stays bit-identical and trains exactly like one process on the whole batch. The cost is the
# all-reduce: a single parameter server's link carries (n-1)·S bytes each way, while each
# rank of a ring sends (and receives) 2(n-1)/n·S, nearly independent of n, n/2 times less;
# that decides the time as long as every rank has a link of its own (on one shared laptop
# both move 2(n-1)·S in total, and time cannot tell them apart). Real parameter servers
# shard the parameters over many servers for the same reason. PyTorch's DDP hides most of the cost
# behind backward by sending gradients in buckets, last layer first, as each bucket fills.
# *Replicated* data parallelism cannot shrink the model: every rank holds all of it.
# *Sharded* data parallelism (ZeRO, FSDP) can: with d ranks each holds 1/d of the optimizer
# state (stage 1), of the gradients too (stage 2), of the weights too (stage 3), for 1x, 1x
# and 1.5x an all-reduce's traffic.
# </div>
#
# ## Exercises
#
# **1. The reduce-scatter half of the ring.** Each rank holds its data cut into
# `world_size` chunks. Write the loop after which rank r's chunk `(r + 1) % world_size`
# holds that chunk summed over all ranks. `send_recv(send_tensor, recv_tensor)` sends to the
# right neighbour while receiving from the left one. The checker runs your function on 3
# real ranks and tells you which sums came out wrong.

# %%
from lessonlib.exercises import dp as ex


def ring_reduce_scatter(chunks, rank, world_size, send_recv):
    raise NotImplementedError


ex.check_reduce_scatter(ring_reduce_scatter)

# %% tags=["solution", "hide-input"] jupyter={"source_hidden": true}
# NBVAL_CHECK_OUTPUT
def ring_reduce_scatter(chunks, rank, world_size, send_recv):
    for step in range(world_size - 1):
        send_i = (rank - step) % world_size
        recv_i = (rank - step - 1) % world_size
        incoming = torch.empty_like(chunks[recv_i])
        send_recv(chunks[send_i], incoming)
        chunks[recv_i] += incoming


verdict = ex.check_reduce_scatter(ring_reduce_scatter)
assert verdict.ok
verdict

# %% [markdown]
# **2. Gradient accumulation with `no_sync`.** A batch too big for memory is split into
# micro-batches whose gradients add up before one optimizer step. Write
# `accumulate_step(ddp, optimizer, micro_batches, loss_fn)` so that 3 micro-batches train
# exactly like one large batch *and* the gradients cross the network once per step, not
# three times. The checker runs it on 2 ranks and counts the all-reduces.

# %%
def accumulate_step(ddp, optimizer, micro_batches, loss_fn):
    raise NotImplementedError


ex.check_accumulation(accumulate_step)

# %% tags=["solution", "hide-input"] jupyter={"source_hidden": true}
# NBVAL_CHECK_OUTPUT
def accumulate_step(ddp, optimizer, micro_batches, loss_fn):
    k = len(micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        if i < k - 1:
            with ddp.no_sync():                       # accumulate locally, send nothing
                (loss_fn(ddp(x), y) / k).backward()
        else:
            (loss_fn(ddp(x), y) / k).backward()       # this backward averages everything
    optimizer.step()
    optimizer.zero_grad()


verdict = ex.check_accumulation(accumulate_step)
assert verdict.ok
verdict

# %% [markdown]
# **3. Bytes on the wire.** Write `ring_bytes(n, size)`, the bytes each rank *sends* in a
# ring all-reduce of `size` bytes over n ranks, and `server_bytes(n, size)`, the bytes
# through the parameter server's link in *both directions together* (in plus out). The checker compares them with the theory and with
# what the ledger counted in section 4.

# %%
def ring_bytes(n, size):
    raise NotImplementedError


def server_bytes(n, size):
    raise NotImplementedError


ledger_counts = {"n": 4, "size": 16 * MiB, "ring": sent_ring[0], "server": server}
ex.check_ring_bytes(ring_bytes, server_bytes, ledger_counts)

# %% tags=["solution", "hide-input"] jupyter={"source_hidden": true}
# NBVAL_CHECK_OUTPUT
def ring_bytes(n, size):
    return 2 * (n - 1) / n * size       # n-1 chunks of size/n, in each of the two halves


def server_bytes(n, size):
    return 2 * (n - 1) * size           # n-1 gradients in, n-1 results out


verdict = ex.check_ring_bytes(ring_bytes, server_bytes, ledger_counts)
assert verdict.ok
verdict
