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
# # 12 · Deep dive: long sequences
#
# This deep dive extends [04 · Tensor vs pipeline parallelism](04-tensor-vs-pipeline.ipynb)
# and [05 · Hybrid parallelism](05-hybrid-parallelism.ipynb), whose layouts split the
# weights (t), the layers (p) and the batch (d), but never a sequence: every GPU holds
# all s tokens of the sequences it works on. Llama 3 405B went from 8K to 128K tokens per
# sequence and kept its 16M tokens per step: 128 sequences for 16,384 GPUs, so a (t, p, d)
# layout gives each replica one sequence, one micro-batch, and a pipeline that waits
# almost all the time. Its answer, and torchtitan's, Megatron-Core's and the Ultra-Scale
# Playbook's, is **context parallelism**: split the sequence itself over c ranks, and bring
# each rank the keys and values of the others while it computes its part of the attention.
# Megatron-Core passes them around a ring by default (ring attention, Liu, Zaharia and
# Abbeel 2023), which this notebook runs; Llama 3 all-gathered them, and so does PyTorch's
# `context_parallel`, which torchtitan uses, unless told otherwise (sections 4 and 5).
#
# The plan: the idea -> a prediction -> a real run on 4 ranks -> measured against predicted
# -> a takeaway -> an exercise. About 37 minutes to read (its words, code and printed
# lines); Run All takes under half a minute on a 2-core laptop.
# <!-- numbers: 37 because it is the reading time, counted as 2,592 words / 200 + 197 code lines / 10 + 92 printed lines / 20 -->

# %%
import dataclasses
import math
from types import SimpleNamespace

import matplotlib.pyplot as plt
from matplotlib.patches import Patch

import lessonlib
from lessonlib import costmodel as cm
from lessonlib.instruments.claims import at_least, at_most, claim, every, within
from lessonlib.context_parallel import chunks_of, ring, ring_runs, torch_ref
from lessonlib.costmodel import compute as cc
from lessonlib.costmodel import get_cluster
from lessonlib.costmodel import context as cx
from lessonlib.costmodel.memory import activation_bytes_per_layer
from lessonlib.models import GPTConfig
from lessonlib.instruments.nccl_rules import nccl_hazards
from lessonlib.viz.source import show

# %% [markdown]
# ## 1. The idea: attention grows with s, and faster than the rest
#
# **The reading circle.** A book too long for one reader is split among c readers, each
# keeping the pages they must summarize (their queries). To summarize a page you must have
# read every page before it (the keys and values), so the readers pass the pages round the
# circle: each reads the pages in hand, passes them on, and receives the next ones, until
# every bundle has visited everyone. Nobody ever holds the whole book.
#
# What grows with s, for Llama 3 405B's shape (h = 16384, a = 128 heads, 8 key/value
# heads), per layer and micro-batch of b sequences of s tokens (here b = 1):
#
# - the activations a layer keeps for its backward, without recomputation. Korthikanti et
#   al. 2022 (§4.1) count a GPT-3-style layer, with dropout: 34 s b h bytes plus 5 a s² b,
#   the softmax output (2 a s² b), the attention dropout's mask (a s² b) and its output
#   (2 a s² b). Llama 3's layer has no dropout (Meta's `llama/model.py` has none): unfused,
#   it would keep the softmax output alone, 2 a s² b;
# - the forward FLOPs of Llama 3's own layer (SwiGLU, grouped-query attention): the matrix
#   products, linear in s, and the attention scores (QK^T and PV), quadratic: 4 b s² h for
#   all s x s scores, half that under the causal mask, whose upper triangle a causal kernel
#   skips. The attention's share of the layer's FLOPs, causal and if all were computed:

# %%
# NBVAL_CHECK_OUTPUT
llama = cx.LLAMA3_405B                   # Llama 3's h, a, K/V heads in a GPT-3-style layer
llama_layer = cm.MODELS["llama3-405B"]   # Llama 3's own layer: SwiGLU, GQA, causal attention
print(f"{'':>7} {'activations, GiB per layer':^41}  {'forward TFLOP per layer':^46}")
print(f"{'s':>7} {'GPT-3 count':>12} {'its 5as²b':>12} {'Llama 2as²b':>14}  {'matmuls':>8} "
      f"{'causal attn':>12} {'share, causal':>14} {'all s x s':>9}")
for s in (8192, 32768, 131072):
    gpt3_count, own = (dataclasses.replace(m, s=s) for m in (llama, llama_layer))
    acts = activation_bytes_per_layer(gpt3_count, 1)     # 34 s b h + 5 a s² b, b = 1
    dropout_kept, softmax_only = 5 * own.a * s * s, 2 * own.a * s * s
    attention = cc.attention_core_forward_flops(own, 1)  # causal: 2 b s² h
    matmul = cc.layer_forward_flops(own, 1) - attention
    print(f"{s:>7} {acts / 2**30:>12,.0f} {dropout_kept / 2**30:>12,.0f} "
          f"{softmax_only / 2**30:>14,.0f}  {matmul / 1e12:>8.0f} {attention / 1e12:>12.0f} "
          f"{attention / (attention + matmul):>14.0%} "
          f"{2 * attention / (2 * attention + matmul):>9.0%}")

# %% [markdown]
# At 128K tokens, by Korthikanti's count for GPT-3's layer, one layer would keep 10,308 GiB
# for its backward, almost all of it the s² term; Llama 3's layer, without dropout, would
# still keep 4,096 GiB of softmax output. Under the causal mask the attention scores are
# 40 % of the layer's forward FLOPs (57 % if all s x s were computed). FlashAttention (Dao
# et al. 2022) never stores the s x s softmax: it works block by block and keeps one
# log-sum-exp per query. What remains is linear in s (Korthikanti's 34 s b h bytes for
# GPT-3's layer), and that, too, is too much for one GPU at 128K. Context parallelism
# divides it by c.

# %% [markdown]
# ## 2. The prediction: who does how much work
#
# Split into c contiguous pieces, a causal mask is unfair: a query at position i scores
# i+1 keys, so the rank holding the last tokens attends to everything and the first only
# to its own tokens. The **zig-zag** split (Llama 3, torchtitan; Brandon et al. 2023 stripe
# instead) cuts the sequence into 2c chunks and gives rank i chunks i and 2c-1-i, an early
# chunk and a late one (`lessonlib.context_parallel.layout`):

# %%
# NBVAL_CHECK_OUTPUT
for layout in ("contiguous", "zigzag"):
    print(f"{layout:>10}, c = 4: " + "  ".join(f"rank {r}: chunks {chunks_of(r, 4, layout)}"
                                             for r in range(4)))
print(f"\n{'c':>3} {'contiguous: last / first rank':>30} {'2c-1':>5} {'zig-zag: max / min':>19}")
for c in (2, 4, 8, 16):
    print(f"{c:>3} {cx.imbalance(1024 * c, c, 'contiguous'):>30.2f} {2 * c - 1:>5} "
          f"{cx.imbalance(1024 * c, c, 'zigzag'):>19.2f}")

# %% [markdown]
# The cost model counts the (query, key) scores each rank keeps under the mask
# (`costmodel.context.causal_pairs_per_rank`): the contiguous split's last rank does about
# 2c-1 times the first's work, and every zig-zag rank the same.

# %% [markdown]
# ## 3. The ring, step by step
#
# Each of the c ranks holds s/c tokens' q, k and v. At step i (i = 0 to c-1) rank r holds
# the key/value block of rank (r - i) mod c. Before computing with it, it posts the send of
# that block to the next rank and the receive of the previous rank's (one
# `batch_isend_irecv`, as NCCL needs), so the transfer runs while it computes. This is
# `ring_forward`, the loop (its `step` is i):

# %%
show(ring.ring_forward)

# %% [markdown]
# and one step, `forward_step`: attend this rank's queries to the block in hand, chunk pair
# by chunk pair (`ring.pairs` leaves out the pairs entirely above the causal diagonal), and
# merge each partial result into the output with the log-sum-exp rule. A block returns its
# normalised output o_j and l_j = log Σ exp(q·k/√d) over its keys; two merge exactly as
# l = log(e^{l_1} + e^{l_2}), o = e^{l_1 - l} o_1 + e^{l_2 - l} o_2 (FlashAttention's
# online softmax, across ranks):

# %%
show(ring.forward_step)

# %% [markdown]
# The backward (`ring_backward`) is a ring too: each block travels again, now carrying the
# gradients of its keys and values, which every rank it visits adds to; one last hop brings
# them home to their owner. Only this rank's q, k, v, output and log-sum-exp are saved for
# the backward, all s/c tokens long.

# %% [markdown]
# ## 4. The real run
#
# One launch of 4 ranks does everything below: ring attention at c = 1, 2, 3 and 4 (groups
# of c consecutive ranks; at c = 3 the fourth rank is in no group and is refused), both
# layouts, causal and not, in float64 against one-process `scaled_dot_product_attention`;
# the tiny GPT on c = 2 ranks times d = 2 data-parallel replicas against one process for 3
# SGD steps; the ring timed at c = 4 on a longer sequence, in float32; and PyTorch's own
# context parallelism on the same kind of inputs.

# %%
# NBVAL_IGNORE_OUTPUT
GPT = GPTConfig(vocab=32, seq=16, hidden=16, heads=2, layers=2)


def the_run():
    return SimpleNamespace(parity=ring_runs.attention_reports((1, 2, 3, 4)),
                           gpt=ring_runs.gpt_report(2, GPT, b=2, steps=3),
                           balance=ring_runs.balance_report(s=2048, heads=4, head_dim=64,
                                                            repeats=5),
                           torch=torch_ref.demo())


measured = lessonlib.launch(the_run, 4, timeout=180)
print(f"{len(measured)} ranks reported")

# %% [markdown]
# ### Parity
#
# The largest error of every output and gradient, over every rank, c, layout and mask
# (each is relative to values of order 1), as the decimal places they agree to:

# %%
# NBVAL_IGNORE_OUTPUT
reports = [rep for r in measured for rep in r.parity.values()
           if isinstance(rep, ring_runs.RingParity)]          # a rank in no group of c: Refused
worst = max(max(rep.output, rep.dq, rep.dk, rep.dv) for rep in reports)
gpt = [r.gpt for r in measured]
at_least("the decimal places to which ring attention agrees with one-process SDPA (float64), "
         "-log10 of the largest difference in the output and dq, dk, dv over every rank at "
         "c = 1, 2, 3, 4, both layouts, causal and not,", -math.log10(worst), 12)
gpt_worst = max([abs(mine - ref) for g in gpt for mine, ref in zip(g.losses, g.reference_losses)]
                + [g.grads[0] for g in gpt] + [g.weights[0] for g in gpt])
at_least("the decimal places to which the tiny GPT on c = 2 ranks x d = 2 replicas agrees with "
         "one process in the losses, gradients and weights of 3 SGD steps", -math.log10(gpt_worst),
         12)
refusal = measured[3].parity[3, "zigzag", True].refused
claim("at c = 3 the fourth rank, in no group of 3, is refused",
      "not in the given group" in refusal, numbers=f"its error: {refusal}")

# %% [markdown]
# ### The ring, drawn from the measured run
#
# Each bar is one step of one rank's forward at c = 4 on s = 2048 tokens, 4 heads of 64
# (its compute; a gap is the rank waiting, for a block or for a core), coloured by the rank
# whose key/value block it held (and labelled where wide enough). A **pale** bar is a step
# whose block the causal mask hides entirely (its keys all come after the rank's queries):
# the rank keeps no score, so its bar is a sliver. Contiguous above: rank 0 finds nothing
# to do after its own block, rank 3 something at every step. Zig-zag below: no pale bar,
# every rank has the same work (a bar is longer where its rank waited for one of the 2
# shared cores).

# %%
balance = [r.balance for r in measured]
fig, axes = plt.subplots(2, 1, figsize=(10, 4.6), constrained_layout=True, sharex=True)
colors = plt.cm.tab10.colors
for ax, layout in zip(axes, ("contiguous", "zigzag")):
    steps = [bal[layout]["steps"] for bal in balance]
    first = min(st["start_s"] for rows in steps for st in rows)
    for rank, rows in enumerate(steps):
        for st in rows:
            left, width = (st["start_s"] - first) * 1e3, st["seconds"] * 1e3
            ax.barh(rank, width, left=left, color=colors[st["source"]],
                    alpha=1.0 if st["work"] else 0.25, edgecolor="black", linewidth=0.4)
            if width > 1.5:
                ax.text(left + width / 2, rank, f"K/V {st['source']}", ha="center",
                        va="center", fontsize=8)
    ax.set_yticks(range(4), [f"rank {r}" for r in range(4)])
    ax.invert_yaxis()
    ax.set_title(f"{layout}: forward ring, c = 4, s = 2048 (measured)", fontsize=10)
axes[-1].set_xlabel("ms since the first step began")
key = [Patch(color=colors[r], label=f"K/V block of rank {r}") for r in range(4)]
key.append(Patch(facecolor=colors[0], alpha=0.25, edgecolor="black", linewidth=0.4,
                 label="pale: the mask hides\nthe whole block (no score)"))
fig.legend(handles=key, loc="outside right upper", fontsize=8)
plt.show()

# %% [markdown]
# ### The zig-zag balance, measured
#
# Per rank, for the forward at c = 4: the scores the causal mask kept (the work a causal
# kernel must do), the scores computed (this implementation computes a diagonal chunk pair
# whole, then masks it), and the CPU seconds of the rank's thread (on 2 shared cores a rank
# waits for a core, and its wall time then says little about its work; each step's CPU time
# is the least of 5 rings, so one interruption does not count as work):

# %%
# NBVAL_IGNORE_OUTPUT
print(f"{'layout':>10} {'rank':>4} {'scores kept':>12} {'computed':>10} {'CPU ms':>7} {'wall ms':>8}")
for layout in ("contiguous", "zigzag"):
    for rank, bal in enumerate(balance):
        row = bal[layout]
        print(f"{layout:>10} {rank:>4} {row['work']:>12} {row['computed']:>10} "
              f"{row['cpu_s'] * 1e3:>7.1f} {row['seconds'] * 1e3:>8.1f}")
work = {lay: [bal[lay]["work"] for bal in balance] for lay in ("contiguous", "zigzag")}
cpu = {lay: [bal[lay]["cpu_s"] for bal in balance] for lay in ("contiguous", "zigzag")}
every("the measured work per rank is the cost model's",
      {lay: (work[lay], cx.causal_pairs_per_rank(2048, 4, lay)) for lay in work},
      lambda pair: pair[0] == pair[1])
within("the contiguous layout's last rank's work over its first's, against 2c-1 = 7,",
       work["contiguous"][-1] / work["contiguous"][0], expected=7, tolerance=0.15)
at_most("the zig-zag layout's busiest rank's work over its least busy's",
        max(work["zigzag"]) / min(work["zigzag"]), 1.15)
at_least("the contiguous layout's last rank's CPU time over its first's",  # 1.4-1.8 measured
         cpu["contiguous"][-1] / cpu["contiguous"][0], 1.25)
at_most("the zig-zag layout's largest CPU time per rank over its smallest",  # 1.02-1.07
        max(cpu["zigzag"]) / min(cpu["zigzag"]), 1.6)      # measured, once 1.52 in a full run

# %% [markdown]
# The work is exactly what the cost model predicted; the CPU time follows it, less
# steeply for the contiguous split than the work does, because this implementation
# computes a diagonal chunk whole (and masking costs extra), so every rank pays for one
# full diagonal block however little it keeps. A FlashAttention kernel skips the tiles
# above the diagonal, which brings the time ratio nearer the work's 2c-1.
#
# ### Memory and messages
#
# What autograd saved for the backward of one ring attention, per rank (the activation
# meter `lessonlib.instruments.activations.saved_bytes`), and of the whole tiny GPT on c = 2 ranks
# against one process on the same sequences; the key/value bytes each rank received
# (the ledger) against the formula: c-1 blocks forward, and backward the c-1 blocks again
# plus c hops of their gradients (`costmodel.context.ring_bytes_received_per_rank`); and
# the recorded messages replayed under NCCL's rules (`nccl_rules.nccl_hazards`).

# %%
# NBVAL_CHECK_OUTPUT
one = measured[0].parity[1, "zigzag", True].saved_bytes
for c in (1, 2, 3, 4):
    rep = measured[0].parity[c, "zigzag", True]
    print(f"c = {c}: {rep.saved_bytes:>6} bytes saved per rank ({rep.saved_bytes / one:.3f} "
          f"of one process), K/V bytes received {rep.received}")
every("each rank's ring attention saves exactly 1/c of one process's bytes (c times it is "
      "one process's)",
      {f"c = {c}": c * measured[0].parity[c, "zigzag", True].saved_bytes for c in (1, 2, 3, 4)},
      lambda c_times_saved: c_times_saved == one)
every("the ledger's key/value bytes per rank equal the formula, both layouts, causal and not",
      {f"c = {c}": [rep for r in measured for key, rep in r.parity.items()
                    if key[0] == c and isinstance(rep, ring_runs.RingParity)]
       for c in (1, 2, 3, 4)},
      lambda reps: all(rep.received == rep.predicted_received for rep in reps))
for c in (2, 3, 4):
    traces = [r.parity[c, "zigzag", True].events for r in measured[:c * (4 // c)]]
    hazards = nccl_hazards(traces)
    claim(f"the messages at c = {c} pass nccl_hazards", hazards == [],
          numbers=f"{sum(map(len, traces))} calls replayed: {'; '.join(hazards) or 'no hazard'}")

# %%
# NBVAL_IGNORE_OUTPUT
ratio = gpt[0].activation_bytes / gpt[0].one_process_activation_bytes
within("the tiny GPT's activation bytes per rank at c = 2, against 1/c of one process's,",
       ratio, expected=0.5, tolerance=0.10)

# %% [markdown]
# ### PyTorch's own context parallelism
#
# PyTorch ships context parallelism as
# `torch.distributed.tensor.experimental.context_parallel(mesh, buffers=..., buffer_seq_dims=...)`:
# inside its `with` block the buffers are sharded along the sequence and
# `scaled_dot_product_attention` is dispatched to its CP attention. That attention
# all-gathers K and V by default, after the first block's attention
# (`_context_parallel/_attention.py`: `rotate_method: _RotateMethod = _RotateMethod.ALL_GATHER`);
# `set_rotate_method('alltoall')` passes the blocks around a ring instead. torchtitan, which
# uses it, keeps that default: "The default value is 'allgather'." (its `job_config.py`).
# It implements CP attention for the flash, memory-efficient and cuDNN kernels of GPUs; on
# CPU ranks it stops, in its words:

# %%
# NBVAL_IGNORE_OUTPUT
print(measured[0].torch)

# %% [markdown]
# So on CPU ranks one-process SDPA stays the reference; on one GPU per rank the same call
# runs PyTorch's CP attention, and `labs/cp.py` times it beside ours there (here it records
# the error and times ours against one-process SDPA).

# %% [markdown]
# ## 5. What c buys at the same GPUs and batch, and how Llama 3 passed keys and values
#
# Llama 3 405B at 128K tokens on 16,384 H100, 16M tokens per step (128 sequences), with
# Meta's t = 8 and p = 16 (Dubey et al. 2024, Table 4; ZeRO-1 standing in for its FSDP, no
# recomputation, plain 1F1B where Meta interleaved): the GPUs left, c·d = 128, go to
# context or to data parallelism. Each replica gets 128/d = c sequences, so c is also the
# number of micro-batches its pipeline can be fed (b = 1). From the cost model:

# %%
# NBVAL_CHECK_OUTPUT
h100 = get_cluster("dgx-h100")
llama_128k = dataclasses.replace(cm.MODELS["llama3-405B"], s=131072)


def llama_at_128k(c, cp_comm="allgather"):
    layout = cm.Layout(t=8, c=c, p=16, d=128 // c, b=1, global_batch=128, recompute="none",
                       sequence_parallel=True, zero_stage=1, cp_comm=cp_comm)
    return cm.estimate(llama_128k, layout, h100)


print(f"{'c':>3} {'d':>4} {'m':>3} {'activations GB/GPU':>19} {'bubble':>7} {'step s':>7}")
by_c = {c: llama_at_128k(c) for c in (1, 2, 4, 8, 16)}
for c, e in by_c.items():
    print(f"{c:>3} {128 // c:>4} {e.layout.m:>3} {e.memory.activations / 1e9:>19.1f} "
          f"{e.bubble_fraction:>7.1%} {e.step_time_s:>7.1f}")
one, sixteen = by_c[1], by_c[16]
at_most("how far c = 16's activations per GPU are from c = 1's, as a fraction of them,",
        abs(sixteen.memory.activations / one.memory.activations - 1), 0.05)
at_least("the bubble's share of the step at c = 1", one.bubble_fraction, 0.9)
at_most("the bubble's share of the step at c = 16", sixteen.bubble_fraction, 0.5)
at_least("the step time at c = 1 over c = 16's", one.step_time_s / sixteen.step_time_s, 5)

# %% [markdown]
# At a fixed GPU count and batch, c does not shrink what a GPU holds: at c = 1 a stage
# keeps one micro-batch of 128K tokens in flight, at c = 16 sixteen micro-batches of 8K
# tokens each (1F1B keeps up to p in flight), the same tokens. What c buys is
# **micro-batches**: a replica of c ranks gets c sequences instead of one, and 1F1B's bubble,
# (p-1) idle slots against m busy ones, shrinks with m. Compared at different GPU counts or
# batches, c seems to divide the activations by c; compared at Llama 3's own, it divides the
# idle time.
#
# **How the keys and values travel.** The ring of sections 3-4 posts each block's transfer
# before the compute it hides behind: Megatron-Core does this (`--cp-comm-type p2p`, its
# default), and PyTorch's `context_parallel` when told to (section 4). Llama 3 did not: it
# all-gathers K and V over the c ranks, then computes attention for its own queries.
# "Although the all-gather communication latency is exposed in the critical path, we still
# adopt this approach for two main reasons" (Dubey et al. 2024, §3.3.2): "it is easier and
# more flexible to support different types of attention masks in all-gather based CP
# attention, such as the document mask" (a token attends only inside its own document),
# and "the exposed all-gather latency is small as the communicated K and V tensors are much
# smaller than Q tensor due to the use of GQA" (8 key/value heads against 128 query heads).
# Balance is not among Meta's reasons; it is this course's reading that a document mask
# makes a ring's blocks uneven and its steps hard to balance. Its split is the zig-zag one,
# 2c chunks. The cost model prices both at c = 16:

# %%
# NBVAL_CHECK_OUTPUT
ring_run, gathered = llama_at_128k(16, "ring"), llama_at_128k(16, "allgather")
for name, e in (("ring (Megatron-Core's default)", ring_run),
                ("all-gather (Llama 3, PyTorch's)", gathered)):
    print(f"{name:<33} exposed CP traffic {e.time['cp_comm']:5.2f} s of a "
          f"{e.step_time_s:5.2f} s step")
claim("the ring hides all its traffic", ring_run.time["cp_comm"] == 0,
      numbers=f"exposed {ring_run.time['cp_comm']:.3g} s")
claim("the all-gather leaves some of its traffic exposed", gathered.time["cp_comm"] > 0,
      numbers=f"exposed {gathered.time['cp_comm']:.3g} s")
at_most("the all-gather's step time over the ring's, less 1,",
        gathered.step_time_s / ring_run.step_time_s - 1, 0.1)
port, _ = h100.link(spans_nodes=True)   # one GPU's own port: the c ranks are t = 8 GPUs apart
peak = h100.gpu.peak_flops
step = cx.ring_step(llama, b=1, c=16, flops_per_s=peak, link_bytes_per_s=port, t=8)
block_mib = cx.kv_block_bytes(llama, 1, 16) / 8 / 2**20
print(f"one ring step per GPU (t = 8, c = 16): computes {step.compute_s * 1e3:.3f} ms on "
      f"average under the causal mask, moves its {block_mib:.0f} MiB of K/V in "
      f"{step.transfer_s * 1e3:.3f} ms")
shortest = cx.shortest_hidden_shard(llama, peak, port)
print(f"a step hides its block from {shortest:,.0f} tokens per rank (s/c) up; at c = 16 a rank "
      f"holds {131072 // 16:,}")
at_least("a ring step's compute over its block's transfer, per GPU at t = 8 and c = 16,",
         step.compute_s / step.transfer_s, 1)

# %% [markdown]
# Per GPU at Llama 3's t = 8, a ring step computes for 0.278 ms and moves its 4 MiB of K and
# V in 0.084 ms: each GPU holds 1/t of the heads, so it does 1/t of the layer's step and
# moves 1/t of its block, over its own port. Under the causal mask a zig-zag step keeps half
# a block's scores, so the ring hides its blocks from 2,472 tokens per rank up (the same at
# any t), and at c = 16 each rank holds 8,192.
#
# **Three ways, run side by side.** `lessonlib.context_parallel` runs all three on the same
# shards: `ring_attention`, `allgather_attention` (Llama 3's: K and V gathered, the
# backward reduce-scatters their gradients) and `ulysses_attention` (DeepSpeed-Ulysses,
# Megatron-Core's `a2a`: an all-to-all turns sequence shards into head shards, each rank
# attends over the whole sequence for heads/c heads, a second all-to-all turns them back;
# c must divide the heads, and the KV heads under GQA). Each equals one-process attention in
# float64, with GQA and with document masks (`tests/test_context_parallel_methods.py`).
# Below, on 4 ranks and with grouped-query attention (`shape`), each method's forward and
# backward: the bytes a rank sent against the cost model's formula, and the time, without
# and with a document mask of uneven documents:

# %%
# NBVAL_IGNORE_OUTPUT
from lessonlib.context_parallel import method_runs

shape = dict(s=512, heads=8, kv_heads=4, head_dim=32)
docs = (37, 211, 64, 200)                  # four documents of uneven lengths
timed = {"no mask": method_runs.run_times(4, **shape),
         "documents": method_runs.run_times(4, docs=docs, **shape)}
print(f"{'method':>10} {'KB sent/rank':>13} {'formula KB':>11} {'ms, no mask':>12} "
      f"{'ms, documents':>14}")
for method in ("ring", "allgather", "ulysses"):
    mine = timed["no mask"][method]
    formula = sum(cx.cp_bytes_sent_per_rank(method, c=4, b=1, s=512, heads=8,
                                            kv_heads=mine.kv_heads_moved, head_dim=32,
                                            bytes_per_value=4))
    print(f"{method:>10} {mine.sent[0] / 1e3:>13.1f} {formula / 1e3:>11.1f} "
          f"{mine.seconds * 1e3:>12.1f} {timed['documents'][method].seconds * 1e3:>14.1f}")
every("a method's bytes sent equal the formula on every rank, with and without documents",
      {m: [(sent, sum(cx.cp_bytes_sent_per_rank(m, c=4, b=1, s=512, heads=8,
                                                kv_heads=t[m].kv_heads_moved, head_dim=32,
                                                bytes_per_value=4)))
           for t in timed.values() for sent in t[m].sent] for m in timed["no mask"]},
      lambda pairs: all(sent == formula for sent, formula in pairs))
work = cx.document_work(docs, 4, "zigzag")
claim("under the document mask the ring's steps last longer than the all-gather's one pass",
      work.ring > work.allgather,
      numbers=f"kept scores on the busiest rank: ring {work.ring:,} summed over its steps, "
              f"all-gather {work.allgather:,}, an even split {work.even:,.0f}")

# %% [markdown]
# Here s = 512, with 8 query heads and 4 key/value heads; the ring repeats K and V to all 8
# heads, so its blocks carry them all. When each wins:
# - **The ring** sends the most (every K/V block passes every rank, and without GQA it
#   carries all heads), but each transfer hides behind a step of attention, so on long
#   sequences it costs nothing in time (section 5's cost model). Under a causal mask its
#   steps are balanced by the zig-zag split; under document masks they are not: the ranks
#   wait for each other every step, so each step lasts its busiest rank's work.
# - **All-gather** sends each K/V shard once, small under GQA, and computes each rank's
#   queries in one pass, so a document mask costs it only its busiest rank's total (the
#   claim above); its latency is exposed. Llama 3 chose it for both reasons (§3.3.2).
# - **Ulysses** sends the least per rank here and attends over whole sequences, so masks of
#   any shape cost nothing extra, but c cannot exceed the KV heads (8 for Llama 3 405B), its
#   all-to-alls cross every rank of the group twice each way, and they are exposed.
# Times on CPU ranks measure this machine, not a GPU cluster; the bytes and the work are
# what carry over.

# %% [markdown]
# <div style="border: 2px solid #4c72b0; border-radius: 6px; padding: 10px 14px;">
# <b>Takeaway.</b> Context parallelism splits the sequence over c ranks and brings each
# rank the others' keys and values: around a ring, each transfer posted before the compute
# it hides behind (Megatron-Core's default), or in one all-gather whose latency is
# exposed (Llama 3, which names its document masks and GQA's small K and V; PyTorch's
# `context_parallel` by default). The
# log-sum-exp rule merges the blocks exactly, so the result is the one-process attention.
# Every activation becomes s/c tokens long. Under a causal mask a contiguous split leaves
# the last rank about 2c-1 times the first's work; the zig-zag split (chunks i and 2c-1-i)
# balances it. At a fixed GPU count and batch, c does not shrink a GPU's activations; it
# gives each replica c sequences, so the pipeline gets c micro-batches and its bubble
# shrinks.
# </div>
#
# ## Exercise
#
# **1.** Under a causal mask, a long sequence is split over c = 8 ranks, and the ring's
# ranks wait for each other at every step, so a step lasts as long as its busiest rank's
# work. How many times longer does the forward ring take with the contiguous split than
# with the zig-zag one? (Count the (query, key) scores the mask keeps at each step, in
# blocks of n = s/c tokens; section 2's table gives each rank's total, not each step's.)

# %%
from lessonlib.exercises import context as ex

my_speedup = None
ex.check_ring_speedup(my_speedup, c=8)

# %% tags=["solution", "hide-input", "hide-output"] jupyter={"outputs_hidden": true, "source_hidden": true}
# Solution (click to open)
# NBVAL_CHECK_OUTPUT
# contiguous: step 0 every rank's own triangle (1/2), then 7 steps with a full block on the
# busiest rank (1); zig-zag: half a block on every rank at each of the 8 steps
speedup_solution = (1 / 2 + (8 - 1) * 1) / (8 * 1 / 2)
ex.check_ring_speedup(speedup_solution, c=8)
