"""Rank functions the launcher tests spawn (they must live in an importable module)."""
import os
import time

import torch
import torch.distributed as dist

from lessonlib import comm, progress


def rank_and_sum():
    x = torch.tensor([float(dist.get_rank() + 1)])
    comm.all_reduce(x)
    return {"rank": dist.get_rank(), "world": dist.get_world_size(), "sum": x.item(),
            "pid": os.getpid()}


def fail_on(bad_rank: int):
    progress("before the all-reduce")
    if dist.get_rank() == bad_rank:
        raise ValueError(f"boom on purpose in rank {bad_rank}")
    comm.all_reduce(torch.ones(3))
    return dist.get_rank()


def skip_collective_on(bad_rank: int, direct_rank: int | None = None):
    """Rank ``bad_rank`` never joins the all-reduce; ``direct_rank`` calls torch.distributed
    itself (no ``comm``, so no breadcrumb says where it waits)."""
    if dist.get_rank() == bad_rank:
        progress("deliberately skipping the all-reduce")
        time.sleep(3600)
    if dist.get_rank() == direct_rank:
        dist.all_reduce(torch.ones(3))
    else:
        comm.all_reduce(torch.ones(3))
    return dist.get_rank()


def state_dict_and_tensor():
    layer = torch.nn.Linear(3, 2)
    with torch.no_grad():
        layer.weight.fill_(dist.get_rank())
    return {"state": layer.state_dict(), "t": torch.arange(4) * dist.get_rank()}


def sleep_forever():
    progress("sleeping")
    time.sleep(3600)


def every_comm_op():
    """Each ledger-wrapped call once, on 2 ranks; returns the ledger summary and values."""
    rank, peer = dist.get_rank(), 1 - dist.get_rank()
    x = torch.full((4,), float(rank + 1))
    with comm.ledger() as book:
        comm.all_reduce(x)                                        # 16 bytes
        comm.broadcast(x, src=0)
        gathered = torch.empty(8)
        comm.all_gather_into_tensor(gathered, x)
        scattered = torch.empty(2)
        comm.reduce_scatter_tensor(scattered, torch.ones(4))
        if rank == 0:
            comm.send(torch.ones(3), dst=peer)
            work = comm.irecv(torch.empty(5), src=peer)
        else:
            comm.recv(torch.empty(3), src=peer)
            work = comm.isend(torch.ones(5), dst=peer)
        work.wait()
        comm.barrier()
    return {"summary": book.summary(), "x": x, "gathered": gathered, "scattered": scattered,
            "seconds_recorded": all(e.seconds >= 0 for e in book.events)}


def exit_midway(code: int):
    """Start, report, then leave without a traceback, as the OOM killer or a segfault would."""
    progress("about to leave")
    comm.all_reduce(torch.ones(1))
    if dist.get_rank() == 1:
        if code < 0:
            os.kill(os.getpid(), -code)
        os._exit(code)
    time.sleep(3600)


def listening_sockets(caller_pid: int):
    """Mid-launch (after an all-reduce, before a barrier): the listening addresses of this
    rank and of the caller."""
    import psutil  # a test extra, needed only here

    comm.all_reduce(torch.ones(1))
    found = {}
    for who, pid in (("rank", os.getpid()), ("caller", caller_pid)):
        found[who] = [c.laddr.ip for c in psutil.Process(pid).net_connections(kind="inet")
                      if c.status == psutil.CONN_LISTEN]
    comm.barrier()
    return found


def value_of_module(name: str):
    """What ``name.VALUE`` is in this rank (the module is imported here, by the rank)."""
    import importlib  # the module to read is named at run time

    return importlib.import_module(name).VALUE


def misuse_messages() -> dict:
    """Two misuses that used to surface raw torch/gloo errors, each caught on this rank."""
    import torch
    from torch import nn

    from lessonlib.data_parallel import DataParallel
    from lessonlib.tensor_parallel import RowParallelLinear

    out = {}
    layer = RowParallelLinear(8, 4, input_is_parallel=True)         # t = the world
    try:
        layer(torch.randn(2, 8))                                       # the full input, (b, in)
    except ValueError as exc:
        out["row_parallel"] = str(exc)

    class PeerGone:          # what a bucket's handle raises when a peer never joined it
        def wait(self):
            raise RuntimeError("[gloo] Connection closed by peer [127.0.0.1]:40000")

    ddp = DataParallel(nn.Linear(4, 2))
    bucket = ddp.buckets[0]
    bucket.handle = PeerGone()
    try:
        ddp._wait(0, bucket)
    except RuntimeError as exc:
        out["data_parallel"] = str(exc)
    return out

