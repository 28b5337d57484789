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
# # 11 · Deep dive: what a laptop's measurements can and cannot show
#
# This notebook extends [02 · Data parallelism](02-data-parallelism.ipynb), section 3 (and,
# in section 2, [04 · Tensor vs pipeline parallelism](04-tensor-vs-pipeline.ipynb)): the
# course measures on CPU ranks that share a laptop's cores, and this is where the
# measurements are held to the cost model, with what they can and cannot tell. About 23
# minutes to read, code and outputs included.
# <!-- numbers: 23 because it is the reading time: markdown words / 200 + code lines / 10 + output lines / 20 -->
#
# ## 1. The alpha-beta fits: what a laptop's links can and cannot show
#
# The cost model of notebook 02 charges a message `alpha + bytes/B` and gives every rank a
# link of its own. Here the model's two numbers are fitted to a stored sweep of all-reduces
# on this kind of machine, the fit is held against a fresh measurement, and the notebook
# asks which picture of the machine fits: a link per rank, or one shared medium.

# %%
import matplotlib.pyplot as plt
import torch

import lessonlib
from lessonlib.instruments.claims import every
from lessonlib.costmodel import alpha_beta
from lessonlib.data import stored
from lessonlib.data_parallel import bench as dp_bench
from lessonlib.viz import dp as viz

STORED = stored("dp_cpu_results.json")
MiB = 2 ** 20
print(STORED["about"])

# %% [markdown]
# A fresh measurement on 2 and 4 ranks (a few seconds; the same as notebook 02's), every
# algorithm checked against `dist.all_reduce` first:

# %%
fresh_sizes = [64 * 1024, MiB, 16 * MiB]
fresh_runs = {n: lessonlib.launch(dp_bench.allreduce_bench, n, fresh_sizes, budget_s=0.6,
                                  max_iters=6) for n in (2, 4)}
fresh = {alg: [] for alg in dp_bench.ALL_ALGORITHMS}
for n, ranks in fresh_runs.items():
    for size in fresh_sizes:
        for alg in fresh:
            t = dp_bench.call_time(ranks, size, alg)
            fresh[alg].append({"world_size": n, "size_bytes": size, "time_s": t})
len(fresh["ring"])

# %% [markdown]
# Now the time. The stored sweep (`labs/allreduce.py --sweep`, its command printed below)
# gives the points the alpha-beta model is fitted to, twice. With **a link per rank**, the
# assumption of notebook 02's section 1 and the truth of GPUs on NVLink or InfiniBand, the
# pace is set by the busiest link. With **one shared medium**, the truth of CPU ranks on one
# laptop (they share two cores and one memory bus), the pace is set by the bytes *all* ranks
# move, and that is `2(n-1)·S` for the ring and the parameter server alike. Which fits this
# machine?

# %%
# NBVAL_IGNORE_OUTPUT
sweep = dp_bench.stored_sweep()
points = sweep.points
print(sweep.command)
print(f"{'algorithm':>17} {'rms error, link per rank':>25} {'rms error, shared':>18}")
fits = {}
for alg in sweep.points:
    own, shared = sweep.fit[alg], sweep.fit_shared[alg]
    fits[alg] = sweep.best_fit(alg)                                       # a tie keeps shared
    print(f"{alg:>17} {own['rms_relative_error']:>25.0%} {shared['rms_relative_error']:>18.0%}")
for alg, fit in fits.items():
    print(f"kept for {alg:>17}: {fit['links']:>9} links, alpha = {fit['alpha_s'] * 1e6:5.0f} us, "
          f"B = {fit['bandwidth_Bps'] / 1e9:5.2f} GB/s")


def miss(alg, small):
    """The median relative error of the kept fit below (or from) 64 KiB."""
    errors = sorted(abs(alpha_beta.predict_from_fit(alg, n=q["world_size"],
                                                    size_bytes=q["size_bytes"], fit=fits[alg])
                        / q["time_s"] - 1)
                    for q in points[alg] if (q["size_bytes"] < 64 * 1024) == small)
    return errors[len(errors) // 2]


every("the fit misses small messages (under 64 KiB) by more than large ones (median "
      "relative error, small vs large)",
      {f"{alg} ({miss(alg, True):.0%} vs {miss(alg, False):.0%})": (miss(alg, True),
                                                                   miss(alg, False))
       for alg in fits}, lambda x: x[0] > x[1])

# %% [markdown]
# The errors are largest at small messages (the check above), where an oversubscribed laptop's time is the
# operating system's scheduling more than any alpha. Measured (in this notebook) against
# predicted (by the model fitted to the stored sweep), side by side:

# %%
# NBVAL_IGNORE_OUTPUT
print(f"{'algorithm':>17} {'n':>2} {'size':>9} {'measured ms':>12} {'predicted ms':>13}")
for alg in ("ring", "parameter_server", "torch"):
    for q in fresh[alg]:
        guess = alpha_beta.predict_from_fit(alg, n=q["world_size"], size_bytes=q["size_bytes"],
                                            fit=fits[alg])
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
tiny = {alg: {q["world_size"]: q["time_s"] for q in points[alg] if q["size_bytes"] == 1024}
        for alg in ("parameter_server", "ring")}
every("at 1 KiB the server's two hops beat the ring's 2(n-1) steps at n",
      {n: (tiny["parameter_server"][n], tiny["ring"][n]) for n in tiny["ring"]},
      lambda x: x[0] < x[1])

# %% [markdown]
# The ring's flat line in notebook 02's section 1 is a property of the *network*, where
# every rank brings its own link. Here all ranks share one medium, both algorithms move
# `2(n-1)·S` bytes through it in all, and the ring only spreads the additions over every
# rank instead of piling them on the server. What the laptop *can* measure is where the
# bytes go: the ledger counts what each rank's link carries, and the busiest link is the
# server's, growing as (n-1)·S each way while a ring rank's stays under 2·S (notebook 02
# draws it and measures it live). On GPUs with a link each, time follows that busiest link,
# which is what notebook 02's section 1 predicts. At 1 KiB everything is latency, and the
# server's two hops beat the ring's `2(n-1)` steps. For large messages the hand-written ring
# keeps close to gloo's own C++ ring (`dist.all_reduce`), which is what the lab checks:

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
# The fitted model and the points, to explore: move the sliders; the lines are the fitted
# model, the markers measurements (hollow: the stored sweep; filled: this notebook's).

# %%
# NBVAL_IGNORE_OUTPUT
viz.allreduce_explorer(points, fits, fresh)

# %% [markdown]
# <!-- numbers: 783 because it is an issue number -->
# **What gloo lets through and NCCL would not: why the naive exchange hangs on GPUs.**
# Each step of a ring receives from the left and
# sends to the right. On CPU ranks (gloo), posting `irecv(left)` and then `isend(right)`
# works. NCCL is stricter: the first unbatched message to a new peer creates a two-rank
# communicator and blocks until that peer joins, and calls on one communicator run in order
# on one stream. With 2 ranks each receive waits behind the other rank's receive; with 3 or
# more every rank blocks creating the link to its left while its left neighbour does the
# same (NVIDIA/nccl issues 479 and 783; pytorch/pytorch issue 109401). Posting the send and
# the receive together as one batch (`comm.batch_isend_irecv`, as PyTorch's pipelining
# does) is how `exchange` does it now. `nccl_rules.nccl_hazards` replays a recorded trace under
# these rules, so the course checks its GPU code on CPU:

# %%
# NBVAL_CHECK_OUTPUT
from lessonlib.instruments.ledger import Event
from lessonlib.instruments.nccl_rules import nccl_hazards


def ring(n, batched):
    call = lambda op, peer, i: Event(op, n, 16, peer=peer, dtype="torch.float32", order=i,
                                     batch=0 if batched else None, waited=2)
    return [[call("recv", (r - 1) % n, 0), call("send", (r + 1) % n, 1)] for r in range(n)]


for n in (2, 3):
    print(f"{n} ranks, irecv then isend:", *nccl_hazards(ring(n, False)), sep="\n  ")
print("3 ranks, one batch:", nccl_hazards(ring(3, True)) or "no hazard")

# %% [markdown]
# **One communicator busy at a time.** A batch fixes one communicator's order, but a rank
# may still have work on two at once: an asynchronous all-reduce on one group still in
# flight while it posts one on another. NCCL's guide warns against it ("Using multiple NCCL
# communicators concurrently"): each communicator has its own stream, CUDA does not promise
# that two streams progress independently, and NCCL's kernels wait for their peers, so
# three ranks whose pairs' all-reduces are posted in a cycle can each hold the GPU for the
# one the next rank has not started (NVIDIA/nccl issue 783). The checker flags it; waiting
# on each call before posting the next passes:

# %%
# NBVAL_CHECK_OUTPUT
def cycle(wait_each):
    pairs = {"01": (0, 1), "12": (1, 2), "20": (0, 2)}
    mine = {0: ("01", "20"), 1: ("01", "12"), 2: ("12", "20")}
    made = [Event("new_group", 3, 0, ranks=m, group=g, order=i, waited=i + 1)
            for i, (g, m) in enumerate(pairs.items())]
    return [made + [Event("all_reduce", 2, 16, dtype="torch.float32", ranks=pairs[g],
                          group=g, order=3 + i, waited=4 + i if wait_each else 5)
                    for i, g in enumerate(mine[r])] for r in range(3)]


print("posted together:", *nccl_hazards(cycle(False))[:1], sep="\n  ")
print("each waited before the next:", nccl_hazards(cycle(True)) or "no hazard")

# %% [markdown]
# That rule shapes the pipeline executor ([lesson 04](04-tensor-vs-pipeline.ipynb)), as it
# shapes PyTorch's pipelining (`PipelineScheduleMulti`) and Megatron's schedules: a stage's
# sends and receives go out in rounds, one `batch_isend_irecv` on the pipeline group each,
# and all of a round is waited on before the stage computes again, so no transfer is left
# in flight on one communicator while a tensor-parallel collective starts on another
# (`pipeline.validate.lockstep`; `check_batches` there also proves, without processes, that
# no schedule's rounds can hang). What it costs: a receive is no longer posted long before
# the compute that needs it, so less of the transfer hides behind compute, and a stage waits
# at each round for its neighbour's compute of that round. The frameworks pay that for a run that cannot hang on
# its first cluster.

# %% [markdown]
# ## 2. Why a CPU's pipeline bubble sits above theory
#
# Notebook 04 measured the bubble of GPipe and 1F1B on two CPU ranks next to the theory,
# `(p-1)/(v·m+p-1)` of the step's wall time, and deep dive 09 did the same for interleaved
# 1F1B. On a laptop the measured bubble comes out off that line, often above it by as much
# as the theory itself; the run below says by how much. This section takes one measured
# step of each schedule apart to show why. First the measurement, on the stages of notebook
# 04: 2 ranks, one compute thread each, an `mlp_stack` of 16 Linear + GeLU layers (2 stages
# of 8, or 4 chunks of 4 when interleaved), m = 8 micro-batches; the cell prints the layers'
# width and the rows of a micro-batch.

# %%
import lessonlib
from lessonlib.pipeline import schedule_runs

# %%
# NBVAL_IGNORE_OUTPUT
WIDTH, MICRO = 1024, 32               # the layers' width, rows per micro-batch
measured = lessonlib.launch(schedule_runs.measure, 2, ms=(8,), engines=("lessonlib",),
                            schedules=("gpipe", "1f1b", "interleaved"), width=WIDTH,
                            micro=MICRO, steps=3, warmup=1, timeout=300)
print(f"layers of width {WIDTH}, micro-batches of {MICRO} rows: {len(measured[0])} schedules "
      f"measured on {len(measured)} ranks: {', '.join(case[1] for case in measured[0])}")

# %% [markdown]
# <!-- no measured claim: "below" points at the next cell, which reports the run -->
# Where the measured bubble is off the theory, the timeline says why. The formula assumes
# equal stages and free messages. Below, the median step's measured times are fed back into
# the schedule simulation: first only the forwards and backwards of each stage (stages that
# ran at different speeds: the last one adds the loss, and on a shared machine one rank may
# get less of its core than the other), then also the time each send kept its stage busy.
# On CPU ranks a message is copied through the operating system by the sending process, and
# in a pipeline the receiver is usually already waiting, so that copy sits on the critical
# path, twice per micro-batch in the 1F1B steady state; what remains after both is the
# transfer latency a receiver waits for and per-action overhead. Interleaving (v = 2 here)
# sends each micro-batch across 3 boundaries instead of 1 and halves the work between two
# messages, so the sends weigh more in its step than in 1F1B's; its F and B are given per
# virtual stage (a device's two chunks apart), its sends per stage. The difference can also
# come out negative when other work loads the machine: the theory counts idle slots as long
# as busy ones, but while the line fills and drains one rank works alone, at full speed, and
# in the steady state the two ranks slow each other down, so the idle slots come out
# shorter. Every bubble below is a share of the step's wall time, the convention of
# `(p-1)/(v·m+p-1)`.

# %%
# NBVAL_IGNORE_OUTPUT
def percent(values):
    return "[" + ", ".join(f"{x:.1%}" for x in values) + "]"


spread = []
for name, m in (("gpipe", 8), ("1f1b", 8), ("interleaved", 8)):
    v = 2 if name == "interleaved" else 1
    why = schedule_runs.explain_bubble(measured, ("lessonlib", name, m, v))
    print(f"{name} m={m}: per {'virtual stage' if v > 1 else 'stage'} "
          f"F {[round(x, 1) for x in why.forward_ms]} ms, "
          f"B {[round(x, 1) for x in why.backward_ms]} ms; per stage "
          f"send {[round(x, 1) for x in why.send_ms]} ms (medians)")
    spread.append((name, why.theory, why.measured))
    print(f"   bubble of wall time: theory {why.theory:.1%} | simulated with measured F, B "
          f"{percent(why.simulated_with_measured_compute)} | with the sends too "
          f"{percent(why.simulated_with_measured_compute_and_sends)} | measured "
          f"{percent(why.measured)}")
offs = [x - theory for _, theory, measured in spread for x in measured]
print(f"this run: {sum(o > 0 for o in offs)} of {len(offs)} stages' bubbles above the theory, "
      f"off by {min(offs):+.1%} to {max(offs):+.1%} of the step")
