"""Checkers for lesson 01's exercises: each compares the student's number with the cost model
and, when it is off, says which common slip would produce the student's value. Each returns a
``Verdict`` (``lessonlib.exercises.verdict``); ``None`` (the untouched stub) is "your turn".

    from lessonlib.exercises import scale
    scale.check_model_state(my_bytes)          # GPT-2 XL, mixed-precision Adam
"""
from __future__ import annotations

import math

from lessonlib.costmodel import GPUS, MODELS, SECONDS_PER_DAY, megatron_training_time_s
from lessonlib.exercises.verdict import Verdict, unanswered


def _close(answer, expected, rel: float = 0.02) -> bool:
    try:
        return math.isclose(float(answer), expected, rel_tol=rel)
    except (TypeError, ValueError):
        return False


def _report(ok: bool, message: str) -> Verdict:
    return Verdict(ok, message)


def check_model_state(answer_bytes, model: str = "gpt2-xl") -> Verdict:
    """Exercise 1: bytes of weights + gradients + Adam state for ``model`` in mixed precision."""
    if answer_bytes is None:
        return unanswered("my_bytes")
    params = MODELS[model].params()
    expected = 16 * params
    if _close(answer_bytes, expected):
        return _report(True, f"{params / 1e9:.2f} B parameters x 16 bytes = {expected / 1e9:.1f} GB.")
    slips = {4: "only the 16-bit weights and gradients (2 + 2 bytes): Adam's fp32 master "
                "weights, momentum and variance add 12 more",
             2: "only the 16-bit weights", 12: "only the optimizer state",
             8: "fp32 weights and gradients, without Adam's two moments"}
    for per_param, slip in slips.items():
        if _close(answer_bytes, per_param * params):
            return _report(False, f"Your value is {per_param} bytes per parameter: {slip}.")
    return _report(False, f"Expected about {expected / 1e9:.1f} GB "
                          f"({params / 1e9:.2f} B parameters); you gave "
                          f"{float(answer_bytes) / 1e9:.1f} GB. Count bytes per parameter first.")


def check_min_gpus(answer, model: str = "gpt3-175B", gpu: str = "A100-80GB") -> Verdict:
    """Exercise 2: the fewest GPUs whose memory can hold the model state alone."""
    if answer is None:
        return unanswered("my_gpus")
    need = 16 * MODELS[model].params()
    expected = math.ceil(need / GPUS[gpu].memory_bytes)
    if answer == expected:
        return _report(True, f"{need / 1e12:.2f} TB / {GPUS[gpu].memory_bytes / 1e9:.0f} GB "
                             f"rounds up to {expected} GPUs, before a single activation.")
    if answer == expected - 1:
        return _report(False, "Round up: a fraction of a GPU still needs a whole GPU.")
    return _report(False, f"Divide the model state (16 bytes per parameter) by one GPU's memory "
                          f"and round up; you gave {answer}.")


def check_training_days(answer_days, params: float = 175e9, tokens: float = 300e9,
                        n_gpus: int = 1024, tflops: float = 140) -> Verdict:
    """Exercise 3: Megatron-LM 2021 Eq. 4 (8TP / nX) in days."""
    if answer_days is None:
        return unanswered("my_days")
    expected = megatron_training_time_s(params, tokens, n_gpus, tflops * 1e12) / SECONDS_PER_DAY
    if _close(answer_days, expected, rel=0.03):
        return _report(True, f"8 x {tokens:.3g} x {params:.3g} / ({n_gpus} x {tflops:g}e12) s "
                             f"= {expected:.1f} days.")
    if _close(answer_days, expected * 6 / 8, rel=0.03):
        return _report(False, "You used 6PD; Eq. 4 counts 8PD because activations are "
                              "recomputed in the backward pass.")
    return _report(False, f"Expected about {expected:.0f} days; you gave {answer_days}. "
                          f"Seconds = 8*T*P/(n*X); a day has 86,400 s.")
