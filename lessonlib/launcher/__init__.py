"""Run one function on N ranks, safely and fast, from a notebook cell, a script or torchrun.

What it teaches: a distributed program is N copies of the same function, told apart only
by their rank. ``launch`` starts those copies as CPU ranks (gloo) or one per GPU (NCCL),
joins them in a process group, and hands their return values back in rank order. It keeps
the traps of Jupyter + multiprocessing away from the student:

- the function may be written in a notebook cell: it travels by value (cloudpickle) with
  the globals it uses; what cannot travel gets a one-line error before any process starts;
- ranks are forked from a server that imported torch once (a warm launch takes about a
  tenth of a second, a cold one seconds), and never run stale code;
- the ranks meet through a file in the launch's private folder: nothing listens on the
  network, and launches in a row or from two notebooks at once never collide;
- an exception in a rank is raised here, naming the rank that failed first, with its
  traceback; the other ranks are stopped and no process (nor any a rank started) outlives
  the call or the kernel;
- a hang ends at ``timeout`` with the last step each rank reported through ``progress``
  and the line each rank's Python stack was at (``faulthandler``, into the rank's log);
- each rank's prints go to a log, not the notebook; return values come back by value.

The files, in the order a launch uses them:

- ``checks``: what is refused before any process starts, and ``pack`` (the function by value);
- ``starter``: the preloaded fork server, through ``forkserver`` (the one module that
  touches multiprocessing's private details, with the Python versions it was checked on);
- ``folders``: the launch's private folders, each held by a lock while its owner lives;
- ``rank``: what each rank does, from birth to its result (and ``demo_rank_sum``);
- ``local``: ``launch`` itself, watching the ranks until results, a failure or the timeout;
- ``reaper``: every process a rank starts ends with the launch, in whatever session;
- ``errors``: ``RankError`` and ``LaunchTimeout``, and the words that explain them;
- ``torchrun``: ``run``, the labs' one entry under python, torchrun or srun.

Laptop:  ``python -c "import lessonlib as L; print(L.launch(L.launcher.demo_rank_sum, 4))"``
GPU box: the same call uses NCCL when 4 GPUs are visible; under torchrun use ``run``.
"""
from lessonlib.instruments.breadcrumbs import progress
from lessonlib.launcher import starter
from lessonlib.launcher.errors import LaunchTimeout, RankError
from lessonlib.launcher.local import DEFAULT_TIMEOUT_S, launch
from lessonlib.launcher.rank import demo_rank_sum, phase_times
from lessonlib.launcher.starter import server_pid, stop_server
from lessonlib.launcher.torchrun import is_main_process, run, under_torchrun

# A caller's own folder takes torch's compile cache, before the caller imports torch._dynamo.
# A torchrun (or srun) rank is no caller: it launches nothing and leaves with os._exit, which
# would leave that folder behind, one per rank.
if starter.is_a_caller() and not under_torchrun():
    starter.keep_the_compile_cache_in_our_folder()

__all__ = ["DEFAULT_TIMEOUT_S", "LaunchTimeout", "RankError", "demo_rank_sum", "is_main_process",
           "launch", "phase_times", "progress", "run", "server_pid", "stop_server",
           "under_torchrun"]
