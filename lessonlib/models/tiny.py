"""The course's tiny models: a GPT and an MLP. Plain modules that know nothing about ranks.

What it teaches: the model is one thing and how it is split is another. Every parallel
layout in lessonlib starts from these modules built from the same seed, then slices or
wraps them (``parallelize_*`` functions elsewhere), so any layout can be compared with
this single-process model exactly.

The GPT is a sequence of parts, ``embed -> blocks[0..L-1] -> head``, so that a pipeline
can cut it between any two parts: ``nn.Sequential(*model.parts())`` is the same function.

The course's tiny-GPT presets live here too, one home for every shape a lesson uses, each
with the vocabulary of the shipped corpus (``corpus_config``).

Laptop:  ``python -m lessonlib.models`` prints the parameter count of the default shapes.
GPU box: the same; the models have no device logic of their own.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from lessonlib.argcheck import positive_int
from lessonlib.data import corpus_vocab
from lessonlib.instruments.activations import checkpoint


@dataclass(frozen=True)
class GPTConfig:
    """Megatron-LM 2021 notation: V vocabulary, s sequence, h hidden, a heads, L layers."""
    vocab: int = 64      # V
    seq: int = 32        # s
    hidden: int = 64     # h
    heads: int = 4       # a
    layers: int = 2      # L
    ffn_mult: int = 4    # the MLP's inner size is ffn_mult * h

    def __post_init__(self):
        for name in ("vocab", "seq", "hidden", "heads", "layers", "ffn_mult"):
            positive_int(f"GPTConfig.{name}", getattr(self, name))
        if self.hidden % self.heads:
            raise ValueError(f"GPTConfig.hidden={self.hidden} must be divisible by "
                             f"heads={self.heads} (each head gets hidden/heads dims)")


class MLP(nn.Module):
    """Megatron's MLP: Y = GeLU(X A), Z = Y B, with A = ``fc1`` (h -> 4h), B = ``fc2``."""

    def __init__(self, hidden: int, inner: int | None = None):
        super().__init__()
        inner = inner or 4 * hidden
        self.fc1 = nn.Linear(hidden, inner)
        self.fc2 = nn.Linear(inner, hidden)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class SelfAttention(nn.Module):
    """Causal multi-head self-attention; q, k, v kept as separate projections so that a
    tensor-parallel version can split them by heads column-wise, and ``proj`` row-wise."""

    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.head_dim = hidden // heads
        self.q, self.k, self.v = (nn.Linear(hidden, hidden) for _ in range(3))
        self.proj = nn.Linear(hidden, hidden)
        self.recompute_core = False     # selective recompute: see ``attention_core``

    def forward(self, x):
        b, s, _ = x.shape                                               # (b, s, h)
        q, k, v = self.heads(x)
        y = attention_core(q, k, v, self.recompute_core)                # (b, a, s, h/a)
        return self.proj(y.transpose(1, 2).reshape(b, s, -1))           # (b, s, h)

    def heads(self, x):
        """q, k and v of ``x``, (b, a, s, h/a) each: what attention (or a ring) consumes."""
        return tuple(self.split_heads(f(x)) for f in (self.q, self.k, self.v))

    def split_heads(self, x):
        b, s, _ = x.shape                     # works for all heads or a shard of them
        return x.view(b, s, -1, self.head_dim).transpose(1, 2)          # (b, heads, s, h/a)


def attention_core(q, k, v, recompute: bool = False):
    """softmax(q k^T / sqrt(h/a)) v with a causal mask: (b, a, s, h/a) each -> (b, a, s, h/a).

    With ``recompute`` nothing inside is kept for backward but q, k and v: the backward pass
    runs it again (Korthikanti et al. 2022's selective recompute, the part whose activations
    grow with s^2 and which costs few FLOPs)."""
    if recompute:
        return checkpoint(attention_core, q, k, v)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


RECOMPUTE = ("none", "selective", "full")


class Block(nn.Module):
    """Pre-LayerNorm transformer layer: x + attn(ln(x)), then x + mlp(ln(x)).

    ``recompute`` (Korthikanti et al. 2022): "none" keeps every activation for backward;
    "selective" recomputes the attention core (``attention_core``); "full" keeps only the
    layer's input and runs the whole layer again in backward. Settable on a built block,
    a tensor-parallel one included."""

    def __init__(self, cfg: GPTConfig, recompute: str = "none"):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.hidden)
        self.attn = SelfAttention(cfg.hidden, cfg.heads)
        self.ln2 = nn.LayerNorm(cfg.hidden)
        self.mlp = MLP(cfg.hidden, cfg.ffn_mult * cfg.hidden)
        self.recompute = recompute
        self.seq = cfg.seq              # s of the model it belongs to, for copies that split it

    @property
    def recompute(self) -> str:
        return self._recompute

    @recompute.setter
    def recompute(self, mode: str):
        if mode not in RECOMPUTE:
            raise ValueError(f"recompute={mode!r} must be one of {', '.join(RECOMPUTE)}")
        self._recompute = mode
        self.attn.recompute_core = mode == "selective"

    def forward(self, x):
        if self.recompute == "full":
            return checkpoint(self.layer, x)
        return self.layer(x)

    def layer(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


def set_recompute(model: nn.Module, mode: str) -> nn.Module:
    """Set ``recompute`` on every ``Block`` of ``model`` (a GPT, a pipeline stage, a block)."""
    for module in model.modules():
        if isinstance(module, Block):
            module.recompute = mode
    return model


class Embed(nn.Module):
    """Token plus learned position embeddings: (b, s) token ids -> (b, s, h)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.hidden)
        self.pos = nn.Embedding(cfg.seq, cfg.hidden)

    def forward(self, idx):
        positions = torch.arange(idx.shape[1], device=idx.device)
        return self.tok(idx) + self.pos(positions)                      # (b, s, h)


class Head(nn.Module):
    """Final LayerNorm and the projection to vocabulary logits: (b, s, h) -> (b, s, V)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln = nn.LayerNorm(cfg.hidden)
        self.out = nn.Linear(cfg.hidden, cfg.vocab, bias=False)

    def forward(self, x):
        return self.out(self.ln(x))                                     # (b, s, V)


class TinyGPT(nn.Module):
    """A GPT-2-shaped decoder, small enough to train on a laptop CPU."""

    def __init__(self, cfg: GPTConfig = GPTConfig(), seed: int = 0):
        super().__init__()
        self.cfg = cfg
        self.embed = Embed(cfg)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.head = Head(cfg)
        init_weights_(self, seed, std=0.02)

    def parts(self) -> list[nn.Module]:
        """The model as a list of L + 2 parts a pipeline can cut between."""
        return [self.embed, *self.blocks, self.head]

    def forward(self, idx):
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def lm_loss(logits, targets):
    """Mean next-token cross-entropy over every position: (b, s, V), (b, s) -> scalar."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def mlp_stack(width: int = 64, depth: int = 4, seed: int = 0, out: int | None = None) -> nn.Sequential:
    """``depth`` layers of Linear + GeLU (the last without GeLU): the model that data- and
    model-parallel lessons split and replicate. Deterministic from ``seed``."""
    layers: list[nn.Module] = []
    for i in range(depth):
        last = i == depth - 1
        layers.append(nn.Linear(width, out if (last and out) else width))
        if not last:
            layers.append(nn.GELU())
    model = nn.Sequential(*layers)
    init_weights_(model, seed)
    return model


@torch.no_grad()
def init_weights_(module: nn.Module, seed: int, std: float | None = None) -> nn.Module:
    """Fill every parameter from one generator seeded with ``seed``, in parameter order.

    Matrices and embeddings get N(0, std), or N(0, 1/fan_in) when ``std`` is None; biases
    get zeros and LayerNorm weights ones. The global RNG is not touched."""
    gen = torch.Generator().manual_seed(seed)
    for name, p in module.named_parameters():
        if p.ndim >= 2:
            sigma = std if std is not None else 1.0 / math.sqrt(p.shape[1])
            p.copy_(torch.randn(p.shape, generator=gen) * sigma)
        elif name.endswith("bias"):
            p.zero_()
        else:
            p.fill_(1.0)
    return module


def count_parameters(module: nn.Module) -> int:
    """Distinct parameters (a tied weight counts once)."""
    return sum(p.numel() for p in module.parameters())


# ---------------------------------------------------------------- presets
def corpus_config(**shape) -> GPTConfig:
    """A tiny GPT sized for the shipped corpus: its vocabulary is the corpus's characters."""
    return GPTConfig(**{"vocab": corpus_vocab(), **shape})


TINY = corpus_config(seq=16, hidden=32, heads=2, layers=2)             # data-parallel parity
PARITY_CONFIG = corpus_config(seq=8, hidden=16, heads=2, layers=6)     # 8 parts: up to 8 stages
HYBRID_CONFIG = corpus_config(seq=16, hidden=32, heads=4, layers=4)    # t and p up to 4
LONG_RUN = corpus_config(seq=16, hidden=32, heads=4, layers=2)         # minutes, checkpointed
TIMELINE_MODEL = corpus_config(seq=64, hidden=256, heads=4, layers=4)  # 3.2 M: a step's buckets
TEN_M = corpus_config(seq=64, hidden=384, heads=6, layers=6)           # 10.7 M: the DDP benchmark
SHARDING_CONFIG = corpus_config(seq=8, hidden=12, heads=2, layers=2)   # h = 12: shards of 2 and 3 differ
MOE_CONFIG = corpus_config(seq=16, hidden=32, heads=2, layers=2)        # each MLP -> 4 experts


def moe_gpt(cfg: GPTConfig = MOE_CONFIG, n_experts: int = 4, top_k: int = 2,
            capacity_factor: float | None = 1.25, seed: int = 0, **routing) -> TinyGPT:
    """A TinyGPT whose every block's MLP is an ``MoELayer`` of ``n_experts`` MLPs (``routing``:
    its routing options, e.g. ``balance="bias", gate="sigmoid"``); train it on
    ``lm_loss(...) + aux_loss(model)``, and with ``balance="bias"`` call
    ``moe.update_biases(model)`` after each optimizer step."""
    # imported here, not at the top, so that ``python -m lessonlib.models.moe`` runs that
    # module once (the package imports this one)
    from lessonlib.models.moe import MoELayer
    model = TinyGPT(cfg, seed)
    for block in model.blocks:
        block.mlp = MoELayer(cfg.hidden, n_experts, top_k, capacity_factor, cfg.ffn_mult,
                             **routing)
    return init_weights_(model, seed, std=0.02)

