"""The smallest correct DDP training script: the one to copy into your own project.

What it teaches: PyTorch's DistributedDataParallel needs four things right, and the common
snippet gets the device wrong: with the gloo backend (CPU ranks) there is no GPU, so the
model stays on the CPU and ``DistributedDataParallel`` gets ``device_ids=None``; with NCCL
each rank takes the GPU ``LOCAL_RANK`` names and passes ``device_ids=[local_rank]``. Then
a ``DistributedSampler`` gives each rank its shard of the data (``set_epoch`` reshuffles it
each epoch), and the process group is destroyed at the end. No lessonlib here on purpose.

Laptop:  torchrun --standalone --nproc-per-node 2 labs/minimal_ddp.py
GPU box: torchrun --standalone --nproc-per-node 8 labs/minimal_ddp.py   (one GPU per rank)
"""
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def join(local_rank: int) -> torch.device:
    """Join the process group and return this rank's device: NCCL and the GPU ``LOCAL_RANK``
    names where there are GPUs, gloo and the CPU where there are none."""
    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        dist.init_process_group(backend="nccl")
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    dist.init_process_group(backend="gloo")
    return torch.device("cpu")


def replicas_identical(model: nn.Module) -> bool:
    """Whether every rank holds the same weights (all-gathered, compared here)."""
    weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    everyone = [torch.empty_like(weights) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, weights)
    return all(torch.equal(w, weights) for w in everyone)


def main(epochs: int = 3) -> None:
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = join(local_rank)
    rank = dist.get_rank()

    torch.manual_seed(0)                      # the same data on every rank
    x = torch.randn(256, 16)
    data = TensorDataset(x, x.sin().sum(dim=1, keepdim=True))
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=16, sampler=sampler)

    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 1)).to(device)
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if device.type == "cuda"
                                  else None)     # gloo's CPU ranks have no device ids
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)              # a new shuffle each epoch, the same on every rank
        for inputs, targets in loader:
            inputs, targets = inputs.to(device), targets.to(device)
            loss = nn.functional.mse_loss(ddp(inputs), targets)
            opt.zero_grad()
            loss.backward()                   # DDP averages the gradients here
            opt.step()
        if rank == 0:
            print(f"epoch {epoch}: loss {loss.item():.4f} on rank 0's last batch")
    same = replicas_identical(model)
    if rank == 0:
        print(f"{dist.get_world_size()} ranks on {device.type}; replicas identical: {same}")
    del ddp, opt                              # DDP's reducer holds the group: free it first
    dist.destroy_process_group()


if __name__ == "__main__":
    if "TORCHELASTIC_RUN_ID" not in os.environ:   # started by python: no peer would ever come
        sys.exit("labs/minimal_ddp.py runs under torchrun: "
                 "torchrun --standalone --nproc-per-node 2 labs/minimal_ddp.py")
    main()
