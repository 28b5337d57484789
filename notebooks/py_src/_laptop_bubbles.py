# %% [markdown]
# ## 2. Why a CPU's pipeline bubble sits above theory
#
# Notebook 04 measured the bubble of GPipe and 1F1B on two CPU ranks next to the theory,
# `(p-1)/(v·m+p-1)` of the step's wall time, and deep dive 09 did the same for interleaved
# 1F1B. On a laptop the measured bubble usually comes out a few points above that line.
# This section takes one measured step of each schedule apart to show why. First the
# measurement, on the stages of notebook 04: 2 ranks, one compute thread each, an
# `mlp_stack` of 16 Linear + GeLU layers of width 1024 (2 stages of 8, or 4 chunks of 4
# when interleaved), m = 8 micro-batches of 128 rows.

# %%
import lessonlib
from lessonlib.pipeline import runs

# %%
# NBVAL_IGNORE_OUTPUT
measured = lessonlib.launch(runs.measure, 2, ms=(8,), engines=("lessonlib",),
                            schedules=("gpipe", "1f1b", "interleaved"), steps=5, warmup=1,
                            timeout=300)
print(f"{len(measured[0])} schedules measured on {len(measured)} ranks: "
      f"{', '.join(case[1] for case in measured[0])}")

# %% [markdown]
# Where the measured bubble is off the theory, the timeline says why. The formula assumes
# equal stages and free messages. Below, the median step's measured times are fed back into
# the schedule simulation: first only the forwards and backwards of each stage (stages that
# ran at different speeds: the last one adds the loss, and on a shared machine one rank may
# get less of its core than the other), then also the time each send kept its stage busy.
# On CPU ranks a message is copied through the operating system by the sending process, and
# in a pipeline the receiver is usually already waiting, so that copy sits on the critical
# path, twice per micro-batch in the 1F1B steady state; what remains after both is the
# transfer latency a receiver waits for and per-action overhead. Interleaving doubles the
# messages per micro-batch and halves the work between them, which is why it gains least
# here. The difference can also come out negative when other work loads the machine: the
# theory counts idle slots as long as busy ones, but while the line fills and drains one
# rank works alone, at full speed, and in the steady state the two ranks slow each other
# down, so the idle slots come out shorter. Every bubble below is a share of the step's
# wall time, the convention of `(p-1)/(v·m+p-1)`.

# %%
# NBVAL_IGNORE_OUTPUT
def percent(values):
    return "[" + ", ".join(f"{x:.1%}" for x in values) + "]"


for name, m in (("gpipe", 8), ("1f1b", 8), ("interleaved", 8)):
    why = runs.explain_bubble(measured, ("lessonlib", name, m, 2 if name == "interleaved" else 1))
    print(f"{name} m={m}: per stage F {[round(x, 1) for x in why['forward_ms']]} ms, "
          f"B {[round(x, 1) for x in why['backward_ms']]} ms, "
          f"send {[round(x, 1) for x in why['send_ms']]} ms (medians)")
    print(f"   bubble of wall time: theory {why['theory']:.1%} | simulated with measured F, B "
          f"{percent(why['simulated_with_measured_compute'])} | with the sends too "
          f"{percent(why['simulated_with_measured_compute_and_sends'])} | measured "
          f"{percent(why['measured'])}")
