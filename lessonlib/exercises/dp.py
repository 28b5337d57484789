"""Checkers for notebook 02's exercises: they run the student's code and say what is wrong.

* ``check_reduce_scatter(fn)``: the reduce-scatter half of the ring, run on 3 real ranks;
* ``check_accumulation(fn)``: gradient accumulation with ``no_sync``, run on 2 ranks against
  one process on the large batch, counting the all-reduces;
* ``check_ring_bytes(ring_fn, server_fn)``: the bytes on the wire, against the theory.

The multi-rank checkers send the student's function to the ranks by value (the launcher
pickles a notebook cell's function with ``cloudpickle``, with the globals it uses), so it
may use anything its cell can see that can travel to another process.

Laptop:  ``python -c "from lessonlib.exercises import dp; print(dp.check_reduce_scatter(dp.reference_reduce_scatter))"``
GPU box: the same (the checkers always use CPU ranks).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from lessonlib import comm, launcher
from lessonlib.data_parallel.collectives import exchange
from lessonlib.costmodel.comm import parameter_server_bytes, ring_allreduce_bytes_per_rank


class Feedback(str):
    """A checker's verdict: plain text in a notebook, and ``ok`` for tests."""

    @property
    def ok(self) -> bool:
        return self.startswith("Correct")

    def _repr_pretty_(self, printer, cycle):
        printer.text(str(self))


def _say(text: str) -> Feedback:
    return Feedback(text)


def _still_a_stub(exc: launcher.RankError) -> bool:
    """The rank failed because the student's function still raises NotImplementedError."""
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return bool(lines) and lines[-1].strip().startswith("NotImplementedError")


def _run(worker, n, fn):
    """Run a checker's rank function on ``fn``; returns (results, None) or (None, the
    problem in plain words)."""
    if not callable(fn):
        raise ValueError(f"pass your function itself (without calling it); got {fn!r}")
    name = getattr(fn, "__name__", "your function")
    try:
        return launcher.launch(worker, n, fn, backend="gloo", timeout=40), None
    except launcher.LaunchTimeout:
        return None, ("the ranks waited forever and were stopped after 40 s. Every send "
                      "needs a matching receive: if each rank sends to its right and "
                      "receives from its left at every step, nobody waits forever.")
    except launcher.RankError as exc:
        if _still_a_stub(exc):
            return None, (f"{name} still raises NotImplementedError: replace that line "
                          f"with your code, run the cell, then this one.")
        last = [line for line in str(exc).splitlines() if line.strip()][-1]
        return None, f"rank {exc.rank} raised an error: {last.strip()}"


# ---------------------------------------------------------------- exercise 1: reduce-scatter
def reference_reduce_scatter(chunks, rank, world_size, send_recv):
    """The answer (as ``lessonlib.data_parallel.ring.ring_reduce_scatter`` does it)."""
    for step in range(world_size - 1):
        send_i, recv_i = (rank - step) % world_size, (rank - step - 1) % world_size
        incoming = torch.empty_like(chunks[recv_i])
        send_recv(chunks[send_i], incoming)
        chunks[recv_i] += incoming


def _reduce_scatter_rank(fn):
    rank, n = dist.get_rank(), dist.get_world_size()
    # Chunk c of rank r holds 2**r * 10**c: any sum tells which ranks' chunks went into it.
    chunks = [torch.full((4,), float(2 ** rank * 10 ** c), dtype=torch.float64) for c in range(n)]
    right, left = (rank + 1) % n, (rank - 1) % n

    def send_recv(send_tensor, recv_tensor):
        exchange(send_tensor, right, recv_tensor, left)

    with comm.ledger() as book:
        fn(chunks, rank, n, send_recv)
    return {"chunks": [c[0].item() for c in chunks], "sends": book.count("send"),
            "bytes": book.total_bytes("send")}


def _describe(value: float, n: int) -> str:
    for c in range(n):
        ranks = value / 10 ** c
        if ranks == int(ranks) and 0 < ranks < 2 ** n:
            who = [r for r in range(n) if int(ranks) >> r & 1]
            return f"chunk {c} of rank(s) {', '.join(map(str, who))}"
    return "a mix that no single chunk adds up to (something was added twice?)"


def check_reduce_scatter(fn, world_size: int = 3) -> Feedback:
    """Run ``fn(chunks, rank, world_size, send_recv)`` on ``world_size`` ranks and explain."""
    results, problem = _run(_reduce_scatter_rank, world_size, fn)
    if problem:
        return _say(f"Not yet: {problem}")
    n, full = world_size, 2 ** world_size - 1
    wrong = []
    for rank, res in enumerate(results):
        owned = (rank + 1) % n
        got, want = res["chunks"][owned], full * 10 ** owned
        if got != want:
            wrong.append(f"rank {rank}: chunk {owned} should hold {want:g} (chunk {owned} "
                         f"summed over all {n} ranks) but holds {got:g} = {_describe(got, n)}")
    sends = [res["sends"] for res in results]
    if not wrong and sends == [n - 1] * n:
        return _say(f"Correct: on {n} ranks, rank r owns chunk (r + 1) mod {n} summed over "
                    f"every rank, after {n - 1} messages of S/{n} each.")
    if not wrong:
        return _say(f"The sums are right but the ranks sent {sends} messages; reduce-scatter "
                    f"needs only n - 1 = {n - 1} each.")
    hint = ("Hint: at step s rank r sends chunk (r - s) mod n to its right and adds what it "
            "receives into chunk (r - s - 1) mod n, in place (+=), for n - 1 steps.")
    if sends != [n - 1] * n:
        hint += f" (Your ranks sent {sends} messages; reduce-scatter takes n - 1 = {n - 1}.)"
    return _say("Not yet:\n  " + "\n  ".join(wrong) + "\n" + hint)


# ---------------------------------------------------------------- exercise 2: no_sync
MICRO, STEPS, WIDTH = 3, 3, 8


def reference_accumulation(ddp, optimizer, micro_batches, loss_fn):
    """The answer: sync only on the last micro-batch; each loss divided by their number."""
    for i, (x, y) in enumerate(micro_batches):
        if i < len(micro_batches) - 1:
            with ddp.no_sync():
                (loss_fn(ddp(x), y) / len(micro_batches)).backward()
        else:
            (loss_fn(ddp(x), y) / len(micro_batches)).backward()
    optimizer.step()
    optimizer.zero_grad()


def _mse(out, y):
    return ((out - y) ** 2).mean()


def _accumulation_model(seed):
    from lessonlib.models import mlp_stack
    return mlp_stack(WIDTH, 3, seed).double()


def _large_batch_weights(scale: float) -> torch.Tensor:
    from lessonlib.data import regression_batch
    model = _accumulation_model(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        x, y = regression_batch(4 * MICRO * 2, WIDTH, step)
        (scale * _mse(model(x.double()), y.double())).backward()
        opt.step()
        opt.zero_grad()
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach()


def _accumulation_rank(fn):
    from lessonlib.data import regression_batch, shard
    from lessonlib.data_parallel import DataParallel
    rank, n = dist.get_rank(), dist.get_world_size()
    model = _accumulation_model(rank)
    ddp = DataParallel(model, bucket_cap_mb=0.0006)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    counts = []
    for step in range(STEPS):
        x, y = (shard(t.double(), rank, n) for t in regression_batch(4 * MICRO * n, WIDTH, step))
        with comm.ledger() as book:
            fn(ddp, opt, list(zip(x.chunk(MICRO), y.chunk(MICRO))), _mse)
        counts.append(book.count("all_reduce"))
    return {"weights": torch.nn.utils.parameters_to_vector(model.parameters()).detach(),
            "all_reduces": counts, "buckets": len(ddp.buckets)}


def check_accumulation(fn) -> Feedback:
    """Run ``fn(ddp, optimizer, micro_batches, loss_fn)`` for 3 steps on 2 ranks."""
    results, problem = _run(_accumulation_rank, 2, fn)
    if problem:
        return _say(f"Not yet: {problem}")
    buckets, counts = results[0]["buckets"], results[0]["all_reduces"]
    weights = results[0]["weights"]
    right = (weights - _large_batch_weights(1.0)).abs().max().item() < 1e-10
    unscaled = (weights - _large_batch_weights(float(MICRO))).abs().max().item() < 1e-10
    if counts == [0] * STEPS:
        return _say("Not yet: nothing was all-reduced, so each rank trained alone. The last "
                    "micro-batch's backward must run outside `no_sync()`.")
    if unscaled:
        return _say(f"Not yet: the gradients are {MICRO}x too large. Each micro-batch's loss "
                    f"is a mean over its own examples: divide it by the number of "
                    f"micro-batches ({MICRO}) before backward.")
    if not right:
        return _say("Not yet: after 3 steps the weights differ from one process on the large "
                    "batch. Check that you step the optimizer once per call and zero the "
                    "gradients after it.")
    if counts != [buckets] * STEPS:
        return _say(f"The numbers are right, but each step sent {counts[0]} all-reduces for "
                    f"{buckets} buckets: wrap every micro-batch but the last in `no_sync()` "
                    f"so the gradients travel once.")
    return _say(f"Correct: {MICRO} micro-batches on 2 ranks train exactly like one batch of "
                f"{MICRO * 2 * 4}, and each step sends {buckets} all-reduces (one per bucket), "
                f"not {MICRO * buckets}.")


# ---------------------------------------------------------------- exercise 3: bytes
def check_ring_bytes(ring_bytes_per_rank, server_link_bytes,
                     measured: dict | None = None) -> Feedback:
    """Compare the student's formulas with the theory (and with ledger counts, if given:
    ``measured`` = {"n": n, "size": S, "ring": bytes per rank, "server": server link bytes})."""
    problems = []
    for n in (2, 3, 4, 8):
        for size in (1200, 2 ** 20):
            for fn, want in ((ring_bytes_per_rank, ring_allreduce_bytes_per_rank(n, size)),
                             (server_link_bytes, parameter_server_bytes(n, size))):
                name = getattr(fn, "__name__", "your function")
                try:
                    got = fn(n, size)
                except NotImplementedError:
                    return _say(f"Not yet: {name} still raises NotImplementedError: replace "
                                f"that line with your formula, run the cell, then this one.")
                if not isinstance(got, (int, float)) or abs(got - want) > 1e-6 * want:
                    problems.append(f"{name}({n}, {size}) returned {got}, but the answer is "
                                    f"{want:,.0f}")
    if problems:
        hint = ("Hint: the ring sends n - 1 chunks of S/n in reduce-scatter and again in "
                "all-gather; the server receives a full S from each of the n - 1 workers and "
                "sends S back to each.")
        return _say("Not yet:\n  " + "\n  ".join(problems[:4]) + "\n" + hint)
    text = "Correct for n = 2, 3, 4, 8."
    if measured:
        n, size = measured["n"], measured["size"]
        text += (f" And the ledger agrees: at n = {n}, S = {size:,} bytes each ring rank sent "
                 f"{measured['ring']:,} bytes (you predict {ring_bytes_per_rank(n, size):,.0f}) "
                 f"and the server's link carried {measured['server']:,} (you predict "
                 f"{server_link_bytes(n, size):,.0f}).")
    return _say(text)
