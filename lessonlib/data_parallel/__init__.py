"""Data parallelism: replicate the model, shard the batch, all-reduce the gradients.

Read in this order, each file one idea:

* ``collectives``: the plumbing every hand-written collective shares (which ranks, agreeing
  on sizes before any data moves, a send and a receive posted as one batch, NCCL-safe), and
  two all-reduces built from point-to-point messages: the parameter server (its link
  carries 2(n-1) x S) and the naive ring (every rank sends (n-1) x S);
* ``ring``: the bandwidth-optimal ring, reduce-scatter then all-gather (2(n-1)/n x S);
* ``ladder``: data parallelism written four times, each rung fixing what the last one wasted
  (all-reduce per gradient, one flat buffer, hooks that overlap backward); the flat rung is
  the one gradient average of every layout (``sync_gradients``, experts handed in);
* ``ddp``: ``DataParallel``, the top rung: gradient buckets launched during backward,
  ``no_sync`` for accumulation, and ``sharded_loader`` (PyTorch's DistributedSampler);
* ``recorder``: what the lesson measures of DDP's step, handed to it from outside:
  ``BucketRecorder`` stamps each bucket's launch and finish (``no_record``, the default,
  stamps nothing);
* ``ladder_runs``: what the notebook and the tests launch (training replicas, the ladder's
  messages, a step's timeline, the bucket sweep);
* ``bench``: the lab's measurements (all-reduce bandwidth, DDP step times), with the
  alpha-beta model of ``lessonlib.costmodel.alpha_beta``;
* ``sharded``: sharding the replica (ZeRO): where each rank's slice lies, what a rank holds
  by ZeRO's per-stage formula, what a ledger's collectives send over a ring;
* ``zero``: ``ShardedOptimizer``, ZeRO stage 1 (PyTorch's ZeroRedundancyOptimizer);
* ``fsdp``: ``FullyShardedDataParallel``, ZeRO stages 2 and 3 (FSDP2's ``fully_shard``):
  one unit's gather, compute, free and reduce-scatter, in one file; over ``fsdp_units``
  (the module cut into units at wrap time, and where each parameter lives);
* ``parallelize``: ``apply_dp``, the hybrid layouts' data room (plain, ZeRO-1 or FSDP on
  the d*c ranks holding the same weights) and their optimizer;
* ``zero_runs``: stages 0-3 and PyTorch's own trained on the ranks, for the tests; and
  ``zero_bench``: the same timed against ``fully_shard`` for ``labs/zero.py``.

    from lessonlib.data_parallel import ring_all_reduce, parameter_server_all_reduce, DataParallel
    from lessonlib.data_parallel import ShardedOptimizer, FullyShardedDataParallel

Laptop:  ``python labs/allreduce.py --world-size 4`` and ``python labs/ddp.py --world-size 2``
         ``python labs/zero.py --world-size 2`` (ZeRO stages 0-3 against fully_shard)
GPU box: ``torchrun --nproc-per-node 8 labs/ddp.py`` (NCCL)
"""
from lessonlib.data_parallel.collectives import (agree, exchange, group_ranks,
                                                 naive_ring_all_reduce,
                                                 parameter_server_all_reduce, torch_all_reduce)
from lessonlib.data_parallel.ddp import DataParallel, plan_buckets, sharded_loader
from lessonlib.data_parallel.fsdp import FullyShardedDataParallel
from lessonlib.data_parallel.ladder import (AsyncGradientHooks, allreduce_flat_gradients,
                                            allreduce_gradients, broadcast_parameters, replicate)
from lessonlib.data_parallel.ring import (ALGORITHMS, PIECE_MIN_BYTES, ring_all_gather,
                                          ring_all_reduce, ring_chunks, ring_reduce_scatter)
from lessonlib.data_parallel.zero import ShardedOptimizer

__all__ = ["agree", "exchange", "group_ranks", "naive_ring_all_reduce",
           "parameter_server_all_reduce", "torch_all_reduce", "ring_chunks",
           "ring_reduce_scatter", "ring_all_gather", "ring_all_reduce", "ALGORITHMS",
           "PIECE_MIN_BYTES", "broadcast_parameters", "replicate", "allreduce_gradients",
           "allreduce_flat_gradients", "AsyncGradientHooks", "DataParallel", "plan_buckets",
           "sharded_loader", "ShardedOptimizer", "FullyShardedDataParallel"]
