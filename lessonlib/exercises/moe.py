"""Checkers for the mixture-of-experts deep dive (notebook 13): the smallest expert-parallel
size that fits a 1 T MoE. Each returns a ``Verdict``; ``None`` is "your turn".

    from lessonlib.exercises import moe
    moe.check_smallest_e(8)
"""
from __future__ import annotations

from lessonlib.costmodel import CLUSTERS
from lessonlib.costmodel.memory import usable_memory_bytes
from lessonlib.costmodel.moe import MOE_MODELS, choose_e, ep_memory_per_gpu
from lessonlib.exercises.verdict import Verdict, correct, not_yet, number, unanswered


def check_smallest_e(answer, model: str = "moe-1T", n_gpus: int = 2048, p: int = 16,
                     cluster: str = "dgx-h100") -> Verdict:
    """Exercise 1: the smallest e that fits the model state in the usable share of a GPU
    (``usable_memory_bytes``: its memory less the named reserves), with p stages and ZeRO-1 over the
    d = n_gpus / p data-parallel GPUs."""
    if answer is None:
        return unanswered("my_e")
    value = number(answer)
    spec, servers = MOE_MODELS[model], CLUSTERS[cluster]
    d = n_gpus // p
    best = choose_e(spec, n_gpus, servers, p=p)
    if value is None or value != int(value) or spec.E % int(value) or d % int(value):
        return not_yet(f"e must divide both the {spec.E} experts and the d = {d} data-parallel "
                       f"GPUs; got {answer!r}.")
    e = int(value)
    gb = ep_memory_per_gpu(spec, e, p, d, zero1=True).total / 1e9
    usable = usable_memory_bytes(servers.gpu) / 1e9
    if e == best.e:
        return correct(f"e = {e}: {gb:.1f} GB per GPU of {usable:.0f} GB usable. Each GPU holds "
                       f"E/e = {spec.E // e} experts of every MoE layer in its stage; a smaller e "
                       f"would hold more and overflow, a larger one sends tokens further. The "
                       f"{usable - gb:.1f} GB left must hold the activations, which this count "
                       f"leaves out: if they need more, take the next e.")
    if gb > usable:
        return not_yet(f"at e = {e} a GPU holds {gb:.0f} GB of model state, over the {usable:.0f} "
                       f"GB usable: split the experts over more ranks.")
    return not_yet(f"e = {e} fits ({gb:.0f} GB), but a smaller e fits too: the smallest keeps "
                   f"each token's all-to-all among the fewest GPUs.")
