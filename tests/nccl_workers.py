"""Rank functions that record the communication trace of every scheme, for the NCCL check
(tests/test_nccl_rules.py). Each returns {scheme: this rank's events}; the parent hands
one list per rank to ``nccl_rules.nccl_hazards``."""
import torch
import torch.distributed as dist
import torch.nn.functional as F

from lessonlib import comm, hybrid, model_parallel
from lessonlib.data_parallel import collectives, ring
from lessonlib.data_parallel import ladder_runs as dp_runs
from lessonlib.exercises.dp import reference_reduce_scatter
from lessonlib.models import mlp_stack
from lessonlib.pipeline import runner as pp_runner
from lessonlib.pipeline.executor import PipelineExecutor
from lessonlib.tensor_parallel import layer_runs as tp_runs


def _traced(fn, *args, **kwargs) -> list:
    with comm.ledger() as book:
        fn(*args, **kwargs)
    return book.events


def old_exchange(send_buf, dst, recv_buf, src, group=None):
    """The exchange as it was: irecv, then isend, two separate calls (fine on gloo)."""
    works = [comm.irecv(recv_buf, src=src, group=group), comm.isend(send_buf, dst=dst, group=group)]
    for work in works:
        work.wait()


def _exercise_ring(exchange):
    rank, n = dist.get_rank(), dist.get_world_size()
    chunks = [torch.full((4,), float(rank)) for _ in range(n)]
    reference_reduce_scatter(chunks, rank, n, lambda s, r: exchange(s, (rank + 1) % n, r,
                                                                     (rank - 1) % n))


def rings() -> dict:
    """The hand-written all-reduces and the exercise's reduce-scatter, as they are; and
    ("old ...") the naive ring and the exercise on the exchange as it was."""
    out = {"exercise": _traced(_exercise_ring, collectives.exchange),
           "old exercise": _traced(_exercise_ring, old_exchange)}
    saved, collectives.exchange = collectives.exchange, old_exchange
    try:
        out["old naive_ring"] = _traced(collectives.naive_ring_all_reduce, torch.ones(10))
    finally:
        collectives.exchange = saved
    for name, fn in ring.ALGORITHMS.items():
        out[name] = _traced(fn, torch.ones(1000))
    big = torch.ones(2 ** 17)                       # chunks big enough to travel in slices
    out["ring_sliced"] = _traced(ring.ring_all_reduce, big, check=False)
    return out


def _pipeline(schedule: str, m: int, v: int) -> list:
    p, stage = dist.get_world_size(), dist.get_rank()
    model = mlp_stack(8, 2 * p, seed=0)
    x, y = torch.randn(2 * m, 8), torch.randn(2 * m, 8)
    with comm.ledger() as book:
        _, runner = pp_runner.make_runner("lessonlib", schedule, model, p, m, v, stage,
                                        F.mse_loss, (2, 8))
        runner.step(x, y)
    return book.events


def pipelines() -> dict:
    """Every schedule family (GPipe, 1F1B, interleaved, ZB-H1, ZBV), executor included."""
    p = dist.get_world_size()
    cases = [("gpipe", 2 * p + 1, 1), ("1f1b", 1, 1), ("1f1b", 2 * p + 1, 1),
             ("interleaved", p, 2), ("interleaved", 2 * p, 2), ("zb-h1", p + 1, 1),
             ("zbv", 2 * p, 2)]
    return {f"{s} m={m}": _pipeline(s, m, v) for s, m, v in cases}


def others() -> dict:
    """DataParallel (every rung of the ladder), tensor parallelism, model parallelism."""
    n = dist.get_world_size()
    return {"data_parallel": _traced(dp_runs.ladder_messages),
            "tensor_parallel": _traced(tp_runs.layer_report, n, kinds=("mlp", "block", "gpt"),
                                       steps=1),
            "model_parallel": _traced(model_parallel.assembly_line, model="mlp", steps=1,
                                      warmup=0, batch=4)}


def hybrids(layouts) -> dict:
    return {f"hybrid dp={d} pp={p} tp={t}": _traced(hybrid.train_layout, dp=d, pp=p, tp=t,
                                                    steps=1, check=False, timeline=True)
            for d, p, t in layouts}


def where_pipeline_tensors_live(schedule: str = "1f1b", m: int = 2) -> dict:
    """Ask a pipeline run where its tensors are: every stage parameter after a step, and
    every batch and activation its chunks were given, against ``current_device()``."""
    from lessonlib.device import current_device

    p, stage = dist.get_world_size(), dist.get_rank()
    seen = []
    chunks, runner = pp_runner.make_runner("lessonlib", schedule, mlp_stack(8, 2 * p), p, m, 1,
                                         stage, F.mse_loss, (2, 8))
    for c in chunks:
        c.register_forward_pre_hook(lambda mod, args: seen.extend(str(a.device) for a in args))
    runner.step(torch.randn(2 * m, 8), torch.randn(2 * m, 8))
    return {"current": str(current_device()), "inputs": seen,
            "params": [str(q.device) for c in chunks for q in c.parameters()],
            "grads": [str(q.grad.device) for c in chunks for q in c.parameters()]}


def link_disagreement() -> str | None:
    """Stage 1 is built for float64 activations, stage 0 for float32: both must refuse."""
    from lessonlib.pipeline.schedules import make

    stage = dist.get_rank()
    chunk = mlp_stack(8, 2)[stage:stage + 1]
    try:
        PipelineExecutor(make("1f1b", 2, 2), stage, chunk, F.mse_loss, (2, 8),
                         dtype=torch.float64 if stage else torch.float32)
    except ValueError as exc:
        return str(exc)
    return None
