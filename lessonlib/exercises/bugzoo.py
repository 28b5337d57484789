"""Checkers for the bug zoo's exercises (deep dive 06).

Each checker runs the student's function (or the bug, for a prediction) and returns a
``Verdict`` that says what is right or wrong in plain words (``lessonlib.exercises.verdict``).

Laptop:  the notebook calls these; e.g. ``check_attention_left_dense(my_bytes_fn)``.
GPU box: the same (exercise 2 runs 2 ranks, on CPU or one GPU each).
"""
from __future__ import annotations

from lessonlib import bug_checks, bug_switches
from lessonlib.exercises.verdict import Verdict, unanswered, unwritten
from lessonlib.launcher import launch
from lessonlib.models import Block, GPTConfig


def _count(*modules) -> int:
    return sum(p.numel() for m in modules for p in m.parameters())


def attention_left_dense_bytes(h: int, t: int) -> int:
    """The answer, counted from a real layer: float32 bytes per rank when the MLP is split
    (fc1 by columns with its bias, fc2 by rows, fc2's bias replicated) and attention and the
    LayerNorms stay whole."""
    block = Block(GPTConfig(seq=4, hidden=h, heads=2))
    mlp = block.mlp
    split = _count(mlp.fc1) + mlp.fc2.weight.numel()
    whole = mlp.fc2.bias.numel() + _count(block.attn, block.ln1, block.ln2)
    return 4 * (split // t + whole)


def check_attention_left_dense(fn) -> Verdict:
    """``fn(h, t)`` -> weight bytes per rank of a layer whose attention was left unsharded."""
    if fn is None:
        return unanswered("your function")
    for h, t in ((16, 2), (64, 4), (32, 1), (128, 8)):
        try:
            got = fn(h, t)
        except NotImplementedError:
            return unwritten(fn.__name__)
        want = attention_left_dense_bytes(h, t)
        if got != want:
            hint = ("remember the 4 bytes of a float32" if got * 4 == want else
                    "attention (q, k, v and the output projection, with their 4 biases) stays "
                    "whole: 4h² + 4h on every rank; only the MLP's 8h² + 4h are split, its "
                    "second bias (h) and the two LayerNorms (4h) are replicated")
            return Verdict(False, f"{fn.__name__}({h}, {t}) = {got}, but a real layer holds "
                                  f"{want} bytes per rank: {hint}")
    return Verdict(True, f"{fn.__name__} gives the bytes a real layer holds, for h = 16 to 128 "
                         f"and t = 1 to 8: the unsplit attention is a third of the matrices, so "
                         f"memory per rank stops falling as 1/t")


def check_wrong_microbatch_prediction(prediction, micro: int = 3) -> Verdict:
    """Exercise 2: ``prediction`` is the number of all-reduces each of ``micro`` accumulated
    micro-batches sends with ``ddp_sync_on_wrong_microbatch`` on, e.g. ``[0, 0, 1]``. The
    checker runs the bug on 2 real ranks and compares."""
    if prediction is None:
        return unanswered("my_prediction")
    try:
        prediction = [int(k) for k in prediction]
    except (TypeError, ValueError):
        return Verdict(False, f"give one count per micro-batch, e.g. {[0] * (micro - 1) + [1]}; "
                              f"got {prediction!r}")
    with bug_switches.enabled("ddp_sync_on_wrong_microbatch"):
        ranks = launch(bug_checks.rank_ddp_accumulation, 2, micro=micro)
    sent = ranks[0].all_reduces_per_microbatch
    if prediction == sent:
        return Verdict(True, f"measured {sent}: the switched lines set the flag to sync inside "
                             f"no_sync and reset it to 'do not sync' on leaving, so every "
                             f"micro-batch but the last sends, and the last one, the one that "
                             f"should, sends nothing. The gradients that reach the optimizer "
                             f"miss the last micro-batch (error {ranks[0].grads:.2f}).")
    if prediction == [0] * (micro - 1) + [1]:
        return Verdict(False, f"{prediction} is what correct DDP sends (only the last "
                              f"micro-batch). With the bug on, reread the two switched lines in "
                              f"DataParallel.no_sync: which value does the flag get inside the "
                              f"block, and which on leaving it?")
    return Verdict(False, f"you predicted {prediction}; the ranks sent {sent} all-reduces per "
                          f"micro-batch. Reread the switched lines in DataParallel.no_sync.")
