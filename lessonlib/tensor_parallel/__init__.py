"""Tensor parallelism (Megatron-LM): split each layer's matrices over t ranks.

Read in this order, each file one idea:

* ``ops``: Megatron's f and g as autograd functions (f: identity forward, all-reduce
  backward; g: all-reduce forward, identity backward), plus gather/scatter on the last dim;
* ``layers``: ``ColumnParallelLinear`` (split the output features: no communication
  forward) and ``RowParallelLinear`` (split the input features: g sums the partial
  products), built from a dense layer's own weights; the tensor-parallel MLP and attention;
* ``sequence``: sequence parallelism (Korthikanti et al. 2022): LayerNorms on s/t rows with
  their gradients summed, the column layers' input gathered along the sequence (and only
  this rank's rows kept for backward), the embedding's output scattered, the head's gathered;
* ``parallelize``: ``parallelize_block`` / ``parallelize_gpt`` split a dense model's layers
  (LayerNorms, embeddings and the head replicated, or split along the sequence with
  ``sequence_parallel=True``; a vocabulary-parallel option); recomputation is the block's
  own ``recompute`` ("none", "selective", "full"), kept by the split copy; ``apply_tp`` is
  the same split as the hybrid builder's tensor room, one part of a stage at a time;
* ``dtensor_ref``: PyTorch's own ``ColwiseParallel`` / ``RowwiseParallel`` on the same
  weights, the reference ours is measured against;
* ``reports``: what the runs return, as records with named fields (``Parity``: a copy
  against the dense module; ``Traffic``: what a ledger saw; ``LabRun``: a lab record's rows);
* ``layer_runs``: what the notebook, the lab and the tests launch (parity with the dense model,
  messages counted, bad input refused);
* ``sequence_runs``: the same for sequence parallelism and recomputation, with the bytes
  each layer keeps for backward measured beside the exact formula;
* ``async_tp``: asynchronous TP (Wang et al. 2023; torchtitan's async TP): the sequence
  all-gather and reduce-scatter cut into the t ranks' pieces passed round a ring, each
  piece's transfer hidden behind a GEMM, forward and backward; ``enable_async_tp``;
* ``async_tp_runs``: overlap you can see: exposed communication (the ledger's) of plain SP
  against async TP and of FSDP without and with prefetch, their parity, their timelines.

    from lessonlib.tensor_parallel import ColumnParallelLinear, RowParallelLinear

Laptop:  ``python labs/tp.py --world-size 2``
GPU box: ``torchrun --nproc-per-node 8 labs/tp.py`` (NCCL, t up to the GPUs of one server)
"""
from lessonlib.tensor_parallel.layers import (ColumnParallelLinear, RowParallelLinear,
                                              TensorParallelMLP, TensorParallelSelfAttention,
                                              check_divisible, check_pair, tp_size)
from lessonlib.tensor_parallel.ops import (copy_to_tp, gather_last_dim, gather_sequence,
                                           reduce_from_tp, reduce_scatter_sequence,
                                           scatter_last_dim, scatter_sequence)
from lessonlib.tensor_parallel.parallelize import (VocabParallelEmbedding, apply_tp,
                                                   param_bytes, parallelize_block,
                                                   parallelize_gpt)
from lessonlib.tensor_parallel.sequence import (SequenceParallelLayerNorm,
                                                linear_on_gathered_sequence)

__all__ = ["copy_to_tp", "reduce_from_tp", "gather_last_dim", "scatter_last_dim",
           "gather_sequence", "reduce_scatter_sequence", "scatter_sequence",
           "SequenceParallelLayerNorm", "linear_on_gathered_sequence",
           "ColumnParallelLinear", "RowParallelLinear", "TensorParallelMLP",
           "TensorParallelSelfAttention", "tp_size", "check_divisible", "check_pair",
           "VocabParallelEmbedding", "apply_tp", "param_bytes", "parallelize_block",
           "parallelize_gpt"]
