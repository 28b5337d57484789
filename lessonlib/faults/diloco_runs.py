"""DiLoCo run for real: the course's against torchft's, and against DDP at equal tokens.

What it teaches: the same algorithm twice gives the same weights (the course's
``StreamingDiLoCo`` and torchft's ``DiLoCo``, float64, the same seeds and batches), and
what DiLoCo buys: the ledger counts the bytes each replica sends per token trained, 1/H of
data parallelism's, and the held-out loss after the same tokens shows what it costs.

Each replica is one rank (``launch``) training the tiny GPT of ``replicas`` on its own batches;
``rank_ddp`` averages gradients every step, ``rank_diloco`` runs ``StreamingDiLoCo``,
``rank_torchft_diloco`` runs ``torchft.local_sgd.DiLoCo`` under a Manager and a Lighthouse on
127.0.0.1 (``torchft_setup``).

Laptop:  ``python -c "from lessonlib.faults import diloco_runs as d; print(d.compare_bytes())"``
GPU box: the same (CPU ranks).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

import torch
import torch.distributed as dist

from lessonlib import comm
from lessonlib.faults import torchft_setup
from lessonlib.faults.diloco import StreamingDiLoCo, fragments, outer_optimizer
from lessonlib.faults.replicas import BATCH, CONFIG, batch, model_and_optimizer
from lessonlib.instruments.ledger import ledger
from lessonlib.launcher import launch
from lessonlib.models import lm_loss


@dataclass(frozen=True)
class Trained:
    """One replica's run: its final weights, its losses, the bytes it sent and the tokens
    it trained on."""
    state: dict
    losses: tuple[float, ...]
    bytes_sent: int
    tokens: int


def _average(tensors) -> None:
    """The all-reduce mean over the replicas, one call per tensor (counted by the ledger)."""
    for t in tensors:
        comm.all_reduce(t)
        t.div_(dist.get_world_size())


def _model():
    """The replicas' model and AdamW, computed on one thread: a launch of n ranks gives each
    cores/n threads, and the thread count changes the last bits of a matrix product."""
    torch.set_num_threads(1)
    return model_and_optimizer()


def _train(step_done, steps: int, model, optimizer) -> Trained:
    rank, losses = dist.get_rank(), []
    with ledger() as book:
        for step in range(steps):
            optimizer.zero_grad()
            x, y = batch(rank, step)
            loss = lm_loss(model(x), y)
            loss.backward()
            step_done(model)
            losses.append(loss.item())
    return Trained({k: v.clone() for k, v in model.state_dict().items()}, tuple(losses),
                   book.total_bytes(), steps * BATCH * CONFIG.seq)


def rank_ddp(steps: int) -> Trained:
    """Data parallelism: the gradients averaged every step, then AdamW."""
    model, optimizer = _model()

    def step_done(m):
        _average([p.grad for p in m.parameters()])
        optimizer.step()
    return _train(step_done, steps, model, optimizer)


def rank_diloco(steps: int, sync_every: int, count: int) -> Trained:
    """The course's Streaming DiLoCo (``count`` fragments; 1: DiLoCo)."""
    model, optimizer = _model()
    parts = fragments(model, count)
    diloco = StreamingDiLoCo(parts, [outer_optimizer(p) for p in parts], sync_every, _average)

    def step_done(m):
        optimizer.step()
        diloco.step()
    return _train(step_done, steps, model, optimizer)


def rank_torchft_diloco(replica: int, address: str, steps: int, sync_every: int,
                        count: int) -> Trained:
    """torchft's DiLoCo on the same model, batches and optimizers, one replica group."""
    from torchft.local_sgd import DiLoCo

    model, optimizer = _model()
    parts = fragments(model, count)
    manager, _store = torchft_setup.replica_manager(
        replica, address, load_state_dict=model.load_state_dict, state_dict=model.state_dict,
        init_sync=False)       # the same seed everywhere: nothing to copy at the first quorum
    losses = []
    try:
        with DiLoCo(manager, parts, optimizer, [outer_optimizer(p) for p in parts],
                    sync_every=sync_every):
            for step in range(steps):
                optimizer.zero_grad()
                x, y = batch(replica, step)
                loss = lm_loss(model(x), y)
                loss.backward()
                optimizer.step()                 # torchft's hook syncs after the step
                losses.append(loss.item())
    finally:
        manager.shutdown(wait=False)
    return Trained({k: v.clone() for k, v in model.state_dict().items()}, tuple(losses), 0,
                   steps * BATCH * CONFIG.seq)


def torchft_diloco(replicas: int = 2, steps: int = 8, sync_every: int = 4, count: int = 1,
                   timeout: float = 90.0) -> list[Trained]:
    """torchft's DiLoCo on ``replicas`` replica groups through one Lighthouse."""
    out, errors = {}, {}

    def life(r, address):
        try:
            out[r] = launch(rank_torchft_diloco, 1, r, address, steps, sync_every, count,
                            timeout=timeout)[0]
        except Exception as exc:        # noqa: BLE001 (raised below, with the replica)
            errors[r] = exc

    with torchft_setup.lighthouse(min_replicas=replicas) as (address, _port):
        lives = [threading.Thread(target=life, args=(r, address)) for r in range(replicas)]
        for t in lives:
            t.start()
        for t in lives:
            t.join()
    if errors:
        r, exc = next(iter(errors.items()))
        raise RuntimeError(f"torchft replica {r} failed: {exc}") from exc
    return [out[r] for r in range(replicas)]


def diloco(replicas: int = 2, steps: int = 8, sync_every: int = 4, count: int = 1) -> list[Trained]:
    """The course's Streaming DiLoCo on ``replicas`` ranks."""
    return launch(rank_diloco, replicas, steps, sync_every, count, backend="gloo")


def ddp(replicas: int = 2, steps: int = 8) -> list[Trained]:
    return launch(rank_ddp, replicas, steps, backend="gloo")


def held_out_loss(state: dict, batches: int = 4) -> float:
    """The loss of weights ``state`` on batches no replica trained on."""
    model, _ = model_and_optimizer()
    model.load_state_dict(state)
    with torch.no_grad():
        return sum(lm_loss(model(x), y).item() for x, y in
                   (batch(99, s) for s in range(batches))) / batches
