"""The bug zoo's switches: which real bugs are on, read where the code runs.

What it teaches: each bug of the zoo is one commented ``if bug_switches.active("<name>"):``
in the real code (the line that goes wrong is the lesson). This registry is on the ground floor so
that the core (data parallel, tensor parallel, the pipeline executor) can ask it without
importing the zoo's checks, which live on the top floor (``lessonlib.bug_checks``).

A bug is off unless the environment variable ``LESSONLIB_BUGS`` names it (comma-separated).
``active`` reads the variable when the code runs, so ranks started by ``lessonlib.launch``
(which copy the caller's environment) see the switch their caller set. ``BUGS`` says, per
bug, what it is, where its line lives, the symptom, the check and the test that catches it.

Laptop:  ``python -c "from lessonlib import bug_switches; print(list(bug_switches.BUGS))"``
GPU box: the same.
"""
from __future__ import annotations

import importlib
import inspect
import os
import textwrap
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ENV = "LESSONLIB_BUGS"


@dataclass(frozen=True)
class Bug:
    name: str
    what: str       # the bug, in the field's words
    where: str      # module.function holding its one-line switch
    symptom: str
    check: str      # the check that catches it
    test: str       # the pytest node that fails with the switch on (the bug zoo's tests
                    # run it with its module's fixtures: a small launch keeps them quick)


BUGS = {b.name: b for b in (
    Bug("tp_missing_backward_all_reduce",
        "Megatron's f operator (identity forward) skips its backward all-reduce: a missing "
        "g in backward, since the all-reduce the backward pass needs is g's conjugate, f's "
        "backward. Each rank keeps its own partial sum as the input gradient of the "
        "column-parallel layer.",
        "lessonlib.tensor_parallel.ops._CopyToTP.backward",
        "forward outputs still match the dense model (that is what makes it sneaky); the "
        "input gradient, and so every gradient upstream, is wrong",
        "input gradient of a tensor-parallel MLP vs the dense MLP",
        "tests/test_tensor_parallel.py::test_on_two_ranks_parity_with_the_dense_model[mlp]"),
    Bug("ddp_sync_on_wrong_microbatch",
        "Under gradient accumulation, no_sync is inverted: the gradient all-reduce fires "
        "on the micro-batches inside no_sync and not on the last one, after it.",
        "lessonlib.data_parallel.ddp.DataParallel.no_sync",
        "the last micro-batch's gradient is never averaged: replicas hold different "
        "gradients and drift apart; the ledger shows the all-reduce on the wrong micro-batch",
        "accumulated gradients vs one process on the whole batch, all-reduces per micro-batch",
        "tests/test_data_parallel.py::test_no_sync_accumulation_equals_one_large_batch[2]"),
    Bug("p2p_dropped_request",
        "A pipeline stage drops the request handle of a receive (irecv) instead of waiting "
        "on it, and reads the buffer at once. The switch parks the handle with the sends "
        "(waited at the end of the step); truly discarding it is worse on gloo: freeing an "
        "unfinished request cancels the receive and the peer's send then waits forever.",
        "lessonlib.pipeline.executor.PipelineExecutor._exchange",
        "activations and gradients read before the data lands: whatever the buffer held "
        "(huge values, NaN); no error, no hang",
        "pipeline gradients vs one process (a hang would end as a LaunchTimeout)",
        "tests/test_pipeline_parity.py::test_every_schedule_matches_one_process[2]"),
    Bug("pipeline_loss_unscaled",
        "The last pipeline stage backpropagates each micro-batch's loss without dividing "
        "it by the number of micro-batches m.",
        "lessonlib.pipeline.executor.PipelineExecutor._forward",
        "losses look right; gradients are m times the one-process gradients (with SGD, "
        "as if the learning rate were m times larger)",
        "pipeline gradients vs one process",
        "tests/test_pipeline_parity.py::test_every_schedule_matches_one_process[2]"),
    Bug("tp_layer_left_unsharded",
        "parallelize_block leaves the MLP dense: every rank holds and computes all of it.",
        "lessonlib.tensor_parallel.parallelize.parallelize_block",
        "outputs and gradients equal the dense model, so every parity test passes; each "
        "rank holds more weight bytes than 1/t of the matrices, and sends one all-reduce "
        "fewer per layer",
        "weight bytes per rank vs 1/t of the layer, all-reduces per forward",
        "tests/test_tensor_parallel.py::"
        "test_on_two_ranks_each_rank_holds_one_t_th_of_the_weight_matrices[block]"),
    Bug("ep_expert_grads_wrong_group",
        "Expert parallelism inside data parallelism averages the experts' gradients over all "
        "d ranks, as for the dense weights, instead of over the d/e ranks that hold a copy "
        "of the same experts: rank r's experts get the sum of every rank's different experts.",
        "lessonlib.data_parallel.ladder.sync_gradients",
        "outputs, drops and the router's gradient still match one process; every expert's "
        "gradient is mixed with other experts' (no error: the shapes agree)",
        "expert gradients vs the one-process MoE layer",
        "tests/test_expert_parallel.py::test_expert_parallel_equals_one_process[2]"),
    Bug("moe_bias_in_combine_weights",
        "DeepSeek-V3's balancing bias, meant only to choose each token's k experts, is left "
        "in the scores the combine weights are taken from: the weights are s_i + b_i instead "
        "of the affinities s_i.",
        "lessonlib.models.moe_routing.queue",
        "training runs and balances; the outputs move whenever the bias does, even by a "
        "constant shared by all experts, which changes no choice",
        "the layer with a bias shared by all experts vs without, and the token-by-token "
        "definition",
        "tests/test_moe.py::test_the_layer_equals_the_definition_token_by_token[sigmoid-bias]"),
    Bug("moe_bias_update_sign_flipped",
        "The auxiliary-loss-free update moves each expert's bias the wrong way: up for an "
        "expert above the mean load, down for one below.",
        "lessonlib.models.moe_routing.bias_update",
        "no error and no change in the first step; then the busiest expert gets busier and "
        "the load drifts away from even",
        "busiest / mean load over repeated bias updates on a skewed router",
        "tests/test_moe.py::test_the_bias_update_evens_a_skewed_load[sigmoid]"),
    Bug("ep_bias_load_not_all_reduced",
        "Under data parallelism each replica moves its balancing bias by the load of its own "
        "batch instead of the load of the whole batch, all-reduced over the data-parallel "
        "ranks.",
        "lessonlib.expert_parallel.groups.update_biases",
        "the first step matches one process; then the replicas' biases differ from one "
        "another, so the same token is routed differently on different ranks",
        "the bias after 3 steps vs the one-process layer trained on every rank's batch",
        "tests/test_expert_parallel.py::test_expert_parallel_equals_one_process[2]"),
    Bug("sp_layernorm_grad_not_summed",
        "Under sequence parallelism each rank's LayerNorm sees only its s/t rows, so its "
        "weight and bias gradients are partial sums; the switch drops the sum over the "
        "tensor-parallel group (Megatron's all-reduce of sequence-parallel parameters).",
        "lessonlib.tensor_parallel.sequence.SequenceParallelLayerNorm.forward",
        "outputs and input gradients still match the dense model; the LayerNorm weight and "
        "bias gradients differ from rank to rank, and the replicas drift apart",
        "LayerNorm gradients of a TP+SP block vs the dense block",
        "tests/test_tensor_parallel_sp.py::test_on_two_ranks_every_mode_equals_the_dense_layer"
        "[tp+sp]"),
    Bug("cp_allgather_grads_not_reduced",
        "All-gather context parallelism (Llama 3) skips the reduce-scatter of the gathered K "
        "and V's gradients: each rank keeps the gradient its own queries gave its own keys, "
        "not the sum over every rank whose queries used them.",
        "lessonlib.context_parallel.allgather.GatherKV.backward",
        "the output and dq still match one-process attention; dk and dv miss the other "
        "ranks' shares (c = 1 hides it: there are none)",
        "dk, dv of all-gather attention vs one-process attention",
        "tests/test_context_parallel_methods.py::"
        "test_on_two_ranks_each_method_is_one_process_attention[allgather]"),
    Bug("ulysses_head_groups_swapped",
        "Ulysses' second all-to-all (head shards back to sequence shards) puts the head "
        "groups back in the wrong order: head group j of rank j read as heads j, j+c, ... "
        "instead of j*heads/c .. (j+1)*heads/c - 1.",
        "lessonlib.context_parallel.ulysses.to_sequence",
        "the output's heads are permuted (no error: the shapes agree); at heads = c each "
        "group is one head and the order is right, so a test with heads = c sees nothing",
        "output of Ulysses attention vs one-process attention",
        "tests/test_context_parallel_methods.py::"
        "test_on_two_ranks_each_method_is_one_process_attention[ulysses]"),
    Bug("hang_skipped_collective",
        "A collective inside a rank-dependent branch: one rank goes past the gradient "
        "all-reduce that the others wait in.",
        "lessonlib.faults.hangs.rank_steps",
        "the job stops making progress; no error on any rank until the timeout",
        "the loop finishes, or the flight records lined up by group and sequence number name "
        "the stuck call: the missing rank's last number on the group is lower and it waits "
        "in nothing",
        "tests/test_faults_hangs.py::test_the_loop_finishes_with_records_that_agree[3]"),
    Bug("hang_reordered_collectives",
        "Two collectives posted in different orders on different ranks: one rank averages "
        "the gradient (its own group) before the loss (the world).",
        "lessonlib.faults.hangs.rank_steps",
        "the job stops making progress; each side waits in a different group for the other",
        "the loop finishes, or the flight records name the stuck call: the missing rank "
        "waits in a collective of another group that the waiting ranks have not posted",
        "tests/test_faults_hangs.py::test_the_loop_finishes_with_records_that_agree[3]"),
    Bug("hang_mismatched_size",
        "One rank posts the gradient all-reduce with a shorter tensor than the others.",
        "lessonlib.faults.hangs.rank_steps",
        "on gloo the short rank may finish the call while the others wait for bytes that "
        "never come (on NCCL it may read garbage instead)",
        "the loop finishes, or the flight records name the stuck call: every member posted "
        "it, with different shapes",
        "tests/test_faults_hangs.py::test_the_loop_finishes_with_records_that_agree[3]"),
)}


# ---------------------------------------------------------------- the switch
def known(names) -> list[str]:
    """``names`` as a list if every one is a bug of the zoo, else one ValueError naming them."""
    unknown = [n for n in names if n not in BUGS]
    if unknown:
        raise ValueError(f"unknown bug name(s) {unknown} (in {ENV} or an argument); the bug "
                         f"zoo has: {', '.join(BUGS)}")
    return list(names)


def switched_on() -> list[str]:
    """The bugs ``LESSONLIB_BUGS`` switches on now, in its order."""
    raw = os.environ.get(ENV, "")
    return known([n.strip() for n in raw.split(",") if n.strip()]) if raw else []


def active(name: str) -> bool:
    """Is bug ``name`` switched on? Read from the environment at each call; a dictionary
    lookup and one environment read when off."""
    if name not in BUGS:
        known([name])
    return bool(os.environ.get(ENV)) and name in switched_on()


def hook_line(name: str) -> tuple[str, str]:
    """(file:line, the code) of bug ``name``'s switch: its ``if`` and the lines under it,
    read from the source now, so it is never stale."""
    known([name])
    parts = BUGS[name].where.split(".")
    obj = importlib.import_module(parts[0])
    for i, attr in enumerate(parts[1:], 2):     # a submodule not imported yet: import it
        obj = getattr(obj, attr, None) or importlib.import_module(".".join(parts[:i]))
    obj = inspect.unwrap(obj)                   # no_sync is wrapped by @contextmanager
    lines, start = inspect.getsourcelines(obj)
    i = next(i for i, line in enumerate(lines) if f'bug_switches.active("{name}")' in line)
    indent = len(lines[i]) - len(lines[i].lstrip())
    block = [lines[i]]
    for line in lines[i + 1:]:
        if line.strip() and len(line) - len(line.lstrip()) <= indent and \
                not line.lstrip().startswith("else"):
            break
        block.append(line)
    path = Path(inspect.getsourcefile(obj)).relative_to(Path(__file__).parent.parent)
    return f"{path.as_posix()}:{start + i}", textwrap.dedent("".join(block)).rstrip()


@contextmanager
def switched(names: list[str]):
    """Exactly ``names`` on inside the block (the others off), as before after it."""
    before = os.environ.get(ENV)
    os.environ[ENV] = ",".join(names)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ENV)
        else:
            os.environ[ENV] = before


@contextmanager
def enabled(*names: str):
    """Switch bugs on in this process, and in the ranks it launches, inside the block."""
    known(names)
    with switched(list(dict.fromkeys(switched_on() + list(names)))):
        yield
