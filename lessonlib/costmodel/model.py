"""A GPT model as the cost model sees it: five numbers, L, h, a, s, V.

Every transformer layer holds 12h^2 + 13h parameters (QKV and output projections 4h^2, the
MLP's two h x 4h matrices 8h^2, their biases and two layer norms 13h); the embeddings add
(V + s)h. Summed, that is Eq. 2 of Megatron-LM 2021 (Narayanan et al.):

    P = 12 L h^2 (1 + 13/(12h) + (V + s)/(12 L h))

The presets include every row of that paper's Table 1 (``megatron-1.7B`` ...
``megatron-1T``).

The shapes of today differ in four ways, each a field (all left at their defaults, a shape
is Megatron-LM 2021's and every count above holds exactly): ``kv_heads`` (grouped-query
attention: K and V projections of h x kv_heads*h/a, counted once ``ffn`` is set), ``ffn`` (a
SwiGLU feed-forward of any width: three h x ffn matrices, no biases, RMSNorm),
``tied_embeddings`` (False: a separate V x h output layer; rotary positions, no position
table; ``position_table=False`` drops the table from a tied shape with rotary positions,
Llama 3.2's) and ``moe`` (a ``costmodel.moe.MoEModel``: the same shape with routed experts,
whose total and active counts ``moe.py`` owns). ``llama3-8B/70B/405B``,
``llama3.2-1B/3B`` and ``deepseek-v3`` are presets of that kind.

Try ``python -m lessonlib.costmodel --model gpt3-175B --t 8 --p 12 --d 4 --microbatch 1
--global-batch 1536``.
"""
import math
from dataclasses import dataclass

from lessonlib.argcheck import positive_int

from .moe import MOE_MODELS, MoEModel, active_params, expert_params, total_params

# The MLPs a shape with ``ffn`` can have: gated SwiGLU, or one of two ungated activations
# (the same two matrices and the same FLOPs; ``layer_bytes.mlp_bytes`` keeps two tensors).
MLPS = ("swiglu", "relu2", "gelu")

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
    ffn: int | None = None
    tied_embeddings: bool = True
    moe: MoEModel | None = None
    # Per-head dims of queries/keys and of values where they are not h/a: DeepSeek-V3's MLA
    # (§2.1.1): 128 heads of 128 + 64 rotary dims for Q and K, 128 for V.
    head_dims: tuple | None = None
    # Multi-token prediction modules (DeepSeek-V3 §2.2, depth 1): one more layer and one more
    # pass through the shared output head on the last stage; not in the parameter count.
    mtp: int = 0
    # MLA's latents (DeepSeek-V3 §2.1.1, §4.2): the query latent d_c' (1536), the key/value
    # latent d_c (512) and the shared rotary key d_h^R (64) that the up-projections read.
    mla_latents: tuple | None = None
    # The MLP of a shape with ``ffn``: "swiglu" (three h x ffn matrices, Llama), "relu2"
    # (two, squared ReLU: Nemotron-4, arXiv 2402.16819 §2) or "gelu" (two: GPT-3's MLP,
    # Megatron-LM's default, on today's layer).
    mlp: str = "swiglu"
    # Whether the model keeps a learned s x h position table. None: the tied dense shapes do
    # (GPT-2's and Megatron-LM 2021's), the rest rotate their positions (RoPE); False for a
    # tied shape with rotary positions (Llama 3.2 1B and 3B, whose config.json ties the
    # output layer to the embedding and sets rope_theta).
    position_table: bool | None = None

    @property
    def keeps_position_table(self):
        """``position_table``, or where it is None the default: a tied dense shape keeps one."""
        if self.position_table is None:
            return self.tied_embeddings and self.moe is None
        return self.position_table

    @property
    def legacy(self):
        """True for Megatron-LM 2021's layer (GeLU MLP of 4h with biases, LayerNorm, tied
        embeddings, learned positions), where Eq. 2 and Eq. 3 hold exactly."""
        return self.ffn is None and self.moe is None and self.tied_embeddings

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
        if self.ffn is not None:
            positive_int("ffn", self.ffn, most=MAX)
        if self.position_table not in (None, True, False):
            raise ValueError(f"position_table={self.position_table!r} must be True, False or "
                             f"None (the shape's default)")
        if self.ffn is None and self.moe is None and self.tied_embeddings \
                and not self.keeps_position_table:
            raise ValueError("position_table=False needs today's layer: set ffn (its MLP "
                             "width), since Megatron-LM 2021's layer and Eq. 2 count the "
                             "position table")
        if self.mlp not in MLPS:
            raise ValueError(f"mlp={self.mlp!r} must be one of {', '.join(map(repr, MLPS))}")
        if self.moe is not None and (self.moe.L, self.moe.h, self.moe.V) != (self.L, self.h,
                                                                              self.V):
            raise ValueError(f"moe={self.moe.name!r} has L={self.moe.L}, h={self.moe.h}, "
                             f"V={self.moe.V}; the GPT shape must have the same")

    def qk_v_head_dims(self):
        """(query/key, value) dims per head: ``head_dims`` or h/a for both."""
        return self.head_dims or (self.h // self.a, self.h // self.a)

    def attention_params(self):
        """Q, K, V and output projections of one layer (no biases unless ``legacy``)."""
        if self.moe is not None:
            return self.moe.attention
        kv = (self.kv_heads or self.a) * (self.h // self.a)
        return 2 * self.h**2 + 2 * self.h * kv

    def layer_params(self, e=1):
        """Parameters of one transformer layer on one of ``e`` expert-parallel GPUs: 12h^2 +
        13h for Megatron-LM 2021's layer; attention + 3 h ffn + 2 norms for a SwiGLU layer;
        for an MoE model its (largest) MoE layer with E/e of the routed experts."""
        if self.legacy:
            return 12 * self.h**2 + 13 * self.h
        if self.moe is None:
            matrices = 3 if self.mlp == "swiglu" else 2
            return self.attention_params() + matrices * self.h * self.ffn + 2 * self.h
        return self.layer_dense_params() + self.moe.E * expert_params(self.moe) / e

    def layer_dense_params(self):
        """One MoE layer without its routed experts: attention, norms, shared experts,
        router (for a dense model, the whole layer)."""
        if self.moe is None:
            return self.layer_params()
        m = self.moe
        return m.attention + 2 * m.h + m.shared * expert_params(m) + m.h * m.E

    def embedding_params(self):
        """Token (V x h) and position (s x h, where ``position_table``) embeddings, the output
        layer sharing the first (Megatron-LM 2021); untied: token embedding, output layer and
        the final norm."""
        positions = self.s * self.h if self.keeps_position_table else 0
        if self.tied_embeddings and self.moe is None:
            return self.V * self.h + positions
        return 2 * self.V * self.h + self.h + positions

    def params(self):
        """Total parameters: Megatron-LM 2021 Eq. 2, or the sum over this shape's parts."""
        L, h = self.L, self.h
        if self.legacy:
            return 12 * L * h**2 * (1 + 13 / (12 * h) + (self.V + self.s) / (12 * L * h))
        if self.moe is not None:
            return total_params(self.moe)
        return L * self.layer_params() + self.embedding_params()

    def active_params(self):
        """Parameters one token uses: all of them, but for an MoE model only k experts."""
        return active_params(self.moe) if self.moe is not None else self.params()

    def layer_matmul_params(self):
        """Weights one token multiplies in an average layer (2 FLOPs each forward): 12h^2
        (Megatron-LM 2021 Eq. 3), or the active non-embedding parameters over L."""
        if self.legacy:
            return 12 * self.h**2
        return (self.active_params() - self.embedding_params()) / self.L

    def describe(self):
        """One line: name, size and shape, for tables and the CLI."""
        extra = (f", kv={self.kv_heads}" if self.kv_heads else "") + \
            (f", ffn={self.ffn}" if self.ffn else "") + \
            (f", {self.active_params() / 1e9:.1f} B active, E={self.moe.E} k={self.moe.k}"
             if self.moe else "")
        return (f"{self.name or 'GPT'} ({self.params() / 1e9:.1f} B params: L={self.L}, "
                f"h={self.h}, a={self.a}, s={self.s}, V={self.V}{extra})")


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
    # Llama 3 (Dubey et al. 2024, "The Llama 3 Herd of Models", Table 3): SwiGLU, 8 KV heads,
    # V = 128256, untied embeddings, 8K-token pretraining; 8.03 B, 70.6 B and 405 B in total.
    "llama3-8B": GPT(32, 4096, 32, 8192, 128256, "llama3-8B", kv_heads=8, ffn=14336,
                     tied_embeddings=False),
    "llama3-70B": GPT(80, 8192, 64, 8192, 128256, "llama3-70B", kv_heads=8, ffn=28672,
                      tied_embeddings=False),
    "llama3-405B": GPT(126, 16384, 128, 8192, 128256, "llama3-405B", kv_heads=8, ffn=53248,
                       tied_embeddings=False),
    # Llama 3.2 1B and 3B (Meta's config.json of meta-llama/Llama-3.2-1B and -3B): SwiGLU of
    # 8,192, 8 KV heads, V = 128256, the output layer tied to the embedding, rotary positions
    # (no position table), pretrained at 8K tokens (original_max_position_embeddings);
    # 1.23 B and 3.21 B in total (its model card).
    "llama3.2-1B": GPT(16, 2048, 32, 8192, 128256, "llama3.2-1B", kv_heads=8, ffn=8192,
                       position_table=False),
    "llama3.2-3B": GPT(28, 3072, 24, 8192, 128256, "llama3.2-3B", kv_heads=8, ffn=8192,
                       position_table=False),
    # Nemotron-4 15B (arXiv 2402.16819, Table 1): 32 layers, h 6144, 48 heads, 8 KV heads,
    # 4K tokens, V 256,000, untied; its MLP two matrices of 24,576 with squared ReLU (NeMo's
    # config); 12.5 B non-embedding + 3.1 B embedding parameters. Its LayerNorm keeps a mean
    # beside 1/std, 4 bytes per token more than the RMSNorm the activation count assumes.
    "nemotron-4-15B": GPT(32, 6144, 48, 4096, 256000, "nemotron-4-15B", kv_heads=8,
                          ffn=24576, tied_embeddings=False, mlp="relu2"),
    # Llama 2 (Touvron et al. 2023, arXiv 2307.09288, Table 1 and §2): 4K-token context,
    # a 32k-token vocabulary, grouped-query attention for the 70B (8 KV heads); layers, hidden,
    # heads and SwiGLU widths as NeMo-Framework-Launcher 24.07 builds them (conf/training/
    # llama/llama2_{7b,13b,70b}.yaml), untied output layer.
    "llama2-7B": GPT(32, 4096, 32, 4096, 32000, "llama2-7B", ffn=11008, tied_embeddings=False),
    "llama2-13B": GPT(40, 5120, 40, 4096, 32000, "llama2-13B", ffn=13824,
                      tied_embeddings=False),
    "llama2-70B": GPT(80, 8192, 64, 4096, 32000, "llama2-70B", kv_heads=8, ffn=28672,
                      tied_embeddings=False),
    # Nemotron-3 8B and 22B and Nemotron-4 340B as NeMo-Framework-Launcher 24.07 builds them
    # (conf/training/nemotron/nemotron_{8b,22b,340b}.yaml): squared-ReLU MLPs of 4h, untied,
    # every head its own K/V but the 340B's 8 query groups; the configs load a SentencePiece
    # model without naming its size: Nemotron-4's 256,000 tokens (arXiv 2402.16819, §2), a
    # reading.
    "nemotron-3-8B": GPT(32, 4096, 32, 4096, 256000, "nemotron-3-8B", ffn=16384,
                         tied_embeddings=False, mlp="relu2"),
    "nemotron-3-22B": GPT(40, 6144, 48, 4096, 256000, "nemotron-3-22B", ffn=24576,
                          tied_embeddings=False, mlp="relu2"),
    "nemotron-4-340B": GPT(96, 18432, 96, 4096, 256000, "nemotron-4-340B", kv_heads=8,
                           ffn=73728, tied_embeddings=False, mlp="relu2"),
    # DeepSeek-V3 (DeepSeek-AI 2024, arXiv 2412.19437): 671 B total, 37 B active, 4K tokens,
    # 128 heads of multi-head latent attention; its experts as ``moe.py`` builds them.
    "deepseek-v3": GPT(61, 7168, 128, 4096, 129280, "deepseek-v3", tied_embeddings=False,
                       moe=MOE_MODELS["deepseek-v3"], head_dims=(192, 128), mtp=1,
                       mla_latents=(1536, 512, 64)),
}

# The published totals the presets are checked against (tests), from the sources above.
PUBLISHED_PARAMS = {"llama3-8B": 8.03e9, "llama3-70B": 70.6e9, "llama3-405B": 405e9,
                    "llama3.2-1B": 1.23e9, "llama3.2-3B": 3.21e9,
                    "deepseek-v3": 671e9}


def get_model(name):
    """The model preset called ``name`` (exact key of ``MODELS``, case-insensitive)."""
    wanted = name.strip().lower() if isinstance(name, str) else None
    for key, model in MODELS.items():
        if key.lower() == wanted:
            return model
    raise ValueError(f"model={name!r} is not a preset; use one of {', '.join(MODELS)}")
