"""The course's models: plain modules that know nothing about ranks.

What it teaches: the model is one thing and how it is split is another. Every parallel
layout in lessonlib starts from these modules built from the same seed, then slices or wraps
them, so any layout can be compared with the single-process model exactly. Each file one idea:

* ``tiny``: the tiny GPT (``embed -> blocks -> head``, so a pipeline can cut it between any
  two parts), the MLP and ``mlp_stack``, ``lm_loss``, recomputation's modes, and every
  tiny-GPT preset of the course (``TINY``, ``PARITY_CONFIG``, ..., ``MOE_CONFIG``);
* ``moe``: ``MoELayer``, the mixture-of-experts feed-forward layer (route, dispatch, experts,
  combine), which ``moe_gpt`` puts in every block;
* ``moe_routing``: which k experts each token goes to: GShard's softmax, capacity and
  auxiliary loss; DeepSeek-V3's sigmoid gates, balancing bias, node limit, dropless.

    from lessonlib.models import TinyGPT, GPTConfig, lm_loss
    from lessonlib.models.moe import MoELayer

Laptop:  ``python -m lessonlib.models`` (``__main__``) prints the parameter count of the default
         shapes;
         ``python -m lessonlib.models.moe`` routes a random batch with each recipe.
GPU box: the same; the models have no device logic of their own.
"""
from lessonlib.models.tiny import (HYBRID_CONFIG, LONG_RUN, MLP, MOE_CONFIG, PARITY_CONFIG,
                                   RECOMPUTE, SHARDING_CONFIG, TEN_M, TIMELINE_MODEL, TINY, Block,
                                   Embed, GPTConfig, Head, SelfAttention, TinyGPT, attention_core,
                                   corpus_config, count_parameters, init_weights_, lm_loss,
                                   mlp_stack, moe_gpt, set_recompute)

__all__ = ["HYBRID_CONFIG", "LONG_RUN", "MLP", "MOE_CONFIG", "PARITY_CONFIG", "RECOMPUTE",
           "SHARDING_CONFIG", "TEN_M", "TIMELINE_MODEL", "TINY", "Block", "Embed", "GPTConfig",
           "Head", "SelfAttention", "TinyGPT", "attention_core", "corpus_config",
           "count_parameters", "init_weights_", "lm_loss", "mlp_stack", "moe_gpt",
           "set_recompute"]
