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
# # 17 · Deep dive: when things go wrong at scale
#
# This deep dive extends [10 · Long runs](10-deep-dive-long-runs.ipynb), which survives a
# failure by restarting from a checkpoint. At the scale of this course something always
# fails: in a 54-day snapshot of Llama 3 405B's pre-training on 16,384 H100s, Meta logged
# 466 job interruptions, 419 of them unexpected, and used PyTorch's NCCL Flight Recorder to
# find stuck ranks (the Llama 3 paper, §3.3.4 and Table 5).
# <!-- numbers: 54, 405, 16,384, 466, 419 because the Llama 3 paper's §3.3.4 and Table 5 say so -->
# The questions an engineer answers at night: which rank is stuck, which rank is slow, how
# do we keep training while a node is replaced, and, beyond one datacenter, how do we talk
# less. The plan: a hang found from the flight recorder's dumps -> a straggler named -> a
# replica lost and recovered live with torchft -> DiLoCo against data parallelism -> a
# takeaway and an exercise. About 13 minutes to read, code and outputs included.

# %%
from lessonlib.costmodel.resilience import WAN_BANDWIDTH, WAN_LATENCY, straggler_step, wan_step
from lessonlib.exercises import faults as ex
from lessonlib.faults import diloco, diloco_runs, hang_analysis, hangs, replicas, stragglers
from lessonlib.instruments.claims import claim, every, within
from lessonlib.viz.source import show

# %% [markdown]
# ## 1. A hung rank found
#
# Each rank keeps a ring of its last calls, as PyTorch's Flight Recorder does: operation,
# group, the call's number on that group, sizes, posted or completed
# (`lessonlib.instruments.flight_recorder`). When a launch times out, the launcher reads
# every rank's ring from outside (a rank stuck in a collective runs no Python). The step
# below averages the loss over the world, then the gradient over its own group; three
# switches of the bug zoo ([06](06-deep-dive-bug-zoo.ipynb), `hang_*`) plant a hang on the
# last rank at the last step:

# %%
show(hangs.rank_steps)

# %% [markdown]
# Each planted hang, run on 3 ranks until the launch's timeout, and what the analyzer
# reads from the dumps: the collective, its group, who posted it and who is missing.

# %%
# NBVAL_CHECK_OUTPUT
found = {plant: hangs.diagnose(plant, timeout=2.0) for plant in hangs.PLANTS}
for plant, d in found.items():
    print(f"{plant:9s} -> {d.finding}")

# %% [markdown]
# A skipped call and a call posted out of order differ only in where the missing rank
# waits: in nothing (it went past), or in a collective of another group that the others
# have not reached. A size mismatch has no missing rank: all posted, with different shapes.
# PyTorch's own Flight Recorder runs on gloo too (`TORCH_FR_BUFFER_SIZE`), and
# `hang_analysis.from_torch_dump` reads its dumps into the same records; `tests/test_faults_hangs.py`
# checks that they name the same collective.

# %% [markdown]
# ## 2. A straggler named
#
# In a synchronous step every rank waits for the slowest, so the slow one does not look
# slow: its step takes as long as everyone's. The ledger splits each rank's step into
# compute and the time the all-reduce held it. The rule is NVIDIA's Resiliency Extension's
# relative performance score: the fastest rank's compute time over each rank's ("If the
# relative performance score is 0.5, it means that a rank is twice as slow as the fastest
# rank"); a rank under the threshold is named:
# <!-- numbers: 0.5 because it is the quoted guide's own example -->

# %%
show(stragglers.detect)

# %% [markdown]
# 4 ranks; rank 2's device is made `slowdown=3.0` times slower, then the same run with none
# slowed:

# %%
# NBVAL_CHECK_OUTPUT
slowed = stragglers.detect(stragglers.measure(slow_rank=2, slowdown=3.0))
even = stragglers.detect(stragglers.measure(slow_rank=None))
print(f"rank 2 slowed: named {list(slowed.named)}; an even run: named {list(even.named)}")

# %%
# NBVAL_IGNORE_OUTPUT
print(slowed)
healthy = [r for r in slowed.compute if r != 2]
t_fast = sum(slowed.compute[r] for r in healthy) / len(healthy)
price = straggler_step(t_compute=t_fast, t_comm=slowed.wait[2], slowdown=slowed.compute[2] / t_fast)
within("a healthy rank's wait in the all-reduce",
       measured=sum(slowed.wait[r] for r in healthy) / len(healthy),
       expected=price.healthy_wait_s, tolerance=0.3)

# %% [markdown]
# The cost model's price (`straggler_step`): the healthy ranks wait the straggler's extra
# compute plus the all-reduce, and the whole job runs at the straggler's pace, however
# many ranks it has.

# %% [markdown]
# ## 3. A replica lost and survived, with torchft
#
# torchft runs replica groups that agree on a quorum every step through a Lighthouse
# (here on 127.0.0.1 only). Three replicas of the tiny GPT; replica 2 kills itself with
# SIGKILL after update 2 and is launched again at once, from other weights; it waits until
# the survivors have committed an update without it (a restart quicker than the Lighthouse's
# join timeout would take the dead replica's place in the very next quorum). It rejoins a
# quorum, sees it is behind, and takes the model and AdamW's state live from a peer.

# %%
# NBVAL_CHECK_OUTPUT
run = replicas.run(replicas=3, steps=6, kill=2, kill_at=2)
print(f"replica 2's first life: {run.first_life[2].split(' (')[1].split(':')[0]}")
quorum = [s.participants for s in run.results[0].lived]
claim("the quorum went from 3 replicas to 2, then back to 3", quorum[0] == quorum[-1] == 3
      and min(quorum) == 2, numbers=f"first {quorum[0]}, fewest {min(quorum)}, last {quorum[-1]}")
reference = replicas.replay(run)
gaps = {f"replica {r}": max((res.state[k] - reference[k]).abs().max().item() for k in reference)
        for r, res in run.results.items()}
every("the weights equal one process replaying the membership (float64, 1e-10)", gaps,
      lambda gap: gap <= 1e-10)

# %% [markdown]
# The replay is one process: update k averages the gradients of the replicas that took
# part in update k. What still listens on every interface while the run lasts is each
# replica group's TCPStore (torch's has no bind address); the Lighthouse and the managers
# are on loopback (`lessonlib.faults.torchft_setup`), and nothing is left when `run` returns.

# %% [markdown]
# ## 4. Beyond one datacenter: DiLoCo
#
# DiLoCo (arXiv `2311.08105`) takes H inner AdamW steps per replica, then averages the
# pseudo-gradients (start minus end) and takes one outer Nesterov step; Streaming DiLoCo
# (arXiv `2501.18512`) syncs one fragment of the model at a time. The course's version, the
# whole algorithm:

# %%
show(diloco.StreamingDiLoCo.step)

# %% [markdown]
# `tests/test_faults_diloco.py` runs it beside torchft's `DiLoCo` on the same seeds: the
# same weights in float64. Against data parallelism on 2 replicas, the same 16 steps each:

# %%
# NBVAL_CHECK_OUTPUT
H = 4
ddp = diloco_runs.ddp(2, steps=16)
local = diloco_runs.diloco(2, steps=16, sync_every=H, count=1)
ratio = (ddp[0].bytes_sent / ddp[0].tokens) / (local[0].bytes_sent / local[0].tokens)
print(f"bytes per token: DDP {ddp[0].bytes_sent / ddp[0].tokens:.0f}, "
      f"DiLoCo (H = {H}) {local[0].bytes_sent / local[0].tokens:.0f}: {ratio:.2f} times fewer")
print(f"held-out loss after {ddp[0].tokens} tokens per replica: DDP "
      f"{diloco_runs.held_out_loss(ddp[0].state):.2f}, DiLoCo "
      f"{diloco_runs.held_out_loss(local[0].state):.2f}")

# %% [markdown]
# Over a WAN the saving is time. The cost model's term (`wan_step`) for two datacenters,
# with bandwidth and latency as parameters (set your own link's): a step of 1 s of compute
# and a 10 GB model, over a typical link between datacenters (`WAN_BANDWIDTH`: the link
# Streaming DiLoCo prices its runs on, its Table 1; `WAN_LATENCY`: one way across a
# continent; `costmodel/resilience.py` quotes the sources):

# %%
# NBVAL_CHECK_OUTPUT
print(f"the link: {WAN_BANDWIDTH * 8 / 1e9:g} Gbit/s, {WAN_LATENCY * 1e3:g} ms one way")
link = {h: wan_step(t_compute=1.0, model_bytes=10e9, bandwidth=WAN_BANDWIDTH,
                    latency=WAN_LATENCY, H=h) for h in (1, 10, 100, 500)}
for h, s in link.items():
    print(f"H = {h:3d}: {s.diloco_s:6.2f} s per step, the link {s.diloco_link_share:5.1%} of it")
claim("data parallelism spends most of each step on the link, DiLoCo at H = 500 little of it",
      link[1].diloco_link_share > 0.9 and link[500].diloco_link_share < 0.2,
      numbers=f"{link[1].diloco_link_share:.0%} and {link[500].diloco_link_share:.0%}")

# %% [markdown]
# Data parallelism is the H = 1 row. As H grows the link's share falls as 1/H; what it costs
# is the loss at equal tokens, which only a run measures.
#
# <div style="border: 2px solid #4c72b0; border-radius: 6px; padding: 10px 14px;">
# <b>Takeaway.</b> A hang is found by lining up each rank's recent collectives by group and
# number: the stuck one is where a member is missing or the sizes differ. A straggler hides
# in a synchronous step; its compute against the others' names it. A fault-tolerant job
# goes on without a lost replica and lets it back in, recovered from a peer, with weights
# equal to a replay of the membership. Across datacenters, DiLoCo sends H times less.
# </div>
#
# ## Exercise
#
# **1. Find the stuck rank.** Below is every rank's dump of a new hang: its last three
# entries. Which rank never posted the collective the others wait in?

# %%
# NBVAL_CHECK_OUTPUT
mystery = hangs.diagnose("skipped", timeout=2.0, bad=1).dumps
print(hang_analysis.describe(mystery))

# %%
stuck = None
ex.check_stuck_rank(stuck, mystery)

# %% tags=["solution", "hide-input", "hide-output"] jupyter={"outputs_hidden": true, "source_hidden": true}
# Solution (click to open)
# NBVAL_CHECK_OUTPUT
# ranks 0 and 2 posted all_reduce #3 on group 1 and wait; rank 1's last on group 1 is #2
stuck_solution = 1
ex.check_stuck_rank(stuck_solution, mystery)
