"""Every launched entry point of the course, run on a rank whose "GPU" is the CPU stand-in
(``lessonlib.instruments.placement.stand_in``): tests/test_placement.py launches ``drive``."""
import torch.distributed as dist

from lessonlib import bug_checks, comm, grid, hybrid, model_parallel
from lessonlib.data_parallel import bench as dp_bench
from lessonlib.data_parallel import ladder_runs as dp_runs
from lessonlib.data_parallel import zero_runs
from lessonlib.launcher import rank as launcher_rank
from lessonlib.models import corpus_config
from lessonlib.pipeline import schedule_runs as pp_runs
from lessonlib.tensor_parallel import ops as tp_ops
from lessonlib.tensor_parallel import parallelize
from lessonlib.tensor_parallel import layer_runs as tp_runs

SMALL = corpus_config(seq=16, hidden=32, heads=2, layers=2)

# name -> (function, args, kwargs): what the notebooks, the runs modules and the bug zoo
# launch, at the smallest settings that still take every code path
ENTRY_POINTS = {
    "comm.demo_ledger": (comm.demo_ledger, (), {}),
    "launcher.demo_rank_sum": (launcher_rank.demo_rank_sum, (), {}),
    "grid.demo_grid": (grid.demo_grid, (1, 1, 2), {}),
    "tensor_parallel.ops.demo_f_and_g": (tp_ops.demo_f_and_g, (), {}),
    "tensor_parallel.parallelize.demo_mlp": (parallelize.demo_mlp, (), {}),
    "data_parallel.ladder_runs.demo": (dp_runs.demo, (), {}),
    "data_parallel.ladder_runs.train_replicas": (dp_runs.train_replicas, ("bucketed",),
                                          {"steps": 2, "global_batch": 4}),
    "data_parallel.ladder_runs.ladder_messages": (dp_runs.ladder_messages, (),
                                                  {"bucket_cap_mb": 0.01}),
    "data_parallel.ladder_runs.step_timeline": (dp_runs.step_timeline, (SMALL,), {"warmup": 0}),
    "data_parallel.ladder_runs.bucket_sweep": (dp_runs.bucket_sweep, ((0.01,), SMALL),
                                               {"steps": 1}),
    "data_parallel.bench.allreduce_bench": (dp_bench.allreduce_bench, ([64],),
                                            {"budget_s": 0.01, "min_iters": 1, "max_iters": 1}),
    "zero_runs.demo": (zero_runs.demo, (), {}),
    "zero_runs.train_cases": (zero_runs.train_cases, ([{"stage": s, "steps": 1} for s in
                                                       ("1", "2", "3")],), {}),
    "tensor_parallel.layer_runs.layer_report": (tp_runs.layer_report, (2,),
                                          {"b": 2, "s": 4, "h": 16, "heads": 2, "steps": 1}),
    "tensor_parallel.layer_runs.ops_report": (tp_runs.ops_report, (2,), {}),
    "tensor_parallel.layer_runs.gathered_mlp_report": (tp_runs.gathered_mlp_report, (2,), {}),
    "pipeline.schedule_runs.demo": (pp_runs.demo, (), {}),
    "pipeline.schedule_runs.rank_parity": (pp_runs.rank_parity, (pp_runs.parity_cases(2),),
                                           {"steps": 1}),
    "pipeline.schedule_runs.measure": (pp_runs.measure, (), {"ms": (2,), "width": 16,
                                                             "layers_per_stage": 1, "micro": 2,
                                                             "steps": 1, "warmup": 0}),
    "model_parallel.assembly_line": (model_parallel.assembly_line, (),
                                     {"model": "mlp", "steps": 1, "warmup": 0, "batch": 4}),
    "hybrid.train_layout": (hybrid.train_layout, (), {"pp": 2, "steps": 1, "warmup": 0,
                                                      "check": True, "timeline": True}),
    **{f"bug_checks.{fn.__name__}": (fn, (), {}) for fn in (
        bug_checks.rank_tp_gradient, bug_checks.rank_tp_sharding,
        bug_checks.rank_ddp_accumulation, bug_checks.rank_pipeline)},
}


def drive(names) -> list:
    """Run each entry point in turn; the first tensor left on the CPU raises
    ``placement.LeftOnCpu`` with its traceback, and the launch fails naming it."""
    for name in names:
        fn, args, kwargs = ENTRY_POINTS[name]
        fn(*args, **kwargs)
        dist.barrier()
    return list(names)


def left_behind() -> None:
    """A layer never moved to the rank's device, called on a batch that was."""
    import torch
    from torch import nn

    from lessonlib.device import current_device

    nn.Linear(3, 2)(torch.ones(4, 3, device=current_device()))


def through_the_detour() -> dict:
    """Point-to-point in the shared-GPU mode (``lessonlib.gloo_cuda``): a ring shift with
    ``batch_isend_irecv``, then ``isend``/``irecv`` and ``send``/``recv`` to the next rank,
    each received value read after its ``wait``."""
    import torch

    from lessonlib import device, gloo_cuda

    rank, n, dev = dist.get_rank(), dist.get_world_size(), device.current_device()
    right, left = (rank + 1) % n, (rank - 1) % n
    got = torch.zeros(3, device=dev)
    mine = torch.full((3,), float(rank), device=dev)
    for work in comm.batch_isend_irecv([comm.send_op(mine, right), comm.recv_op(got, left)]):
        work.wait()
    batched = got.tolist()
    leaf = torch.zeros(2, device=dev, requires_grad=True)     # as a pipeline stage receives
    if rank == 0:
        comm.isend(torch.ones(2, device=dev) * 7, 1).wait()
        comm.send(torch.ones(2, device=dev) * 9, 1)
    elif rank == 1:
        comm.irecv(leaf, 0).wait()
        comm.recv(got[:2], 0)
    return {"detour": bool(gloo_cuda._started), "batched": batched,
            "async": leaf.tolist(), "blocking": got[:2].tolist()}
