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
# **The four chefs.** Four chefs in four kitchens perfect one soup recipe. Each tastes a
# different pot (a **shard of the batch**) and writes down how the recipe should change (a
# **gradient**). Before anyone touches a card, they phone each other and **average their
# notes** (an **all-reduce**): their cards stay identical, and each round they taste four
# pots instead of one.
#
# That is data parallelism in five steps: **replicate** the model, **shard** the batch,
# compute **local gradients**, **all-reduce** them, **update**. Each runs for real below, on
# CPU ranks.
#
# Deeper: [DDP's buckets](07-deep-dive-ddp-buckets.ipynb),
# [sharding](08-deep-dive-sharding.ipynb),
# [what a laptop's links can show](11-deep-dive-laptop-measurements.ipynb).
# *Read:* Li et al., "PyTorch Distributed: Experiences on Accelerating Data Parallel
# Training" (VLDB 2020).

# %%
import matplotlib.pyplot as plt
import torch

import lessonlib
from lessonlib import costmodel as cm
from lessonlib.instruments.claims import at_least, at_most, claim, every
from lessonlib.data import stored
from lessonlib.data_parallel import bench as dp_bench, ladder_runs as dp_runs
from lessonlib.data_parallel.ddp import DataParallel
from lessonlib.data_parallel.ring import ring_all_reduce
from lessonlib.models import TEN_M, TIMELINE_MODEL, TinyGPT, count_parameters
from lessonlib.viz import dp as viz
from lessonlib.viz.source import lab, show

STORED = stored("dp_cpu_results.json")
MiB = 2 ** 20
print(STORED["about"])

# %% [markdown]
# ## 1 · Predict: what does averaging the notes cost?
#
# A **parameter server**: every chef sends their notes to one head chef, who averages them
# and sends the result back. The head chef's link carries `(n-1)·S` bytes each way, growing
# with the number of chefs n. A **ring**: cut the notes into n pieces and pass them around
# the circle, first summing (reduce-scatter), then sharing the finished pieces (all-gather).
# Each rank sends `2(n-1)/n·S` bytes and receives as many, almost independent of n: the ring
# is bandwidth-optimal. Per direction, the server's link carries n/2 times a ring rank's.
# (Real servers are sharded over many machines, Li et al., OSDI 2014: exercise 3.)
#
# With the alpha-beta model (a message costs alpha + bytes/B), both for the gradients of
# the GPT that `labs/ddp.py` trains, on a DGX A100's 200 Gb/s InfiniBand link per GPU
# (Megatron-LM 2021, §5; the `dgx-a100` preset):

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
          f"{cm.ring_allreduce_time_s(n, S, bandwidth, latency=alpha) * 1e3:>8.2f} "
          f"{cm.parameter_server_bytes(n, S) / 2 / 1e6:>15.0f} "
          f"{cm.parameter_server_time_s(n, S, bandwidth, latency=alpha) * 1e3:>10.1f}")
n = 64
ratio = (cm.parameter_server_time_s(n, S, bandwidth, latency=alpha)
         / cm.ring_allreduce_time_s(n, S, bandwidth, latency=alpha))
at_least(f"at n = {n} the server's time over the ring's", ratio, 0.6 * n)
at_most(f"at n = {n} the server's time over the ring's", ratio, n)

# %% [markdown]
# The ring's time levels off near `2·S/B`. The server's grows with n, to about n times the
# ring's, not n/2: it cannot send an average before the last note arrives, so its (n-1)·S in
# and (n-1)·S out follow each other, while a ring rank sends and receives at once. The ring pays in latency instead, `2(n-1)` steps of alpha:
# hence trees for small messages, and DDP's big buckets (section 4).
#
# ## 2 · The real run: four ranks, one model
#
# On each rank, `dp_runs.train_replicas` builds the tiny GPT from **its own** seed (so the
# replicas start different), wraps it in lessonlib's `DataParallel` (which first copies
# rank 0's weights to everyone) and trains it with AdamW on a quarter of every batch.
# `train_single` trains one process on the full batches.

# %%
single = dp_runs.train_single(steps=20, global_batch=16)
runs = lessonlib.launch(dp_runs.train_replicas, 4, "bucketed", steps=20, global_batch=16)
mean_losses = torch.tensor([r.losses for r in runs]).mean(0)
viz.plot_replicas(single.losses, mean_losses, n=4)
plt.show()

# %%
# NBVAL_CHECK_OUTPUT
TOL, steps = 1e-4, len(single.losses)
ranks = {f"rank {r.rank}": r for r in runs}
others = {label: r for label, r in ranks.items() if r is not runs[0]}
every("a rank started from weights more than 0.01 away from rank 0's", others,
      lambda r: (r.start - runs[0].start).abs().max().item() > 0.01)
every(f"after {steps} steps a rank's weights are bit-identical to rank 0's", others,
      lambda r: torch.equal(r.weights, runs[0].weights))
every(f"a rank's weights equal the one-process weights to {TOL:g}", ranks,
      lambda r: (r.weights - single.weights).abs().max().item() <= TOL)
gaps = (mean_losses - torch.tensor(single.losses)).abs().tolist()
every(f"the mean shard loss equals the full-batch loss to {TOL:g}",
      {f"step {i}": gap for i, gap in enumerate(gaps)}, lambda gap: gap <= TOL)
calls = [step["all_reduce"]["calls"] for step in runs[0].comm]
print(f"buckets: {runs[0].buckets}; all-reduces per step: {sorted(set(calls))}")

# %% [markdown]
# Bit-identical, not merely close: every rank adds the same averaged gradient to the same
# weights. Against one process they agree to float32 rounding (the shard means are summed
# in another order).
#
# ## 3 · Parameter server against ring, measured
#
# lessonlib builds both (and a naive ring) from point-to-point messages through the ledger,
# which counts their bytes. The ring: two halves of n-1 steps, each one send to the right
# and one receive from the left:

# %%
show(ring_all_reduce)

# %% [markdown]
# A fresh measurement on 2 and 4 ranks (a few seconds), one row per rank, algorithm and
# size:

# %%
fresh_sizes = [64 * 1024, MiB, 16 * MiB]
fresh_runs = {n: lessonlib.launch(dp_bench.allreduce_bench, n, fresh_sizes, budget_s=0.6,
                                  max_iters=6) for n in (2, 4)}
rows = dp_bench.records(fresh_runs)
rows[0]

# %% [markdown]
# The ledger's bytes at n = 4, S = 16 MiB, sent and received, against section 1's
# prediction, and every algorithm's result against `dist.all_reduce`:

# %%
# NBVAL_CHECK_OUTPUT
n, size = 4, 16 * MiB
at = {(r.algorithm, r.rank): r for r in rows if r.n == n and r.size_bytes == size}
ring, naive, server = at["ring", 0], at["naive_ring", 1], at["parameter_server", 0]
print(f"{'':18} {'sent':>11} {'received':>11}   theory, each way")
print(f"ring, rank 0:      {ring.bytes_sent:>11,} {ring.bytes_received:>11,}   2(n-1)/n x S = "
      f"{cm.ring_allreduce_bytes_per_rank(n, size):>11,.0f}")
print(f"naive ring, rank 1:{naive.bytes_sent:>11,} {'':>11}   (n-1) x S    = {(n - 1) * size:>11,}")
print(f"server's link:     {server.bytes_sent:>11,} {server.bytes_received:>11,}   (n-1) x S    = "
      f"{cm.parameter_server_bytes(n, size) // 2:>11,}")
print(f"each way, server's link / a ring rank's: {server.bytes_sent / ring.bytes_sent:.1f} "
      f"(n/2 = {n / 2:g})")
every("a ring rank sends and receives the bytes rank 0 does",
      {f"rank {k}": at["ring", k] for k in range(n)},
      lambda r: (r.bytes_sent, r.bytes_received) == (ring.bytes_sent, ring.bytes_received))
errors = {}
for r in rows:
    if r.algorithm != "torch":
        errors[r.algorithm] = max(errors.get(r.algorithm, 0.0), r.max_error)
every(f"on {' and '.join(map(str, fresh_runs))} ranks, at every size, an algorithm equals "
      f"dist.all_reduce to {TOL:g}", errors, lambda error: error <= TOL)

# %% [markdown]
# On GPUs, where every rank has a link of its own, time follows the busiest link. Here all
# ranks share two cores and one memory bus, so time follows the bytes *all* ranks move,
# `2(n-1)·S` for both, and the stopwatch can hardly tell them apart
# ([deep dive 11](11-deep-dive-laptop-measurements.ipynb)). What the laptop *can* show is
# where the bytes go: the server's link grows as (n-1)·S each way, a ring rank's stays
# under 2·S:

# %%
viz.plot_busiest_link(fresh_runs, 16 * MiB)
plt.show()

# %% [markdown]
# Move the sliders: each move runs both all-reduces on that many real ranks at that size,
# beside the model fitted to a stored sweep of this laptop. (Headless, it draws once.)

# %%
# NBVAL_IGNORE_OUTPUT
from lessonlib.viz import live

sweep = dp_bench.stored_sweep()
fits = {alg: sweep.best_fit(alg) for alg in sweep.points}   # the better of the two fits
live.allreduce_widget(fits)

# %% [markdown]
# ## 4 · Hide the call: DDP's buckets
# <!-- no measured claim: 25 MiB and 2 MiB are settings -->
#
# The simplest DDP waits for backward to end, then all-reduces every gradient: the network
# and the cores idle in turn. PyTorch's DDP (Li et al., VLDB 2020) packs the gradients **in
# reverse order** (the last layer's are ready first) into buckets of about `bucket_cap_mb`
# (25 MiB by default) and launches each bucket's all-reduce as soon as it fills, while
# backward computes earlier layers: fewer, bigger messages pay alpha less often, and
# communication **overlaps** compute.
#
# In lessonlib's `DataParallel`, a hook per parameter copies its final gradient into its
# bucket and launches each full bucket; after backward, `_finish` sends the rest, waits and
# divides by n:

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
    end = max(bar.end for bar in timeline[0][rung])
    print(f"{rung:>9}: step {end * 1e3:.0f} ms on rank 0")
print(f"{count_parameters(TinyGPT(TIMELINE_MODEL)) / 1e6:.1f} M parameters")
bars = {rung: {bar.what: bar for bar in timeline[0][rung]} for rung in timeline[0]}
buckets = [bar for bar in timeline[0]["bucketed"] if bar.what.startswith("bucket")]
backward_end = bars["bucketed"]["backward"].end
first_bucket = min(bar.start for bar in buckets)
after = {"naive": bars["naive"]["all-reduce"].end - bars["naive"]["backward"].end,
         "bucketed": max(bar.end for bar in buckets) - backward_end}
claim("with buckets the first all-reduce starts while backward is still computing",
      first_bucket < backward_end,
      numbers=f"at {first_bucket * 1e3:.0f} ms, backward ends at {backward_end * 1e3:.0f} ms")
print(f"communication still running after backward: naive {after['naive'] * 1e3:.0f} ms, "
      f"buckets {after['bucketed'] * 1e3:.0f} ms")

# %% [markdown]
# In the naive step the communication row stays empty until backward ends; with buckets the
# first all-reduce starts during backward (checked above). What is
# left after backward depends on the cores: on GPUs, where NCCL has its own stream, only the
# last buckets; here gloo's thread and backward share two cores, and it can come out as long
# as the naive step's (the last line prints both). More: [deep dive 07](07-deep-dive-ddp-buckets.ipynb).
#
# ## 5 · The lab: lessonlib's DDP against PyTorch's
#
# `labs/ddp.py` trains section 1's GPT with lessonlib's buckets, the naive rung and
# `torch.nn.parallel.DistributedDataParallel`, taking turns, and reports the slowest rank's
# median step time. Measured on a 2-core CPU machine by the commands printed below (too slow
# to repeat here):

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
# Weak scaling is poor here: the ranks share two cores. With a GPU per rank, the DDP paper
# reports "near-linear scalability using 256 GPUs" (Li et al.).
#
# **Your own DDP script.** The snippet often shown calls `.to(rank)` and
# `device_ids=[rank]` with the gloo backend: CPU ranks have no device `rank`, and on several
# nodes the global rank is not the local GPU. The corrected minimal script,
# `labs/minimal_ddp.py`, runs unchanged on CPU ranks (gloo) and one GPU per rank (NCCL):
# `join` picks the backend and the device, `main` trains:

# %%
show(lab("minimal_ddp").join, lab("minimal_ddp").main)

# %% [markdown]
# Run it with `torchrun --standalone --nproc-per-node 2 labs/minimal_ddp.py` (a test does).
#
# ## 6 · Sharding the replica (ZeRO, FSDP)
#
# Every replica above holds the whole model state: 16 bytes per parameter in
# mixed-precision Adam (lesson 01; ZeRO, Rajbhandari et al. 2020, §3.1). ZeRO keeps **one**
# copy, spread over the d ranks, each fetching what it lacks just before it needs it:
# stage 1 shards the optimizer state, stage 2 the gradients too, stage 3 the weights too
# (PyTorch's FSDP, Zhao et al., VLDB 2023). The prediction for GPT-3 on 1024 GPUs:

# %%
# NBVAL_CHECK_OUTPUT
from lessonlib.viz import zero as zviz

gpt3 = cm.MODELS["gpt3-175B"]
for stage, parts in zviz.predicted_gb(gpt3.params(), 1024).items():
    print(f"stage {stage}: {sum(parts.values()):8.1f} GB per GPU  (" + ", ".join(
        f"{k} {v:.1f}" for k, v in parts.items()) + ")")

# %% [markdown]
# For real: the tiny GPT, 2 AdamW steps at every stage on d ranks, in float32: what rank 0
# held, measured, beside ZeRO's formula, and what one step sent. Move d and the ranks run
# again. (Headless, it draws once, at d = 2.)

# %%
# NBVAL_IGNORE_OUTPUT
zviz.sharding_widget()

# %% [markdown]
# <!-- no measured claim: the traffic is ZeRO's formula (§7.2); 08 measures it -->
# The price is traffic: stages 1 and 2 move what an all-reduce moves, stage 3 gathers the
# weights again for backward, **1.5x** that (ZeRO §7.2.2), every step. Where the bars
# differ from the formula, and why every stage still trains exactly like one process:
# [deep dive 08](08-deep-dive-sharding.ipynb). Shard when the model *state* does not fit;
# split the model (lessons 03, 04) when one layer does not.
#
# <div style="border: 2px solid #4C72B0; border-radius: 6px; padding: 10px;">
# <b>Takeaway.</b> Replicate, shard the batch, all-reduce the gradients, update: every
# replica stays bit-identical and trains like one process on the whole batch. A ring rank
# sends 2(n-1)/n·S per step, nearly independent of n; one server's link carries (n-1)·S.
# DDP hides most of it behind backward with buckets, last layer first. ZeRO and FSDP spread
# the replica's state over the d ranks, for an all-reduce's traffic (stages 1, 2) or 1.5x
# that (stage 3).
# </div>
#
# ## Exercises
#
# Write your answer in the cell under each question and run it; a hidden solution follows.
#
# **1. The reduce-scatter half of the ring.** Each rank holds its data cut into
# `world_size` chunks. Write the loop after which rank r's chunk `(r + 1) % world_size`
# holds that chunk summed over all ranks. `send_recv(send_tensor, recv_tensor)` sends to the
# right neighbour while receiving from the left. The checker runs it on 3 real ranks and
# names the sums that came out wrong.

# %%
from lessonlib.exercises import dp as ex


def ring_reduce_scatter(chunks, rank, world_size, send_recv):
    raise NotImplementedError


ex.check_reduce_scatter(ring_reduce_scatter)

# %% tags=["solution", "hide-input", "hide-output"] jupyter={"outputs_hidden": true, "source_hidden": true}
# Solution (click to open)
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
# **2. Gradient accumulation with `no_sync`.** Write
# `accumulate_step(ddp, optimizer, micro_batches, loss_fn)` so that 3 micro-batches train
# exactly like one large batch *and* the gradients cross the network once per step, not
# three times. The checker runs it on 2 ranks and counts the all-reduces.

# %%
def accumulate_step(ddp, optimizer, micro_batches, loss_fn):
    raise NotImplementedError


ex.check_accumulation(accumulate_step)

# %% tags=["solution", "hide-input", "hide-output"] jupyter={"outputs_hidden": true, "source_hidden": true}
# Solution (click to open)
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
# **3. Shard the parameter server.** Let k of the n ranks be servers: server i owns slice i
# of the gradients (S/k bytes), and every rank, servers included, is also a worker that
# sends each slice to its server and receives the average back. Write
# `sharded_server_bytes(n, k, size)`, the bytes one *server* rank sends in one all-reduce.
# Predict first: what must it be at k = 1? At k = n, against a ring rank? The checker tries
# many n and k, then a real sharded server on 4 ranks.

# %%
def sharded_server_bytes(n, k, size):
    raise NotImplementedError


ex.check_sharded_server(sharded_server_bytes)

# %% tags=["solution", "hide-input", "hide-output"] jupyter={"outputs_hidden": true, "source_hidden": true}
# Solution (click to open)
# NBVAL_CHECK_OUTPUT
def sharded_server_bytes_solution(n, k, size):
    serving = (n - 1) * size / k          # the averages of its slice, back to n - 1 workers
    working = (k - 1) * size / k          # its own other slices, to the k - 1 other servers
    return serving + working


ex.check_sharded_server(sharded_server_bytes_solution)
