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
        comm.all_reduce(x, group=ctx.axis("tp").group)
        comm.barrier()
    return {"a2a": out.tolist(), "a2a_list": [t.item() for t in outs], "gathered": gathered,
            "everyone": everyone, "box": box, "x": x.tolist(), "events": book.events,
            "summary": book.summary(), "count": book.count(), "mode": book.mode}


def host_reads_in_an_expert_parallel_forward() -> dict:
    """Every call in one ExpertParallelMoE forward that makes the host wait for the device
    (a value or a size read back), counted with a torch function mode: GShard's routing,
    and DeepSeek-V3's (dropless, sigmoid, the bias, the node limit) as "dropless"."""
    import torch
    from torch.overrides import TorchFunctionMode

    from lessonlib.expert_parallel import expert_parallel
    from lessonlib.models.moe import MoELayer

    reads = {"tolist", "item", "nonzero", "bincount", "__bool__", "__int__", "__float__",
             "unique", "masked_select"}

    class Count(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = getattr(func, "__name__", "")
            if name in reads or (name == "repeat_interleave" and "output_size" not in kwargs):
                self.seen.append(name)
            return func(*args, **kwargs)

    torch.manual_seed(0)
    x, out = torch.randn(2, 6, 8), {}
    for name, routing in (("reads", {}), ("dropless", {
            "capacity_factor": None, "gate": "sigmoid", "balance": "bias", "max_nodes": 1,
            "experts_per_node": 2})):
        layer = expert_parallel(MoELayer(8, 4, top_k=2, **routing), None)
        with Count() as count:
            layer(x)
        out[name] = count.seen
    return out
