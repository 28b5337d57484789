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
# below, on CPU ranks of this machine. The engineering is all in step four: what the call
# costs (1), a real run (2), the call measured (3), hidden behind backward (4), PyTorch's
# DDP (5), and sharding the replica so no rank holds it all (6).
#
# Deeper, in their own notebooks: [DDP's buckets, rung by rung](07-deep-dive-ddp-buckets.ipynb),
# [sharding internals](08-deep-dive-sharding.ipynb) and
# [what a laptop's links can and cannot show](11-deep-dive-laptop-measurements.ipynb).
#
# *Watch and read:* Ben-Nun and Hoefler, "Demystifying Parallel and Distributed Deep
# Learning: An In-Depth Concurrency Analysis" (ACM Computing Surveys, 2019), §6 (data
# parallelism and its communication); Li et al., "PyTorch Distributed: Experiences on
# Accelerating Data Parallel Training" (VLDB 2020). A minimal DDP script, the way PyTorch's
# own tutorials write it and corrected for CPU ranks, is `labs/minimal_ddp.py` (section 5).

# %%
from pathlib import Path

import matplotlib.pyplot as plt
import torch

import lessonlib
from lessonlib import costmodel as cm
from lessonlib.claims import claim
from lessonlib.data import stored
from lessonlib.data_parallel import bench as dp_bench, runs as dp_runs
from lessonlib.data_parallel.ddp import DataParallel
from lessonlib.data_parallel.ring import ring_all_reduce
from lessonlib.models import TEN_M, TIMELINE_MODEL, TinyGPT, count_parameters
from lessonlib.viz import dp as viz
from lessonlib.viz.source import show

STORED = stored("dp_cpu_results.json")
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
# Real parameter servers are **sharded** over many machines, each carrying only its slice
# of the parameters (Li et al., "Scaling Distributed Machine Learning with the Parameter
# Server", OSDI 2014; exercise 3). One server is the case that shows why the central link is
# the problem.
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
n = 64
ratio = cm.parameter_server_time_s(n, S, bandwidth, alpha) / cm.ring_allreduce_time_s(
    n, S, bandwidth, alpha)
claim("at n = 64 the server takes far more than n/2 times the ring's time, nearly n times",
      n / 2 < 0.6 * n < ratio < n, numbers=f"{ratio:.0f}x")

# %% [markdown]
# The ring's time levels off near `2·S/B`; the server's grows linearly with n. Its bytes are
# n/2 times a ring rank's, each way, but its time is about n times the ring's: the server
# cannot send an average before the last note has arrived, so its (n-1)·S in and its
# (n-1)·S out follow each other on its link, `2(n-1)·S/B`, while a ring rank sends and
# receives at the same time (a little less than n at n = 64, where the ring's latency
# steps start to count). The ring pays
# instead in latency, `2(n-1)` steps of alpha, which is why large clusters use trees and
# hierarchies for small messages (and why DDP packs gradients into big buckets, section 4).
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
# ## 3 · Parameter server against ring, measured
#
# `lessonlib.data_parallel` builds both all-reduces (and a naive ring) from point-to-point
# messages through the ledger, so the bytes can be checked as well as timed. The ring is
# the library's own function, its two halves (`ring_reduce_scatter`, `ring_all_gather`, in
# the same file) each n-1 steps of one send to the right and one receive from the left:

# %%
show(ring_all_reduce)

# %% [markdown]
# A fresh measurement on 2 and 4 ranks (a few seconds), every algorithm checked against
# `dist.all_reduce` first, comes back as one row per rank, algorithm and size:

# %%
fresh_sizes = [64 * 1024, MiB, 16 * MiB]
fresh_runs = {n: lessonlib.launch(dp_bench.allreduce_bench, n, fresh_sizes, budget_s=0.6,
                                  max_iters=6) for n in (2, 4)}
rows = dp_bench.records(fresh_runs)
rows[0]

# %% [markdown]
# The bytes at n = 4, S = 16 MiB, from the ledger, against the prediction of section 1,
# counted per direction (sent and received separately):

# %%
# NBVAL_CHECK_OUTPUT
n, size = 4, 16 * MiB
at = {(r.algorithm, r.rank): r for r in rows if r.n == n and r.size_bytes == size}
ring, naive, server = at["ring", 0], at["naive_ring", 1], at["parameter_server", 0]
rings_alike = all(at["ring", k][4:6] == ring[4:6] for k in range(n))
errors = max(r.max_error for r in rows if r.n == n and r.algorithm != "torch")
print(f"{'':18} {'sent':>11} {'received':>11}   theory, each way")
print(f"ring, each rank:   {ring.bytes_sent:>11,} {ring.bytes_received:>11,}   2(n-1)/n x S = "
      f"{cm.ring_allreduce_bytes_per_rank(n, size):>11,.0f}   (every rank alike: {rings_alike})")
print(f"naive ring, rank 1:{naive.bytes_sent:>11,} {'':>11}   (n-1) x S    = {(n - 1) * size:>11,}")
print(f"server's link:     {server.bytes_sent:>11,} {server.bytes_received:>11,}   (n-1) x S    = "
      f"{cm.parameter_server_bytes(n, size) // 2:>11,}")
print(f"each way, server's link / a ring rank's: {server.bytes_sent / ring.bytes_sent:.1f} "
      f"(n/2 = {n / 2:g})")
print(f"every algorithm equals dist.all_reduce to 1e-4: {errors < 1e-4}")

# %% [markdown]
# On GPUs, where every rank has a link of its own, time follows the busiest link. On this
# laptop all ranks share two cores and one memory bus, so time follows the bytes *all*
# ranks move, `2(n-1)·S` for the ring and the server alike, and the stopwatch can hardly
# tell them apart ([deep dive: what a laptop's links can and cannot
# show](11-deep-dive-laptop-measurements.ipynb) fits and tests both models). What the laptop
# *can* measure is where the bytes go: the server's link grows as (n-1)·S each way, a ring
# rank's stays under 2·S:

# %%
viz.plot_busiest_link(fresh_runs, 16 * MiB)
plt.show()

# %% [markdown]
# Now move the sliders yourself. Each move starts that many real ranks, runs both
# all-reduces at that size, and draws the time and the bytes through the busiest link (one
# direction, counted by the ledger) beside what the model predicts, with alpha and B fitted
# to a stored sweep of this laptop. (Executed headless, it draws once, with its defaults.)

# %%
# NBVAL_IGNORE_OUTPUT
from lessonlib.viz import live

sweep = STORED["allreduce_sweep"]["results"]
fits = {alg: min(res["fit_shared"], res["fit"], key=lambda f: f["rms_relative_error"])
        for alg, res in sweep.items()}                    # the better of the two fits
live.allreduce_widget(fits)

# %% [markdown]
# ## 4 · Hide the call: DDP's buckets
# <!-- no measured claim: 25 MiB and 2 MiB are settings -->
#
# The simplest DDP waits until backward is over, then all-reduces every gradient, one
# message per parameter: the network idles while backward computes, and backward's cores
# idle while the network works. PyTorch's DDP (Li et al., VLDB 2020) packs the gradients
# **in reverse order** (the last layer's are ready first) into buckets of about
# `bucket_cap_mb` (default 25 MiB), and launches each bucket's all-reduce as soon as it
# fills, while backward is still computing earlier layers. Fewer, bigger messages pay alpha
# less often; launching early **overlaps** communication with compute.
#
# In lessonlib's `DataParallel` that is two functions. A hook on each parameter copies its
# gradient into its bucket the moment it is final and launches every full bucket; at the end
# of backward, `_finish` sends the buckets still short, waits, and divides by n:

# %%
show(DataParallel._on_grad, DataParallel._finish)

# %% [markdown]
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
bars = {rung: {what: (a, b) for what, a, b in timeline[0][rung]} for rung in timeline[0]}
backward_end = bars["bucketed"]["backward"][1]
first_bucket = min(a for what, (a, b) in bars["bucketed"].items() if what.startswith("bucket"))
after = {"naive": bars["naive"]["all-reduce"][1] - bars["naive"]["backward"][1],
         "bucketed": max(b for what, (a, b) in bars["bucketed"].items()
                         if what.startswith("bucket")) - backward_end}
claim("with buckets the first all-reduce starts while backward is still computing",
      first_bucket < backward_end,
      numbers=f"at {first_bucket * 1e3:.0f} ms, backward ends at {backward_end * 1e3:.0f} ms")
print(f"communication still running after backward: naive {after['naive'] * 1e3:.0f} ms, "
      f"buckets {after['bucketed'] * 1e3:.0f} ms")

# %% [markdown]
# In the naive step the communication row stays empty until backward ends. With buckets
# the first all-reduce starts during backward (the check above, on this run's timeline). How
# much is left when backward finishes depends on the cores: on GPUs, where NCCL runs on its
# own stream, only the last buckets; on a 2-core laptop gloo's thread and backward share the
# cores, and what is left can come out as long as the naive step's (the last line above
# prints both). The rungs from naive to buckets and the
# choice of bucket size: [deep dive: DDP's buckets](07-deep-dive-ddp-buckets.ipynb).
#
# ## 5 · The lab: lessonlib's DDP against PyTorch's
#
# `labs/ddp.py` trains the GPT of section 1 with lessonlib's buckets, the naive rung and
# `torch.nn.parallel.DistributedDataParallel`, taking turns, and reports the median step
# time of the slowest rank. Measured on a 2-core CPU machine by the commands printed below
# (too slow to repeat here; run them yourself):

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
# Weak scaling is poor here: the ranks share two cores. With one GPU per rank, PyTorch's DDP
# paper reports "near-linear scalability using 256 GPUs" (Li et al., VLDB 2020).
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
# ## 6 · Sharding the replica (ZeRO, FSDP)
#
# Every replica above holds the whole model state: in mixed-precision Adam, 16 bytes per
# parameter (2 of bf16 weights, 2 of gradients, 12 of fp32 master weights, momentum and
# variance; ZeRO, Rajbhandari et al. 2020, §3.1). d replicas hold d identical copies. ZeRO
# keeps **one** copy, spread over the d ranks, and each rank fetches what it lacks just
# before it needs it: stage 1 shards the optimizer state, stage 2 the gradients too, stage 3
# the weights too. PyTorch's FSDP is stage 3 cut into units (Zhao et al., VLDB 2023). The
# prediction for GPT-3 on 1024 GPUs:

# %%
# NBVAL_CHECK_OUTPUT
from lessonlib.viz import zero as zviz

gpt3 = cm.MODELS["gpt3-175B"]
for stage, parts in zviz.predicted_gb(gpt3.params(), 1024).items():
    print(f"stage {stage}: {sum(parts.values()):8.1f} GB per GPU  (" + ", ".join(
        f"{k} {v:.1f}" for k, v in parts.items()) + ")")

# %% [markdown]
# Now for real: the tiny GPT trained 2 AdamW steps at every stage on d ranks, in float32.
# The bars are what rank 0 held after the step, measured, next to ZeRO's formula with the
# same bytes per value; the line under them is what one step sent, from the ledger. Move d:
# the ranks run again. (Executed headless, it draws once, at d = 2.)

# %%
# NBVAL_IGNORE_OUTPUT
zviz.sharding_widget()

# %% [markdown]
# <!-- no measured claim: the 1x and 1.5x are ZeRO's formula (§7); 08 measures them -->
# The price is traffic: stages 1 and 2 move what an all-reduce moves (a reduce-scatter plus
# an all-gather), stage 3 gathers the weights again for backward, **1.5x** that, every step.
# Why the measured bars differ from the formula where they do, and how every stage still
# trains exactly like one process: [deep dive: sharding](08-deep-dive-sharding.ipynb).
# Shard when the model *state* does not fit; split the model (lessons 03, 04) when one layer
# does not.
#
# <div style="border: 2px solid #4C72B0; border-radius: 6px; padding: 10px;">
# <b>Takeaway.</b> Data parallelism copies the model to n ranks, gives each a shard of the
# batch and averages the gradients with one all-reduce per step, and then every replica
# stays bit-identical and trains exactly like one process on the whole batch. The cost is the
# all-reduce: a single parameter server's link carries (n-1)·S bytes each way, while each
# rank of a ring sends (and receives) 2(n-1)/n·S, nearly independent of n, n/2 times less;
# that decides the time as long as every rank has a link of its own. PyTorch's DDP hides
# most of the cost behind backward by sending gradients in buckets, last layer first, as
# each bucket fills. *Sharded* data parallelism (ZeRO, FSDP) stops holding the whole model on
# every rank: with d ranks each holds 1/d of the optimizer state (stage 1), of the
# gradients too (stage 2), of the weights too (stage 3), for 1x, 1x and 1.5x an
# all-reduce's traffic.
# </div>
#
# ## Exercises
#
# Write your answer in the cell under each question and run it; a hidden solution follows.
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

# %% tags=["solution", "hide-input", "hide-output"] jupyter={"outputs_hidden": true, "source_hidden": true}
# NBVAL_CHECK_OUTPUT
def ring_reduce_scatter_solution(chunks, rank, world_size, send_recv):
    for step in range(world_size - 1):
        send_i = (rank - step) % world_size
        recv_i = (rank - step - 1) % world_size
        incoming = torch.empty_like(chunks[recv_i])
        send_recv(chunks[send_i], incoming)
        chunks[recv_i] += incoming


ex.check_reduce_scatter(ring_reduce_scatter_solution)

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

# %% tags=["solution", "hide-input", "hide-output"] jupyter={"outputs_hidden": true, "source_hidden": true}
# NBVAL_CHECK_OUTPUT
def accumulate_step_solution(ddp, optimizer, micro_batches, loss_fn):
    k = len(micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        if i < k - 1:
            with ddp.no_sync():                       # accumulate locally, send nothing
                (loss_fn(ddp(x), y) / k).backward()
        else:
            (loss_fn(ddp(x), y) / k).backward()       # this backward averages everything
    optimizer.step()
    optimizer.zero_grad()


ex.check_accumulation(accumulate_step_solution)

# %% [markdown]
# **3. Shard the parameter server.** Section 1's server is one rank. Now let k of the n
# ranks be servers: server i owns slice i of the gradients (S/k bytes), and every rank,
# servers included, is also a worker that sends each slice to its server and receives the
# average back. Write `sharded_server_bytes(n, k, size)`, the bytes one *server* rank sends
# in one all-reduce. Before you run it, predict: what must it be at k = 1? And at k = n,
# how does it compare with a ring rank's? The checker tries many n and k, then runs a real
# sharded server on 4 ranks and compares your formula with the ledger.

# %%
def sharded_server_bytes(n, k, size):
    raise NotImplementedError


ex.check_sharded_server(sharded_server_bytes)

# %% tags=["solution", "hide-input", "hide-output"] jupyter={"outputs_hidden": true, "source_hidden": true}
# NBVAL_CHECK_OUTPUT
def sharded_server_bytes_solution(n, k, size):
    serving = (n - 1) * size / k          # the averages of its slice, back to n - 1 workers
    working = (k - 1) * size / k          # its own other slices, to the k - 1 other servers
    return serving + working


ex.check_sharded_server(sharded_server_bytes_solution)
