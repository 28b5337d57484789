"""PyTorch's own tensor parallelism on the same weights: the reference ours is measured against.

What it teaches: Megatron's column/row split is what ``torch.distributed.tensor.parallel``
does with ``ColwiseParallel`` and ``RowwiseParallel`` on DTensors. Built on the same tensor-
parallel group as ours (the one ``ParallelContext`` made), so the two differ only in how
they split and communicate, never in which ranks talk.

With sequence parallelism PyTorch's plan is ``SequenceParallel`` on the LayerNorms (their
input and output sharded along the sequence, dim 1), ``PrepareModuleInput`` gathering the
sequence before attention and the MLP, and ``RowwiseParallel(output_layouts=Shard(1))``
reduce-scattering after them: the block takes and returns this rank's s/t rows, as ours.

Laptop:  ``python labs/tp.py --world-size 2``
GPU box: ``torchrun --nproc-per-node 8 labs/tp.py``
"""
from __future__ import annotations

import copy

import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                               RowwiseParallel, SequenceParallel,
                                               parallelize_module)

from lessonlib import device
from lessonlib.grid import ParallelContext

TORCH_PLANS = {
    "mlp": {"fc1": "colwise", "fc2": "rowwise"},
    "block": {"attn.q": "colwise", "attn.k": "colwise", "attn.v": "colwise",
              "attn.proj": "rowwise", "mlp.fc1": "colwise", "mlp.fc2": "rowwise"},
    "mlp_sp": {"fc1": "colwise_from_sequence", "fc2": "rowwise_to_sequence"},
    "block_sp": {"ln1": "sequence", "attn": "gather_sequence", "attn.q": "colwise",
                 "attn.k": "colwise", "attn.v": "colwise", "attn.proj": "rowwise_to_sequence",
                 "ln2": "sequence", "mlp": "gather_sequence", "mlp.fc1": "colwise",
                 "mlp.fc2": "rowwise_to_sequence"},
}
STYLES = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel,
          "sequence": lambda: SequenceParallel(sequence_dim=1),
          "gather_sequence": lambda: PrepareModuleInput(input_layouts=(Shard(1),),
                                                        desired_input_layouts=(Replicate(),)),
          "rowwise_to_sequence": lambda: RowwiseParallel(output_layouts=Shard(1)),
          "colwise_from_sequence": lambda: ColwiseParallel(input_layouts=Shard(1))}


def tp_mesh(ctx: ParallelContext) -> DeviceMesh:
    """A one-axis DeviceMesh over this rank's tensor-parallel group (``ctx.axis("tp").group``)."""
    return DeviceMesh.from_group(ctx.axis("tp").group, device.current_device().type,
                                 mesh_dim_names=("tp",))


def parallelize_with_dtensor(module: nn.Module, kind: str, mesh) -> nn.Module:
    """A copy of a dense MLP or Block split by DTensor's ``ColwiseParallel`` and
    ``RowwiseParallel`` (``torch.distributed.tensor.parallel``) on the same weights;
    ``"block_sp"`` adds ``SequenceParallel``: the copy takes and returns (b, s/t, h)."""
    if kind not in TORCH_PLANS:
        raise ValueError(f"kind={kind!r} must be one of {sorted(TORCH_PLANS)}")
    plan = {name: STYLES[style]() for name, style in TORCH_PLANS[kind].items()}
    return parallelize_module(copy.deepcopy(module), mesh, plan)
