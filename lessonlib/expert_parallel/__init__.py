"""Expert parallelism (GShard, Switch Transformer): E experts split over e ranks, tokens
sent to their expert and back with two all-to-alls.

Read in this order, each file one idea:

* ``dispatch``: the all-to-all as a differentiable operator (its backward is the
  all-to-all with the splits swapped) and the exchange of the per-expert counts that
  gives each step's splits;
* ``layer``: ``expert_parallel(moe, group)``: the router replicated, E/e experts per rank
  (``expert_parallel_gpt`` does it to every MoE layer of the tiny MoE GPT);
  route -> dispatch -> local experts -> return -> combine, the one-process
  ``lessonlib.models.moe.MoELayer`` with the exchange in the middle;
* ``groups``: expert parallelism inside data parallelism (Megatron-Core, DeepSeek-V3):
  dense weights averaged over all d ranks, each expert's over the ranks holding a copy;
  the balancing bias moved by the load all-reduced over the d ranks (``update_biases``);
* ``layer_runs``: what the notebook, the lab and the tests launch (parity with one process in
  float64 for GShard's and DeepSeek-V3's routing options, the bytes the all-to-alls move
  against the routing counts).
* ``overlap``: DualPipe's F&B slot on one MoE block (DeepSeek-V3 §3.2.1): the forward of
  one micro-batch beside the backward of another, cut at the all-to-alls, each posted
  (``dispatch.post_all_to_all``) and waited for only after a piece of the other's compute;
  ``overlap_runs``: its parity with one process and the exposed communication it saves
  (``run_overlap()`` -> ``OverlapReport``).
* ``measure``: what the lesson measures: the load per expert and the dropped share with no
  balancing, the auxiliary loss or the bias, the node limit's traffic over pretend nodes,
  the layer's step and its all-to-alls' time, bare all-to-alls for the alpha-beta fit, and
  the bias's two properties the bug zoo checks (a bias shared by all experts moves no output;
  its update evens the load).

    from lessonlib.expert_parallel import expert_parallel, ExpertParallelContext

Laptop:  ``python labs/ep.py --world-size 4``
GPU box: ``torchrun --nproc-per-node 8 labs/ep.py`` (NCCL, e up to the GPUs of one server)
"""
from lessonlib.expert_parallel.dispatch import (Splits, all_to_all_rows, exchange_counts,
                                                post_all_to_all)
from lessonlib.expert_parallel.groups import (ExpertParallelContext, expert_parameters,
                                              update_biases)
from lessonlib.expert_parallel.layer import (ExpertParallelMoE, apply_ep, check_split,
                                             expert_parallel, expert_parallel_gpt,
                                             run_local_experts)

__all__ = ["Splits", "all_to_all_rows", "exchange_counts", "post_all_to_all",
           "ExpertParallelContext", "expert_parameters", "update_biases", "ExpertParallelMoE",
           "apply_ep", "check_split", "expert_parallel", "expert_parallel_gpt", "run_local_experts"]
