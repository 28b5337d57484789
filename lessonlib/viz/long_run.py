"""The loss curve of a run that failed and resumed, over the run that never stopped.

Laptop and GPU box alike (matplotlib only)::

    from lessonlib.viz import long_run as lrviz
    lrviz.resume_plot(whole.losses, resumed.losses, checkpoint_step=20, failed_step=25)
"""
from __future__ import annotations

import matplotlib.pyplot as plt


def resume_plot(uninterrupted, resumed, checkpoint_step: int, failed_step: int, ax=None):
    """Both curves, step 1 on: the resumed run's steps before its checkpoint came from the
    first attempt (through the checkpoint), the ones after it were run again. The grey
    band is the work lost to the failure and done twice."""
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 3.6))
    steps = range(1, len(uninterrupted) + 1)
    ax.plot(steps, uninterrupted, color="#4C72B0", lw=4, alpha=0.35, label="never stopped")
    before = range(1, checkpoint_step + 1)
    after = range(checkpoint_step + 1, len(resumed) + 1)
    ax.plot(before, resumed[:checkpoint_step], color="#DD8452", lw=1.5,
            label=f"first attempt, kept by the checkpoint of step {checkpoint_step}")
    ax.plot(after, resumed[checkpoint_step:], color="#55A868", lw=1.5, ls="--",
            label=f"resumed from step {checkpoint_step}")
    ax.axvspan(checkpoint_step, failed_step, color="grey", alpha=0.2,
               label=f"steps lost at the failure (step {failed_step}) and run again")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_title("a failure costs the steps since the last checkpoint, not the run")
    ax.legend(fontsize=8)
    return ax.figure
