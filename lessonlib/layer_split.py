"""Cut a model into stages: contiguous runs of layers, balanced by parameters.

What it teaches: splitting a model across devices (lesson 03's assembly line, lesson 04's
pipelines) needs a model that is a *sequence* of layers, so that stage s can run layers
a..b-1 and hand one tensor to stage s+1. ``layers_of`` turns the course's models into that
sequence (``TinyGPT.parts()`` = embed, blocks, head; an ``mlp_stack`` = its Linear+GeLU
pairs). ``balanced_split`` picks the cut points that make the largest stage as small as
possible (by parameter count, a proxy for compute); a given ``counts`` (layers per stage)
overrides it. Stages are deep copies of the full model's layers, so any split is the same
model as one process, weight for weight. (With v interleaved chunks per device, which
chunks a device holds is ``lessonlib.pipeline.stages``.)

Laptop:  ``python -m lessonlib.layer_split`` prints how TinyGPT splits over 2 and 4 stages.
GPU box: the same; moving a stage to its GPU is the caller's ``.to(device)``.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

from torch import nn

from lessonlib.argcheck import positive_int
from lessonlib.models import TinyGPT, count_parameters


def layers_of(model) -> list[nn.Module]:
    """The model as an ordered list of layers a pipeline may cut between.

    TinyGPT -> ``model.parts()``; an ``nn.Sequential`` -> its children, with each module
    that has no parameters (a GeLU) kept with the layer before it; a list -> itself."""
    if isinstance(model, TinyGPT):
        return list(model.parts())
    if isinstance(model, nn.Sequential):
        layers: list[list[nn.Module]] = []
        for child in model:
            if layers and count_parameters(child) == 0:
                layers[-1].append(child)
            else:
                layers.append([child])
        return [group[0] if len(group) == 1 else nn.Sequential(*group) for group in layers]
    if isinstance(model, (list, tuple)) and all(isinstance(x, nn.Module) for x in model):
        return list(model)
    raise ValueError(f"cannot cut a {type(model).__name__} into layers: pass a TinyGPT, an "
                     f"nn.Sequential or a list of modules")


def balanced_split(sizes: list[int], n_stages: int) -> list[int]:
    """Layers per stage (contiguous, each >= 1) that minimise the largest stage's size.

    The classic linear-partition dynamic programme; ties go to the split that puts fewer
    layers in the first stages (which hold the most activations under 1F1B)."""
    n = len(sizes)
    positive_int("n_stages", n_stages, what="the number of stages")
    if n_stages > n:
        raise ValueError(f"cannot cut {n} layers into {n_stages} stages: each stage needs at "
                         f"least one layer; use at most {n} stages or a deeper model")
    prefix = [0]
    for size in sizes:
        prefix.append(prefix[-1] + size)
    inf = float("inf")
    # best[k][j]: smallest possible largest stage when the first j layers make k stages
    best = [[inf] * (n + 1) for _ in range(n_stages + 1)]
    cut = [[0] * (n + 1) for _ in range(n_stages + 1)]
    best[0][0] = 0
    for k in range(1, n_stages + 1):
        for j in range(k, n + 1):
            for i in range(k - 1, j):
                cost = max(best[k - 1][i], prefix[j] - prefix[i])
                if cost <= best[k][j]:
                    best[k][j], cut[k][j] = cost, i
    counts, j = [], n
    for k in range(n_stages, 0, -1):
        counts.append(j - cut[k][j])
        j = cut[k][j]
    return counts[::-1]


def check_counts(counts, n_layers: int, n_stages: int) -> list[int]:
    counts = list(counts)
    if (len(counts) != n_stages or any(not isinstance(c, int) or c < 1 for c in counts)
            or sum(counts) != n_layers):
        raise ValueError(f"counts={counts} must give {n_stages} stages of at least one layer "
                         f"each, adding up to the model's {n_layers} layers")
    return counts


def split_layers(model, n_stages: int, counts=None) -> list[nn.Sequential]:
    """``n_stages`` stages, each an ``nn.Sequential`` of deep-copied consecutive layers.

    Balanced by parameter count unless ``counts`` (layers per stage) is given.
    ``nn.Sequential(*stages)`` computes exactly what ``model`` computes."""
    layers = layers_of(model)
    if counts is None:
        counts = balanced_split([count_parameters(x) for x in layers], n_stages)
    counts = check_counts(counts, len(layers), n_stages)
    stages, start = [], 0
    for c in counts:
        stages.append(nn.Sequential(*(copy.deepcopy(x) for x in layers[start:start + c])))
        start += c
    return stages


@dataclass(frozen=True)
class StagePlan:
    """One stage of a split: its index, its layers (indices into ``layers_of``), parameters."""
    stage: int
    layers: list
    params: int


def split_summary(model, n_stages: int, counts=None) -> list[StagePlan]:
    """Per stage: which layers and how many parameters."""
    layers = layers_of(model)
    if counts is None:
        counts = balanced_split([count_parameters(x) for x in layers], n_stages)
    counts = check_counts(counts, len(layers), n_stages)
    out, start = [], 0
    for s, c in enumerate(counts):
        params = sum(count_parameters(x) for x in layers[start:start + c])
        out.append(StagePlan(s, list(range(start, start + c)), params))
        start += c
    return out


if __name__ == "__main__":
    from lessonlib.models import GPTConfig

    gpt = TinyGPT(GPTConfig(layers=4))
    for p in (2, 4):
        print(f"p={p}:", split_summary(gpt, p))
