"""The chunks each device of a pipeline holds: one stage, or v interleaved ones.

What it teaches: with v interleaved chunks per device (Megatron-LM 2021 §2.2.2) the model
is cut into p*v virtual stages (``lessonlib.layer_split``) and device d holds virtual
stages d, d+p, ..., d+(v-1)p: ``device_chunks`` (with ``placement="v"``, the V of the
zero-bubble schedule ZBV: d and 2p-1-d).

Laptop:  ``python -c "from lessonlib.models import mlp_stack; from lessonlib.pipeline.stages
import stage_modules; print(stage_modules(mlp_stack(8, 4), 2, v=2))"``
GPU box: the same; moving a chunk to its GPU is the caller's ``.to(device)``.
"""
from __future__ import annotations

from torch import nn

from lessonlib.layer_split import balanced_split, check_counts, layers_of, split_layers
from lessonlib.models import count_parameters
from lessonlib.pipeline.actions import virtual_stage


def device_chunks(stages: list[nn.Module], p: int, device_index: int,
                  placement: str = "loop") -> list[nn.Module]:
    """Chunks of device ``device_index`` when ``len(stages)`` = p*v virtual stages are
    spread over p devices: virtual stages d, d+p, ..., d+(v-1)p ("loop"), or d, 2p-1-d ("v")."""
    if len(stages) % p:
        raise ValueError(f"{len(stages)} virtual stages cannot be spread evenly over p={p} "
                         f"devices; cut the model into a multiple of p stages")
    return [stages[k] for k in _vstages(p, len(stages) // p, device_index, placement)]


def _vstages(p, v, device_index, placement):
    return [virtual_stage(device_index, c, p, placement) for c in range(v)]


def stage_modules(model, p: int, v: int = 1, device_index: int = 0, counts=None,
                  placement: str = "loop") -> list[nn.Module]:
    """The v chunks device ``device_index`` of a p-stage pipeline runs (v=1: its one stage)."""
    return device_chunks(split_layers(model, p * v, counts), p, device_index, placement)


def stage_parameters(model, p: int, v: int = 1, device_index: int = 0, counts=None,
                     placement: str = "loop") -> list:
    """The *original* model's parameters that ``stage_modules(model, p, v, device_index)``
    copies, in the same order: to compare a pipeline stage with one process."""
    layers = layers_of(model)
    if counts is None:
        counts = balanced_split([count_parameters(x) for x in layers], p * v)
    counts = check_counts(counts, len(layers), p * v)
    starts = [sum(counts[:k]) for k in range(p * v)]
    return [q for k in _vstages(p, v, device_index, placement)
            for layer in layers[starts[k]:starts[k] + counts[k]] for q in layer.parameters()]
