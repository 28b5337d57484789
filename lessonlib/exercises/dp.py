"""Checkers for notebook 02's exercises: they run the student's code and say what is wrong.

* ``check_reduce_scatter(fn)``: the reduce-scatter half of the ring, run on 3 real ranks;
* ``check_accumulation(fn)``: gradient accumulation with ``no_sync``, run on 2 ranks against
  one process on the large batch, counting the all-reduces;
* ``check_sharded_server(fn)``: the bytes through one server's link when k of the n ranks
  each serve 1/k of the parameters, against the theory and against the ledger of a real
  sharded parameter server on 4 ranks.

Each returns a ``Verdict`` (``lessonlib.exercises.verdict``): an untouched stub (``None``, or a
function that still raises ``NotImplementedError``) is "your turn", and nothing is launched
for ``None``. The multi-rank checkers send the student's function to the ranks by value (the
launcher pickles a notebook cell's function with ``cloudpickle``, with the globals it uses),
so it may use anything its cell can see that can travel to another process.

Laptop:  ``python -c "from lessonlib.exercises import dp; print(dp.check_reduce_scatter(dp.reference_reduce_scatter))"``
GPU box: the same (the checkers always use CPU ranks).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from lessonlib import comm, launcher
from lessonlib.data_parallel.collectives import exchange, parameter_server_all_reduce
from lessonlib.exercises.verdict import (Verdict, correct, not_yet, still_a_stub, unanswered,
                                         unwritten)


def _run(worker, n, fn):
    """Run a checker's rank function on ``fn``; returns (results, None) or (None, the
    verdict that explains why not)."""
    name = getattr(fn, "__name__", "your function")
    if not callable(fn):
        return None, not_yet(f"pass your function itself (without calling it); got {fn!r}")
    try:
        return launcher.launch(worker, n, fn, backend="gloo", timeout=40), None
    except launcher.LaunchTimeout:
        return None, not_yet("the ranks waited forever and were stopped after 40 s. Every "
                             "send needs a matching receive: if each rank sends to its right "
                             "and receives from its left at every step, nobody waits forever.")
    except launcher.RankError as exc:
        if still_a_stub(exc):
            return None, unwritten(name)
        last = [line for line in str(exc).splitlines() if line.strip()][-1]
        return None, not_yet(f"rank {exc.rank} raised an error: {last.strip()}")


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


def check_reduce_scatter(fn, world_size: int = 3) -> Verdict:
    """Run ``fn(chunks, rank, world_size, send_recv)`` on ``world_size`` ranks and explain."""
    if fn is None:
        return unanswered("ring_reduce_scatter")
    results, problem = _run(_reduce_scatter_rank, world_size, fn)
    if problem is not None:
        return problem
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
        return correct(f"on {n} ranks, rank r owns chunk (r + 1) mod {n} summed over "
                       f"every rank, after {n - 1} messages of S/{n} each.")
    if not wrong:
        return not_yet(f"The sums are right but the ranks sent {sends} messages; reduce-scatter "
                       f"needs only n - 1 = {n - 1} each.")
    hint = ("Hint: at step s rank r sends chunk (r - s) mod n to its right and adds what it "
            "receives into chunk (r - s - 1) mod n, in place (+=), for n - 1 steps.")
    if sends != [n - 1] * n:
        hint += f" (Your ranks sent {sends} messages; reduce-scatter takes n - 1 = {n - 1}.)"
    return not_yet("\n  " + "\n  ".join(wrong) + "\n" + hint)


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


def check_accumulation(fn) -> Verdict:
    """Run ``fn(ddp, optimizer, micro_batches, loss_fn)`` for 3 steps on 2 ranks."""
    if fn is None:
        return unanswered("accumulate_step")
    results, problem = _run(_accumulation_rank, 2, fn)
    if problem is not None:
        return problem
    buckets, counts = results[0]["buckets"], results[0]["all_reduces"]
    weights = results[0]["weights"]
    right = (weights - _large_batch_weights(1.0)).abs().max().item() < 1e-10
    unscaled = (weights - _large_batch_weights(float(MICRO))).abs().max().item() < 1e-10
    if counts == [0] * STEPS:
        return not_yet("nothing was all-reduced, so each rank trained alone. The last "
                       "micro-batch's backward must run outside `no_sync()`.")
    if unscaled:
        return not_yet(f"the gradients are {MICRO}x too large. Each micro-batch's loss "
                       f"is a mean over its own examples: divide it by the number of "
                       f"micro-batches ({MICRO}) before backward.")
    if not right:
        return not_yet("after 3 steps the weights differ from one process on the large "
                       "batch. Check that you step the optimizer once per call and zero the "
                       "gradients after it.")
    if counts != [buckets] * STEPS:
        return not_yet(f"The numbers are right, but each step sent {counts[0]} all-reduces for "
                       f"{buckets} buckets: wrap every micro-batch but the last in `no_sync()` "
                       f"so the gradients travel once.")
    return correct(f"{MICRO} micro-batches on 2 ranks train exactly like one batch of "
                   f"{MICRO * 2 * 4}, and each step sends {buckets} all-reduces (one per bucket), "
                   f"not {MICRO * buckets}.")


# ---------------------------------------------------------------- exercise 3: sharded server
def reference_sharded_server(n, k, size):
    """The answer: one server rank's link, one direction (what it sends)."""
    return (n - 1) * size / k + (k - 1) * size / k   # averages of its slice out + its others in


def _sharded_server_rank(ks, size):
    """Every rank sums a float32 tensor of ``size`` bytes with k server ranks, each the
    parameter server of one of k slices; returns the bytes this rank sent, per k."""
    sent = {}
    for k in ks:
        x = torch.ones(size // 4)
        with comm.ledger() as book:
            for server, piece in enumerate(x.chunk(k)):
                parameter_server_all_reduce(piece, server=server, check=False)
        sent[k] = book.total_bytes("send")
    return sent


def measure_sharded_server(n: int = 4, ks=(1, 2, 4), size: int = 4 * 1200) -> dict:
    """Bytes each of n real ranks sent, per number of servers k: {k: [rank 0's, rank 1's, ...]}."""
    ranks = launcher.launch(_sharded_server_rank, n, tuple(ks), size, backend="gloo", timeout=60)
    return {k: [r[k] for r in ranks] for k in ks}


def check_sharded_server(fn, measure: bool = True) -> Verdict:
    """``fn(n, k, size)``: the bytes one *server* rank sends per all-reduce when k of the n
    ranks each serve 1/k of the ``size`` bytes (every rank is also a worker). Compared with
    the theory and, if ``measure``, with the ledger of a real run on 4 ranks."""
    if fn is None:
        return unanswered("sharded_server_bytes")
    if not callable(fn):
        return not_yet(f"pass your function itself (without calling it); got {fn!r}")
    name = getattr(fn, "__name__", "your function")
    cases = [(n, k, size) for n in (2, 4, 8, 64) for k in (1, 2, n) if k <= n
             for size in (1200, 2 ** 20)]
    wrong = []
    for n, k, size in dict.fromkeys(cases):
        try:
            got = fn(n, k, size)
        except NotImplementedError:
            return unwritten(name)
        want = reference_sharded_server(n, k, size)
        if not isinstance(got, (int, float)) or abs(got - want) > 1e-6 * want:
            wrong.append((n, k, size, got, want))
    if wrong:
        slips = ((lambda n, k, s: (n - 1) * s / k,
                  "Your value counts only the slice it serves: as a worker it also sends its "
                  "k - 1 other slices to their servers."),
                 (lambda n, k, s: 2 * reference_sharded_server(n, k, s),
                  "Your value counts both directions: count what the server rank sends (it "
                  "receives as much again)."),
                 (lambda n, k, s: (n - 1) * s,
                  "Your value is the single server's (n - 1) x S: with k servers each one "
                  "averages only S/k."),
                 (lambda n, k, s: n * s / k + (k - 1) * s / k,
                  "Your value has n workers sending to it, but one of them is the server "
                  "itself."))
        why = next((text for slip, text in slips
                    if all(isinstance(g, (int, float)) and abs(g - slip(n_, k_, s_)) <= 1e-6 * g
                           for n_, k_, s_, g, _ in wrong)),
                   "Hint: draw n = 4, k = 2: whom does server rank 0 send to, and how much?")
        n, k, size, got, want = wrong[0]
        return not_yet(f"{name}({n}, {k}, {size}) returned {got}, but the answer is "
                       f"{want:,.0f} ({len(wrong)} of {len(dict.fromkeys(cases))} cases "
                       f"wrong). {why}")
    text = ("every n and k tried agrees with the theory. At k = 1 it is the single "
            "server's (n - 1) x S; at k = n every rank serves S/n and sends 2(n - 1)/n x S, "
            "exactly a ring rank's bytes: a reduce-scatter and an all-gather, sent directly "
            "instead of around a circle.")
    if measure:
        sent = measure_sharded_server()
        predicted = {k: fn(4, k, 4 * 1200) for k in sent}
        if any(sent[k][0] != predicted[k] for k in sent):
            return not_yet(f"your formula matches the theory, but not the ledger of the real "
                           f"run on 4 ranks (bytes sent per rank, by k: {sent}; rank 0 serves "
                           f"at every k): does your function depend on anything but its "
                           f"arguments?")
        text += " The ledger agrees, 4 real ranks, S = 4,800 bytes, server rank 0 sent " + \
                ", ".join(f"{sent[k][0]:,} at k = {k}" for k in sent) + "."
    return correct(text)
