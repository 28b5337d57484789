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
# # 06 · Deep dive: the bug zoo
#
# *This deep dive goes with every core notebook: each bug below breaks one scheme of
# [02](02-data-parallelism.ipynb), [04](04-tensor-vs-pipeline.ipynb) or
# [05](05-hybrid-parallelism.ipynb), and each trap is a check those notebooks use.*
#
# **The zoo.** Each cage holds one bug, caught alive: a one-line switch in the real
# `lessonlib` code brings it back, and the card on the cage says what it is, where it lives,
# what it looks like from outside, and which trap catches it. None is invented: each is a
# kind of bug that teams building data, tensor and pipeline parallelism have shipped, and
# each is quiet: no exception, no hang, a model that still trains, just not the model you
# meant.
#
# The traps are the two checks the course has used all along: **parity with one process**
# (outputs, input gradients, weight gradients) and **counting** what each rank holds and
# sends (`comm.ledger`). One of the bugs passes every parity test.
#
# <!-- numbers: 17 because it is the number of a notebook -->
# The last three cages (`hang_*`) hold the loud kind, from
# [17](17-deep-dive-when-things-go-wrong.ipynb): ranks that stop agreeing on their sequence of
# collectives, and the job hangs. Their trap is a third one, the **flight records** every rank
# keeps: when the launch times out, they name the stuck call, its group and who never came.
#
# Switch a bug on with `with bug_switches.enabled("name"):` or `LESSONLIB_BUGS=name` in the
# environment; ranks started by `lessonlib.launch` inherit it.

# %%
import textwrap

import matplotlib.pyplot as plt

from lessonlib import bug_checks, bug_switches
from lessonlib.viz import bugzoo as viz

# %% [markdown]
# ## 1. The cages
#
# The registry, `bug_switches.BUGS`, is the documentation: for each bug, the line its switch
# changes (read from the source now, so it is never stale), and the existing test in
# `tests/` that fails when it is on.

# %%
for name, bug in bug_switches.BUGS.items():
    where, code = bug_switches.hook_line(name)
    print(f"{name}  ({where})\n{textwrap.indent(code, ' ' * 8)}\n"
          f"    caught by: {bug.check}\n    test: {bug.test}\n")

# %% [markdown]
# ## 2. What each trap should show
#
# Before running anything, three of the bugs leave a number we can predict exactly:
#
# * **A layer left unsharded** (`tp_layer_left_unsharded`): a transformer layer has
#   12h² + 7h parameters in its split matrices and 6h replicated (LayerNorms and the two
#   row-parallel biases), so each of t ranks should hold (12h² + 7h)/t + 6h. If the MLP
#   stays dense, only attention's 4h² + 3h are split: the MLP's 8h² + 5h sit whole on every
#   rank, next to the 5h of the LayerNorms and attention's output bias.
# * **An unscaled pipeline loss** (`pipeline_loss_unscaled`): each of the m micro-batches'
#   losses is backpropagated without the 1/m, so the gradients are exactly m times too big.
# * **A sync on the wrong micro-batch** (`ddp_sync_on_wrong_microbatch`): with 2
#   micro-batches, the all-reduces should go out [0, 1] per micro-batch; inverted, [1, 0].
#
# The checks use h = 16, t = 2 and m = 4 (tiny, so that every check is one short launch):

# %%
# NBVAL_CHECK_OUTPUT
h, t, m = 16, 2, 4
predicted_bytes = {"off": ((12 * h * h + 7 * h) // t + 6 * h) * 4,
                   "on": ((4 * h * h + 3 * h) // t + (8 * h * h + 5 * h) + 5 * h) * 4}
predicted_ratio = {"off": 1.0, "on": float(m)}
predicted_sends = {"off": [0, 1], "on": [1, 0]}
print(f"weight bytes per rank:  {predicted_bytes}")
print(f"gradient norm / one-process gradient norm:  {predicted_ratio}")
print(f"all-reduces per micro-batch:  {predicted_sends}")

# %% [markdown]
# ## 3. Every trap, with the bug off and on
#
# Two launches per bug, of 2 ranks each (a few seconds apiece; the hangs' loop runs on 3 and
# is given 2 seconds before its flight records are read): each check with its bug off, which
# must pass, and on, which must fail.

# %%
# NBVAL_IGNORE_OUTPUT
results = {name: {"off": bug_checks.check(name, bug_on=False),
                  "on": bug_checks.check(name, bug_on=True)}
           for name in bug_switches.BUGS}
for name, pair in results.items():
    print(f"{name}\n    off: {pair['off'].message}\n    on:  {pair['on'].message}")

# %% [markdown]
# Which traps sprang:

# %%
# NBVAL_CHECK_OUTPUT
for name, pair in results.items():
    print(f"{name:32s} bug off: {'passed' if pair['off'].passed else 'FAILED'}   "
          f"bug on: {'passed' if pair['on'].passed else 'FAILED'}")

# %% [markdown]
# Measured next to predicted:

# %%
# NBVAL_CHECK_OUTPUT
for state in ("off", "on"):
    held = results["tp_layer_left_unsharded"][state].ranks[0].param_bytes
    ratio = results["pipeline_loss_unscaled"][state].ranks[-1].ratio
    sends = results["ddp_sync_on_wrong_microbatch"][state].ranks[0].all_reduces_per_microbatch
    print(f"bug {state:3s}: bytes {held} (predicted {predicted_bytes[state]}), "
          f"gradient ratio {ratio:.3f} (predicted {predicted_ratio[state]:.3f}), "
          f"all-reduces per micro-batch {sends} (predicted {predicted_sends[state]})")

# %% [markdown]
# Each check's largest difference against its tolerance (log scale; 0 sits on the floor,
# an infinite or NaN difference at the top). The unsharded layer's panel is the lesson:
# its output is the dense layer's to 1e-8, yet its check fails, because the check counts
# bytes, not outputs.

# %%
viz.plot_checks(results)
plt.show()

# %% [markdown]
# ## 4. One cage at a time
#
# Pick a bug: its card, the line its switch changes, and its two bars (from the results
# above; nothing is launched when you move the dropdown).

# %%
print(viz.describe("tp_missing_backward_all_reduce", results["tp_missing_backward_all_reduce"]))

# %%
viz.bug_widget(results)

# %% [markdown]
# **Why each one hides.**
#
# * `tp_missing_backward_all_reduce`: f is the identity forward, so leaving out its
#   backward all-reduce changes nothing a forward test can see. Each rank keeps its own
#   partial sum of the input gradient; the layers below learn from half the signal.
# * `ddp_sync_on_wrong_microbatch`: every micro-batch's backward runs and the loss goes down
#   on each rank, but the replicas no longer hold the same weights after the step.
# * `p2p_dropped_request`: a receive buffer is read before its data lands; the values are
#   whatever the memory held. Truly throwing the request handle away is worse on gloo:
#   freeing an unfinished request cancels the receive and the peer's send waits forever,
#   which a launch timeout turns into an error naming each rank's last step.
# * `pipeline_loss_unscaled`: losses are logged correctly; only the gradients are m times
#   too big, which looks like a learning rate m times larger.
# * `tp_layer_left_unsharded`: numerically perfect; it only costs memory and compute, so
#   only a check of bytes held (or messages sent: one all-reduce fewer per layer) sees it.
# * `sp_layernorm_grad_not_summed`: under sequence parallelism each rank's LayerNorm sees
#   s/t rows; without the sum over the group its weight and bias gradients are each rank's
#   part, so outputs and input gradients stay right while the replicas drift apart.
# * `hang_*`: these do not hide, they stop the job; what hides is *where*. Every rank waits
#   in a collective and none says why, until the flight records are lined up by group and
#   call number: the first call that not every member posted, or posted with other sizes.

# %% [markdown]
# ## 5. Try it
#
# Switch a bug on in this kernel, run its check (the ranks inherit the switch), and watch it
# fail. Outside the `with` block the switch is off again.

# %%
# NBVAL_IGNORE_OUTPUT
with bug_switches.enabled("pipeline_loss_unscaled"):
    tried = bug_checks.check("pipeline_loss_unscaled")
print(tried.message)

# %%
# NBVAL_CHECK_OUTPUT
print(f"bug on inside the block: {tried.bug_on}, check passed: {tried.passed}; "
      f"switched on now: {bug_switches.active('pipeline_loss_unscaled')}")

# %% [markdown]
# From a terminal, the named test in `tests/` fails the same way:
#
# ```
# LESSONLIB_BUGS=pipeline_loss_unscaled python -m pytest -x \
#     "tests/test_pipeline_parity.py::test_every_schedule_matches_one_process[2]"
# ```

# %% [markdown]
# <!-- no measured claim: the lesson's rule for parity checks, not a measurement -->
# <div style="border: 2px solid #4c72b0; border-radius: 6px; padding: 10px 14px;">
#
# **Takeaway.** Distributed bugs are quiet: the step runs, the loss goes down. Every
# parallel layout needs two traps: **parity with one process** (outputs *and* input
# gradients *and* weight gradients, after more than one micro-batch) and **counting** what
# each rank holds and sends. Parity alone misses a layer left unsharded; counting alone
# misses a wrong gradient.
#
# </div>

# %% [markdown]
# ## Exercises
#
# Each exercise has a cell for your answer; run it, and the checker says what is right or
# wrong. The solution is hidden under it; Run All runs it without touching your cell.
#
# **1.** A cousin of the unsharded MLP: `parallelize_block` splits the MLP but leaves
# *attention* whole. Write `attention_dense_bytes(h, t)`: the float32 bytes of weights one
# rank holds for that layer (the checker counts them on a real `Block`).

# %%
from lessonlib.exercises import bugzoo as ex


def attention_dense_bytes(h, t):
    raise NotImplementedError


ex.check_attention_left_dense(attention_dense_bytes)

# %% tags=["solution", "hide-input", "hide-output"] jupyter={"outputs_hidden": true, "source_hidden": true}
# Solution (click to open)
# NBVAL_CHECK_OUTPUT
def attention_dense_bytes_solution(h, t):
    mlp_split = 8 * h * h + 4 * h          # fc1 weight and bias, fc2 weight
    whole = 4 * h * h + 4 * h + h + 4 * h  # attention, fc2's bias, two LayerNorms
    return 4 * (mlp_split // t + whole)


ex.check_attention_left_dense(attention_dense_bytes_solution)

# %% [markdown]
# **2. Predict, then run.** `ddp_sync_on_wrong_microbatch` with 3 accumulated micro-batches
# instead of 2: how many all-reduces does each micro-batch send? Read the switched lines in
# `DataParallel.no_sync` (section 1) and write your prediction as one count per
# micro-batch, e.g. `[0, 0, 1]` for correct DDP. The checker runs the bug on 2 real ranks.

# %%
my_prediction = None
ex.check_wrong_microbatch_prediction(my_prediction)

# %% tags=["solution", "hide-input", "hide-output"] jupyter={"outputs_hidden": true, "source_hidden": true}
# Solution (click to open)
# NBVAL_CHECK_OUTPUT
# Inside no_sync the flag is set to sync, and on leaving it is reset to "do not sync": the
# first two micro-batches send, the last one (the one that should) does not.
ex.check_wrong_microbatch_prediction([1, 1, 0])
