"""Context parallelism: split the sequence itself over c ranks (ring, all-gather, Ulysses).

Read in this order, each file one idea:

* ``layout``: how s tokens are split over c ranks, contiguous or zig-zag (rank i holds
  chunks i and 2c-1-i of 2c), their positions, ``shard_sequence`` / ``unshard_sequence``;
* ``blocks``: attention over one block of keys and the log-sum-exp rule that merges blocks
  exactly (and its backward); which chunk pairs a causal mask lets us skip;
* ``masks``: which (query, key) scores a causal or document mask keeps, by the tokens'
  positions; grouped-query K and V repeated next to the attention; the one-process reference;
* ``ring``: ``ring_attention``: key/value blocks passed around the ring, the next one posted
  before the current one is computed; the backward a ring too;
* ``allgather``: ``allgather_attention`` (Llama 3): K and V all-gathered whole, each rank its
  own queries; the backward reduce-scatters their gradients;
* ``ulysses``: ``ulysses_attention`` (DeepSpeed-Ulysses): all-to-all from sequence shards to
  head shards, attention over the whole sequence on heads/c heads, all-to-all back;
* ``methods``: the three behind one call, ``context_attention(method, ...)``, and the bytes a
  rank sent to the others by its ledger (``sent_bytes``);
* ``recorder``: ``RingRecorder``, the hook handed to the ring: which block each rank held at each
  step, the work it did and the seconds it took (the Gantt chart of the ring);
* ``gpt``: the tiny GPT on c ranks (positions offset per shard, the loss over all tokens),
  combined with data parallelism over a (d, c) grid; its attention and embedding, as
  modules, are the hybrid builder's context room (``apply_cp``);
* ``torch_ref``: PyTorch's own ``context_parallel`` on the same inputs, where it runs;
* ``ring_runs``: what the tests, notebook 12 and ``labs/cp.py`` launch (parity with one process,
  the work per rank, the ledger's bytes against the formula, the ring's timeline);
* ``method_runs``: the same for the three methods side by side (parity with GQA and
  document masks, bytes sent against ``costmodel.context``, each method's time).

    from lessonlib.context_parallel import ring_attention, shard_sequence

Laptop:  ``python labs/cp.py --world-size 4``
GPU box: ``torchrun --nproc-per-node 8 labs/cp.py`` (NCCL; c ranks inside or across servers)
"""
from lessonlib.context_parallel.allgather import allgather_attention
from lessonlib.context_parallel.blocks import attend, chunk_pairs, merge, useful_pairs
from lessonlib.context_parallel.layout import (LAYOUTS, chunks_of, positions_of, shard_sequence,
                                               unshard_sequence)
from lessonlib.context_parallel.methods import METHODS, context_attention
from lessonlib.context_parallel.ring import Ring, RingAttention, ring_attention
from lessonlib.context_parallel.ulysses import ulysses_attention

__all__ = ["LAYOUTS", "chunks_of", "positions_of", "shard_sequence", "unshard_sequence",
           "attend", "merge", "chunk_pairs", "useful_pairs", "Ring", "RingAttention",
           "ring_attention", "allgather_attention", "ulysses_attention", "METHODS",
           "context_attention"]
