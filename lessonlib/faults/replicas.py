"""A lost replica survived, with torchft: replicas that agree on a quorum every step.

What it teaches: at scale a job cannot stop every time one node dies. torchft (PyTorch's
fault-tolerance library) runs replica groups that meet through a Lighthouse: every step
each group asks it for a quorum (the replicas alive now), averages its gradients with
those replicas only, and commits the step only if every one of them succeeded. A replica
that dies drops out of the next quorum and the others go on; when it is restarted it joins
a quorum, sees that it is behind, and recovers the model and optimizer live from a peer
(no checkpoint file is read). Here each replica is one rank of its own ``launch``
(``rank_replica``); replica ``kill`` kills itself with SIGKILL after step ``kill_at`` and is
launched again at once; the new one waits until the survivors have committed an update
without it before it meets the Lighthouse (a restart quicker than the Lighthouse's join
timeout would otherwise take the dead replica's place in the very next quorum, and nobody
would have gone on without it).

Every replica stops by the same rule (``finished``): at update ``steps`` or later, after
two consecutive updates of the full quorum. Every member of a full quorum lives its update,
so all of them stop at the same one; a replica that sees a peer stop without having met the
rule itself stops with an error instead of going on without it.

The proof is the course's usual one: the survivors' weights equal one process that
replays the same membership step by step, each step's gradient the mean over the replicas
that took part in it (``replay``); the restarted replica ends with the same weights.

What listens where: ``torchft_setup`` (the Lighthouse and every manager on 127.0.0.1; each
replica group's TCPStore on every interface while the run lasts). Everything is closed,
and every process gone, when ``run`` returns.

Laptop:  ``python -c "from lessonlib.faults import replicas; print(replicas.run())"``
GPU box: the same (the replicas stay on CPU ranks: this lesson is about their membership).
"""
from __future__ import annotations

import os
import signal
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from lessonlib.data import corpus_tokens, lm_batch
from lessonlib.faults import torchft_setup
from lessonlib.launcher import launch
from lessonlib.models import GPTConfig, TinyGPT, init_weights_, lm_loss

CONFIG = GPTConfig(vocab=64, seq=16, hidden=32, heads=2, layers=1)
LR, BATCH = 3e-3, 4


def model_and_optimizer(seed: int = 0):
    """The tiny GPT in float64 and its AdamW: every replica and the replay start here."""
    model = init_weights_(TinyGPT(CONFIG), seed=seed).double()
    return model, torch.optim.AdamW(model.parameters(), lr=LR)


def batch(replica: int, step: int):
    """Replica ``replica``'s batch at ``step``: its own shard of the data."""
    tokens, _ = corpus_tokens()
    return lm_batch(tokens, BATCH, CONFIG.seq, step, seed=1 + replica)


@dataclass(frozen=True)
class Step:
    """One step a replica lived: its quorum's size, whether it took part, its loss."""
    replica: int
    step: int
    participants: int
    participating: bool
    loss: float
    at: float          # when it was committed (time.time())


@dataclass(frozen=True)
class ReplicaResult:
    """A replica's own end of the run: the updates it lived, the (address, port) pairs its
    process listened on, its store's port, and its final weights."""
    lived: list
    listening: list
    store_port: int
    state: dict


def _wait_until(ready, timeout: float) -> bool:
    """Poll ``ready()`` every 10 ms for up to ``timeout`` seconds: whether it came true."""
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _all_ready(folder: str, replica: int, replicas: int, timeout: float) -> None:
    """Start together: every replica's manager is heartbeating before the first quorum
    (the Lighthouse would otherwise start with the first two and let the third heal in)."""
    Path(folder, f"ready{replica}").touch()
    _wait_until(lambda: len(list(Path(folder).glob("ready*"))) >= replicas, timeout)


def finished(lived: list[Step], replicas: int, steps: int) -> bool:
    """The rule every replica applies after each update: stop once the last two updates it
    lived are consecutive updates of the full quorum, the second one ``steps`` or later.
    Every member of a full quorum lives its update, so the replicas stop together; it
    counts only after the loss because ``run`` kills a replica before update ``steps`` and
    restarts it only once the survivors have gone on without it."""
    if len(lived) < 2:
        return False
    before, last = lived[-2:]
    return (last.step >= steps and last.step == before.step + 1
            and before.participants == last.participants == replicas)


def _stopped_peers(folder: str, replica: int) -> dict[int, int]:
    """{peer: the update it stopped at} for the peers that have stopped (each touches
    ``stopped<replica>-at<update>``: a name is created at once, never half-written)."""
    found = (p.name.removeprefix("stopped").split("-at") for p in Path(folder).glob("stopped*"))
    return {int(r): int(at) for r, at in found if int(r) != replica}


def rank_replica(replica: int, lighthouse: str, steps: int, replicas: int,
                 kill_at: int | None, restarted: bool, folder: str) -> dict:
    """One replica group of one rank: train until ``finished`` (update ``steps`` and two
    full quorums after the loss); ``kill_at``: SIGKILL itself once that update is committed.
    A restarted replica waits until the survivors have gone on without it, and starts from
    other weights (seed 1): only a live recovery can make it right."""
    from torchft.ddp import DistributedDataParallel
    from torchft.optim import OptimizerWrapper

    wait = torchft_setup.TIMEOUT.total_seconds()
    lost = Path(folder, "lost")              # touched once an update is committed without all
    if restarted and not _wait_until(lost.exists, wait):
        raise RuntimeError(f"replica {replica} was restarted, but for {wait:.0f} s no survivor "
                           f"committed an update without it")
    model, optimizer = model_and_optimizer(seed=int(restarted))
    manager, store = torchft_setup.replica_manager(
        replica, lighthouse,
        load_state_dict=lambda s: (model.load_state_dict(s["model"]),
                                   optimizer.load_state_dict(s["optim"])),
        state_dict=lambda: {"model": model.state_dict(), "optim": optimizer.state_dict()})
    ddp, opt = DistributedDataParallel(manager, model), OptimizerWrapper(manager, optimizer)
    if not restarted:
        _all_ready(folder, replica, replicas, wait)
    lived, listening, done = [], torchft_setup.listening(), 0
    try:
        while True:
            if stopped := _stopped_peers(folder, replica):   # never go on without them
                raise RuntimeError(f"replica {replica} is at update {done} and has not met the "
                                   f"rule to stop, but its peers stopped (replica: update) "
                                   f"{stopped}")
            opt.zero_grad()                       # this step's quorum; a replica behind heals
            x, y = batch(replica, manager.current_step())
            loss = lm_loss(ddp(x), y)
            loss.backward()                       # gradients averaged over the quorum
            opt.step()                            # committed only if every member succeeded
            if manager.current_step() > done:     # update number current_step() was applied
                done = manager.current_step()
                lived.append(Step(replica, done, manager.num_participants(),
                                  manager.is_participating(), loss.item(), time.time()))
            if lived and lived[-1].participants < replicas:
                lost.touch()
            if finished(lived, replicas, steps):
                Path(folder, f"stopped{replica}-at{done}").touch()
                break
            if kill_at is not None and done >= kill_at:
                os.kill(os.getpid(), signal.SIGKILL)   # the lost replica: no goodbye
            time.sleep(0.05)      # one step's work, so a restarted replica finds the run going
    finally:
        manager.shutdown(wait=False)
    return ReplicaResult(lived, sorted(set(listening + torchft_setup.listening())), store.port,
                         {k: v.clone() for k, v in model.state_dict().items()})


@dataclass(frozen=True)
class ReplicaRun:
    """What ``run`` saw: each replica's final result (the killed one's second life), the
    updates each lived, how each replica's first life ended, and what listened where."""
    results: dict
    lighthouse: tuple[str, int]
    killed: int
    first_life: dict


def _life(replica, lighthouse, steps, replicas, kill, kill_at, folder, out, ends, timeout):
    """A replica's launch; the one killed is launched again at once, as a restarted node."""
    try:
        out[replica] = launch(rank_replica, 1, replica, lighthouse, steps, replicas,
                              kill_at if replica == kill else None, False, folder,
                              timeout=timeout)[0]
        ends[replica] = "finished"
        return
    except Exception as exc:            # noqa: BLE001 (said below, and raised by ``run``)
        ends[replica] = str(exc)
        if replica != kill:
            return
    try:
        out[replica] = launch(rank_replica, 1, replica, lighthouse, steps, replicas, None, True,
                              folder, timeout=timeout)[0]
    except Exception as exc:            # noqa: BLE001
        ends[replica] += f"\nrestarted, then: {exc}"


def run(replicas: int = 3, steps: int = 6, kill: int = 2, kill_at: int = 2,
        timeout: float = 90.0) -> ReplicaRun:
    """Train ``replicas`` replica groups through one Lighthouse on 127.0.0.1; replica ``kill``
    dies after update ``kill_at`` and is restarted. Returns when all have finished."""
    if not 0 <= kill < replicas or replicas < 3 or not 0 < kill_at < steps:
        raise ValueError(f"replicas={replicas}, kill={kill}, kill_at={kill_at}, steps={steps}: "
                         f"need replicas >= 3 (two survive a loss), 0 <= kill < replicas and "
                         f"0 < kill_at < steps")
    out, ends = {}, {}
    with torchft_setup.lighthouse() as (address, port), \
            tempfile.TemporaryDirectory(prefix="lessonlib-replicas-") as folder:
        lives = [threading.Thread(target=_life, args=(r, address, steps, replicas, kill, kill_at,
                                                      folder, out, ends, timeout))
                 for r in range(replicas)]
        for t in lives:
            t.start()
        for t in lives:
            t.join()
    missing = [r for r in range(replicas) if r not in out]
    if missing:
        raise RuntimeError(f"replica(s) {missing} did not finish: {ends}")
    return ReplicaRun({r: out[r] for r in range(replicas)}, ("127.0.0.1", port), kill,
                      {r: ends[r] for r in range(replicas)})


def replay(run: ReplicaRun) -> dict:
    """One process that replays the run's membership: update k averages the gradients of
    the replicas that took part in it, each on its own batch of step k - 1. The killed
    replica's own record died with it: where the quorum counted one more participant than
    the records show, it was the killed replica."""
    lived = {(s.step, s.replica): s for r in run.results.values() for s in r.lived}
    last = max(step for step, _ in lived)
    model, optimizer = model_and_optimizer(seed=0)
    for k in range(1, last + 1):
        took_part = {r for (step, r), s in lived.items() if step == k and s.participating}
        count = max(s.participants for (step, _), s in lived.items() if step == k)
        if count > len(took_part):
            took_part.add(run.killed)
        optimizer.zero_grad()
        for r in sorted(took_part):
            x, y = batch(r, k - 1)
            (lm_loss(model(x), y) / len(took_part)).backward()
        optimizer.step()
    return {k: v.clone() for k, v in model.state_dict().items()}
