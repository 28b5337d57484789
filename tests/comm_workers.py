"""Rank functions for tests/test_comm_calls.py: every call comm wraps, recorded."""
import torch
import torch.distributed as dist

from lessonlib import comm
from lessonlib.grid import ParallelContext


def every_new_call() -> dict:
    """all_to_all_single, all_to_all, the object collectives and new_group, once each, on
    2 ranks; then an all-reduce on the world and on a group with the world's members."""
    rank, n = dist.get_rank(), dist.get_world_size()
    with comm.ledger() as book:
        out = torch.empty(2)
        comm.all_to_all_single(out, torch.tensor([10.0 * rank, 10.0 * rank + 1]))
        outs = [torch.empty(1) for _ in range(n)]
        comm.all_to_all(outs, [torch.tensor([float(rank * n + j)]) for j in range(n)])
        gathered = [None] * n if rank == 0 else None
        comm.gather_object({"rank": rank}, gathered, dst=0)
        everyone = [None] * n
        comm.all_gather_object(everyone, rank * rank)
        box = [f"from {rank}"]
        comm.broadcast_object_list(box, src=1)
        ctx = ParallelContext.build(1, 1, n)           # tp group: the world's members again
        x = torch.ones(3)
        comm.all_reduce(x)
        comm.all_reduce(x, group=ctx.tp_group)
        comm.barrier()
    return {"a2a": out.tolist(), "a2a_list": [t.item() for t in outs], "gathered": gathered,
            "everyone": everyone, "box": box, "x": x.tolist(), "events": book.events,
            "summary": book.summary(), "count": book.count(), "mode": book.mode}
