"""Checkers for lesson 01's exercises: each turns one of the notebook's rules around (the
notebook computes bytes from parameters and days from GPUs; the exercises ask the way back)
and, when the answer is off, says which common slip would produce it. Each returns a
``Verdict`` (``lessonlib.exercises.verdict``); ``None`` (the untouched stub) is "your turn".

    from lessonlib.exercises import scale
    scale.check_largest_model(4.5e9)           # parameters that fit one A100-80GB with Adam
    scale.check_min_gpus(39)                   # A100-80GB that hold GPT-3's model state
    scale.check_gpus_for_days(4961)            # A100 at 140 TFLOP/s for GPT-3 in 7 days
"""
from __future__ import annotations

import math

from lessonlib.costmodel import (GPUS, MODELS, SECONDS_PER_DAY, usable_memory_bytes,
                                 training_flops)
from lessonlib.exercises.verdict import Verdict, correct, not_yet, number, unanswered


def _close(value: float, expected, rel: float = 0.02) -> bool:
    return math.isclose(value, expected, rel_tol=rel)


def check_largest_model(answer_params, gpu: str = "A100-80GB") -> Verdict:
    """Exercise 1: the most parameters whose weights, gradients and Adam state (mixed
    precision, 16 bytes per parameter) fit in the usable share of one ``gpu``
    (``usable_memory_bytes``: its memory less the CUDA context and NCCL's buffers), before any
    activation."""
    if answer_params is None:
        return unanswered("my_params")
    value = number(answer_params)
    if value is None:
        return not_yet(f"give a number of parameters, e.g. 1e9; got {answer_params!r}.")
    memory = GPUS[gpu].memory_bytes
    usable = usable_memory_bytes(GPUS[gpu])
    expected = usable / 16
    if _close(value, expected):
        gpt3 = 16 * MODELS["gpt3-175B"].params()
        return correct(f"{usable / 1e9:.0f} GB usable / 16 bytes = {expected / 1e9:.1f} B "
                       f"parameters: GPT-2 XL's model state (1.6 B) fits one {gpu}, a 7.5 B "
                       f"model's already does not, and GPT-3's is {gpt3 / usable:.0f} times too "
                       f"big.")
    if _close(value, memory / 16):
        return not_yet(f"your value fills all {memory / 1e9:.0f} GB; the CUDA context and NCCL's "
                       f"buffers take {(memory - usable) / 1e9:.1f} GB of it (memory_reserves): "
                       f"divide the {usable / 1e9:.0f} GB usable.")
    slips = {2: "only the 16-bit weights", 4: "the 16-bit weights and gradients: Adam's fp32 "
             "master weights, momentum and variance add 12 more bytes",
             12: "only the optimizer state", 8: "fp32 weights and gradients, without Adam"}
    for per_param, slip in slips.items():
        for capacity in (usable, memory):
            if _close(value, capacity / per_param):
                return not_yet(f"your value is {capacity / 1e9:.0f} GB / {per_param} bytes: "
                               f"{slip}. Count all 16 bytes per parameter, in the "
                               f"{usable / 1e9:.0f} GB usable.")
    return not_yet(f"divide the GPU's {usable / 1e9:.0f} GB usable by the bytes one parameter "
                   f"needs in training; you gave {value / 1e9:.2f} B parameters.")


def check_min_gpus(answer, model: str = "gpt3-175B", gpu: str = "A100-80GB") -> Verdict:
    """Exercise 2: the fewest GPUs whose usable memory (``usable_memory_bytes``) can hold the
    model state alone."""
    if answer is None:
        return unanswered("my_gpus")
    need = 16 * MODELS[model].params()
    usable = usable_memory_bytes(GPUS[gpu])
    expected = math.ceil(need / usable)
    if answer == expected:
        return correct(f"{need / 1e12:.2f} TB / {usable / 1e9:.0f} GB usable rounds up to "
                       f"{expected} GPUs, before a single activation.")
    if answer == expected - 1:
        return not_yet("round up: a fraction of a GPU still needs a whole GPU.")
    if answer == math.ceil(need / GPUS[gpu].memory_bytes):
        return not_yet(f"that fills all {GPUS[gpu].memory_bytes / 1e9:.0f} GB of every GPU; the "
                       f"CUDA context and NCCL's buffers take part of it (memory_reserves).")
    return not_yet(f"divide the model state (16 bytes per parameter) by one GPU's usable memory "
                   f"and round up; you gave {answer}.")


def check_gpus_for_days(answer, days: float = 7, params: float = 175e9,
                        tokens: float = 300e9, tflops: float = 140) -> Verdict:
    """Exercise 3: Megatron-LM 2021 Eq. 4 (time = 8TP / nX) solved for n, the GPUs that
    train GPT-3 in ``days`` at ``tflops`` each."""
    if answer is None:
        return unanswered("my_n")
    seconds, rate = days * SECONDS_PER_DAY, tflops * 1e12
    exact = training_flops(params, tokens, recompute=True) / (rate * seconds)
    expected = math.ceil(exact)
    value = number(answer)
    if value is None:
        return not_yet(f"give a number of GPUs; got {answer!r}.")
    if value == expected:
        return correct(f"n = 8·T·P / (X·t) = 8 x {tokens:.3g} x {params:.3g} / ({tflops:g}e12 x "
                       f"{seconds:,.0f} s) = {exact:,.1f}, so {expected:,} GPUs: about 5x the "
                       f"1024 of Megatron-LM's 34 days, for a 5x shorter run. Eq. 4 assumes each "
                       f"GPU still sustains {tflops:g} TFLOP/s at 5x the scale: that communication "
                       f"keeps hiding behind compute, which the rest of the course measures.")
    if _close(value, exact, rel=0.001):
        return not_yet(f"{value:,.1f} is right before rounding; a fraction of a GPU still needs "
                       f"a whole one: round up.")
    if _close(value, exact * 6 / 8, rel=0.01):
        return not_yet("you used 6PD; Eq. 4 counts 8PD because the forward pass is recomputed "
                       "in the backward pass.")
    if _close(value, exact * SECONDS_PER_DAY, rel=0.01) or _close(value, exact / SECONDS_PER_DAY,
                                                                  rel=0.01):
        return not_yet("check the units: the time in Eq. 4 is in seconds; a day has 86,400 s.")
    return not_yet(f"solve time = 8·T·P / (n·X) for n, with the time in seconds; you gave "
                   f"{value:,.0f}.")
