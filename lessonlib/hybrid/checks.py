"""Every refusal of a hybrid layout, once: one line naming the setting, before any process.

What it teaches: a layout that cannot train the model is caught by arithmetic alone. The
pipeline needs a layer per stage; tensor parallelism needs t to divide the heads and the
width; every replica needs m equal micro-batches; the axes must fill the world (and e divide
d: the expert groups lie inside the data-parallel ranks); context parallelism needs 2c equal
chunks of each sequence, sequence parallelism s/c tokens divisible by t; the sharding must be
one the dp axis knows; expert parallelism needs experts, and is combined here with tp, pp and
plain dp only. ``check_layout`` says so for lesson 05's three axes and for five alike, and
returns the micro-batch size b = B / (d m).

Laptop:  ``python -c "from lessonlib.hybrid import checks; from lessonlib.models import
         HYBRID_CONFIG; print(checks.check_layout(HYBRID_CONFIG, tp=2, pp=2, dp=2))"``
GPU box: the same (pure: no process, no device).
"""
from __future__ import annotations

from lessonlib.argcheck import positive_int
from lessonlib.context_parallel.layout import check_split_divides
from lessonlib.data_parallel.parallelize import SHARDS
from lessonlib.expert_parallel.layer import check_split
from lessonlib.grid_layout import check_grid
from lessonlib.models import GPTConfig

N_EXPERTS, TOP_K = 4, 2        # the MoE tiny GPT's experts, and how many each token visits
LAYOUT = "zigzag"              # how context parallelism cuts each sequence


def check_layout(cfg: GPTConfig, *, dp: int = 1, pp: int = 1, cp: int = 1, tp: int = 1,
                 ep: int = 1, global_batch: int = 8, m: int = 2, shard_on: str = "none",
                 sp: bool = False, moe: bool = False, world_size: int | None = None) -> int:
    """Raise ValueError naming the setting if the layout cannot train ``cfg`` (the MoE tiny
    GPT with ``moe``) on ``world_size`` ranks (default: dp*pp*cp*tp); return the micro-batch
    size b = B / (d m)."""
    for name, value in (("dp", dp), ("pp", pp), ("tp", tp), ("global_batch", global_batch),
                        ("m", m)):
        positive_int(name, value)
    if pp > cfg.layers:
        raise ValueError(f"pp={pp} stages but the model has layers={cfg.layers}: every stage "
                         f"needs at least one transformer layer; use pp <= {cfg.layers} or a "
                         f"deeper model")
    for setting, value in (("heads", cfg.heads), ("hidden", cfg.hidden)):
        if value % tp:
            ok = [k for k in range(1, cfg.heads + 1) if cfg.heads % k == 0 and cfg.hidden % k == 0]
            raise ValueError(f"tp={tp} must divide {setting}={value} (each TP rank takes an "
                             f"equal share); use tp in {ok}")
    if global_batch % (dp * m):
        ok = dp * m * max(1, round(global_batch / (dp * m)))
        raise ValueError(f"global_batch={global_batch} is not divisible by dp*m = {dp}*{m} = "
                         f"{dp * m}: each of the d replicas needs m equal micro-batches; use "
                         f"global_batch={ok}, or change m")
    check_grid(world_size or dp * pp * cp * tp, dp, pp, tp, None, cp, ep)
    if cp > 1:
        check_split_divides(cfg.seq, cp, LAYOUT)
    if sp and (cfg.seq // cp) % tp:
        raise ValueError(f"sequence parallelism needs s/c = {cfg.seq}/{cp} tokens divisible "
                         f"by tp={tp} (each TP rank's LayerNorms take s/(c t) of them)")
    if shard_on not in SHARDS:
        raise ValueError(f"shard={shard_on!r} is not a sharding of the dp axis; use one of "
                         f"{SHARDS}")
    if ep > 1:
        check_split(N_EXPERTS, ep, TOP_K)
        if cp > 1 or shard_on != "none":
            raise ValueError(f"ep={ep} with cp={cp}, shard={shard_on!r}: expert parallelism "
                             f"is combined here with tp, pp and plain dp only; use cp=1, "
                             f"shard='none'")
        if not moe:
            raise ValueError(f"ep={ep} needs experts: use moe=True (the MoE tiny GPT)")
    if sp and moe:
        raise ValueError("sp=True with moe=True: sequence parallelism is not combined with "
                         "MoE blocks here; use sp=False")
    return global_batch // (dp * m)
