"""A GPT model as the cost model sees it: five numbers, L, h, a, s, V.

Every transformer layer holds 12h^2 + 13h parameters (QKV and output projections 4h^2, the
MLP's two h x 4h matrices 8h^2, their biases and two layer norms 13h); the embeddings add
(V + s)h. Summed, that is Eq. 2 of Megatron-LM 2021 (Narayanan et al.):

    P = 12 L h^2 (1 + 13/(12h) + (V + s)/(12 L h))

The presets include every row of that paper's Table 1 (``megatron-1.7B`` ...
``megatron-1T``). Try ``python -m lessonlib.costmodel --model gpt3-175B --t 8 --p 12 --d 4
--microbatch 1 --global-batch 1536``.
"""
import math
from dataclasses import dataclass

from lessonlib.argcheck import positive_int

# The largest size, count or batch the cost model takes: 2**31 - 1 keeps every product it
# forms (FLOPs, bytes) far inside a float's range, and no real run comes near it.
MAX = 2**31 - 1


@dataclass(frozen=True)
class GPT:
    """Decoder-only transformer shape in Megatron-LM 2021 notation.

    L layers, hidden size h, a attention heads, sequence length s, vocabulary V;
    ``kv_heads``: the key/value heads of grouped-query attention (None: a, every head its own),
    which set the bytes of K and V that context parallelism passes around its ring.
    """

    L: int
    h: int
    a: int
    s: int
    V: int
    name: str = ""
    kv_heads: int | None = None

    def __post_init__(self):
        for field, value in (("layers", self.L), ("hidden", self.h), ("heads", self.a),
                             ("seq", self.s), ("vocab", self.V)):
            positive_int(field, value, most=MAX)
        if self.h % self.a:
            raise ValueError(f"hidden={self.h} must be a multiple of heads={self.a} "
                             f"(e.g. heads={_divisor_near(self.h, self.a)})")
        if self.kv_heads is not None and (isinstance(self.kv_heads, bool)
                                          or not isinstance(self.kv_heads, int)
                                          or self.kv_heads < 1 or self.a % self.kv_heads):
            raise ValueError(f"kv_heads={self.kv_heads!r} must be a positive divisor of "
                             f"heads={self.a} (each key/value head serves a/kv_heads query heads)")

    def layer_params(self):
        """Parameters of one transformer layer: 12h^2 + 13h."""
        return 12 * self.h**2 + 13 * self.h

    def embedding_params(self):
        """Token (V x h) and position (s x h) embeddings; the output layer shares the first."""
        return (self.V + self.s) * self.h

    def params(self):
        """Total parameters, Megatron-LM 2021 Eq. 2."""
        L, h = self.L, self.h
        return 12 * L * h**2 * (1 + 13 / (12 * h) + (self.V + self.s) / (12 * L * h))

    def describe(self):
        """One line: name, size and shape, for tables and the CLI."""
        return (f"{self.name or 'GPT'} ({self.params() / 1e9:.1f} B params: L={self.L}, "
                f"h={self.h}, a={self.a}, s={self.s}, V={self.V})")


def divisors(n):
    """Every divisor of the positive integer n, ascending (in about sqrt(n) steps)."""
    small = [k for k in range(1, math.isqrt(n) + 1) if n % k == 0]
    return sorted(set(small + [n // k for k in small]))


def _divisor_near(h, a):
    """The divisor of h closest to a, to suggest a valid head count in an error message."""
    return min(divisors(h), key=lambda k: abs(k - a))


MODELS = {
    # GPT-2 (Radford et al. 2019): 124M and 1.5B, vocabulary 50257, context 1024.
    "gpt2-small": GPT(12, 768, 12, 1024, 50257, "gpt2-small"),
    "gpt2-xl": GPT(48, 1600, 25, 1024, 50257, "gpt2-xl"),
    # GPT-3 175B (Brown et al. 2020, Table 2.1) with Megatron-LM 2021's padded V = 51200.
    "gpt3-175B": GPT(96, 12288, 96, 2048, 51200, "gpt3-175B"),
    # Megatron-LM 2021 (Narayanan et al.), Table 1; V = 51200, s = 2048 for every row.
    "megatron-1.7B": GPT(24, 2304, 24, 2048, 51200, "megatron-1.7B"),
    "megatron-3.6B": GPT(30, 3072, 32, 2048, 51200, "megatron-3.6B"),
    "megatron-7.5B": GPT(36, 4096, 32, 2048, 51200, "megatron-7.5B"),
    "megatron-18.4B": GPT(40, 6144, 48, 2048, 51200, "megatron-18.4B"),
    "megatron-39.1B": GPT(48, 8192, 64, 2048, 51200, "megatron-39.1B"),
    "megatron-76.1B": GPT(60, 10240, 80, 2048, 51200, "megatron-76.1B"),
    "megatron-145.6B": GPT(80, 12288, 96, 2048, 51200, "megatron-145.6B"),
    "megatron-310.1B": GPT(96, 16384, 128, 2048, 51200, "megatron-310.1B"),
    "megatron-529.6B": GPT(105, 20480, 128, 2048, 51200, "megatron-529.6B"),
    "megatron-1T": GPT(128, 25600, 160, 2048, 51200, "megatron-1T"),
    # A 161.6 B shape close to the 162.2 B model of Megatron-LM 2021 §5.4, with 128 heads and
    # 128 layers so that every t and p up to 64 divides them (the t x p sweep on 64 GPUs).
    "gpt-161B": GPT(128, 10240, 128, 2048, 51200, "gpt-161B"),
    # The 162.2 B model of Megatron-LM 2021's Fig. 13 as its run script builds it
    # (examples/sc21/run_figure_13.sh: 32 layers, h = 20480, 128 heads, t x p = 64).
    "megatron-162.2B-fig13": GPT(32, 20480, 128, 2048, 51200, "megatron-162.2B-fig13"),
}


def get_model(name):
    """The model preset called ``name`` (exact key of ``MODELS``, case-insensitive)."""
    wanted = name.strip().lower() if isinstance(name, str) else None
    for key, model in MODELS.items():
        if key.lower() == wanted:
            return model
    raise ValueError(f"model={name!r} is not a preset; use one of {', '.join(MODELS)}")
