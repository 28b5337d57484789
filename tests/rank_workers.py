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


def skip_collective_on(bad_rank: int):
    if dist.get_rank() == bad_rank:
        progress("deliberately skipping the all-reduce")
        time.sleep(3600)
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
