"""How much arithmetic training takes, and how long that is at a given FLOP/s.

Rule of thumb: a forward pass costs 2 FLOPs per parameter per token, the backward pass twice
that, so training on D tokens costs about 6*P*D; recomputing activations runs the forward
again, 8*P*D (the 8 of Megatron-LM 2021's Eq. 4, Narayanan et al.).

Megatron-LM 2021 counts more exactly (Eq. 3), per iteration of B sequences, with full
recompute:

    F = 96 B s L h^2 (1 + s/(6h) + V/(16 L h))

which it divides by time and GPU count to report "TFLOP/s per GPU", and estimates training
time as T_train ~ 8 T P / (n X) (Eq. 4) for T tokens on n GPUs at X FLOP/s each.

Try ``python -c "from lessonlib.costmodel import *; print(megatron_training_days(175e9,
300e9, 1024, 140e12))"`` (34 days, Megatron-LM 2021 with Eq. 4).
"""
SECONDS_PER_DAY = 86400.0
SECONDS_PER_YEAR = 365.25 * SECONDS_PER_DAY


def training_flops(n_params, n_tokens, recompute=False):
    """6*P*D (forward 2PD + backward 4PD), or 8*P*D when the forward is recomputed."""
    return (8 if recompute else 6) * n_params * n_tokens


def layer_forward_flops(model, b):
    """Forward FLOPs of one transformer layer for b sequences: 24bsh^2 + 4bs^2h.

    24bsh^2: the QKV, output and two MLP GEMMs (2 FLOPs per multiply-add);
    4bs^2h: the attention scores QK^T and their product with V.

    For today's shapes (``model.legacy`` False) the GEMMs are 2 b s x the layer's active
    weights (``layer_matmul_params``: GQA, SwiGLU, k routed experts) and the attention core
    is causal: a fused kernel computes about half of the s^2 scores, 2bs^2h.
    """
    s, h = model.s, model.h
    if model.legacy:
        return 24 * b * s * h**2 * (1 + s / (6 * h))
    return 2 * b * s * model.layer_matmul_params() + attention_core_forward_flops(model, b)


def attention_core_forward_flops(model, b):
    """The 4bs^2h of ``layer_forward_flops`` that selective recompute runs twice (2bs^2h
    under a causal kernel for today's shapes; with head dims other than h/a, as MLA's,
    b s^2 a (d_qk + d_v): QK^T and PV over half the scores)."""
    if model.legacy:
        return 4 * b * model.s**2 * model.h
    qk, v = model.qk_v_head_dims()
    return b * model.s**2 * model.a * (qk + v)


def logits_forward_flops(model, b):
    """Forward FLOPs of the output layer (h -> V logits) for b sequences: 2bshV."""
    return 2 * b * model.s * model.h * model.V


def megatron_flops_per_iteration(model, global_batch):
    """Megatron-LM 2021 Eq. 3: FLOPs of one iteration of B sequences, recompute included."""
    B, s, L, h, V = global_batch, model.s, model.L, model.h, model.V
    return 96 * B * s * L * h**2 * (1 + s / (6 * h) + V / (16 * L * h))


def model_flops_per_iteration(model, global_batch):
    """FLOPs the model needs without recompute (3 forward passes' worth); for MFU."""
    return global_batch * (3 * model.L * layer_forward_flops(model, 1)
                           + 3 * logits_forward_flops(model, 1))


def training_time_s(flops, n_gpus, flops_per_gpu):
    """Seconds to execute ``flops`` on ``n_gpus`` GPUs that each sustain ``flops_per_gpu``."""
    if n_gpus <= 0 or flops_per_gpu <= 0:
        raise ValueError(f"n_gpus={n_gpus} and flops_per_gpu={flops_per_gpu} must be positive")
    return flops / (n_gpus * flops_per_gpu)


def rate_for_time(flops, n_gpus, time_s):
    """Per-GPU FLOP/s at which ``flops`` take ``time_s`` on ``n_gpus``: training_time_s solved
    for the rate. E.g. the V100 rate behind "288 years" for GPT-3 (Megatron-LM 2021 §1)."""
    if n_gpus <= 0 or time_s <= 0:
        raise ValueError(f"n_gpus={n_gpus} and time_s={time_s} must be positive")
    return flops / (n_gpus * time_s)


def megatron_training_time_s(n_params, n_tokens, n_gpus, flops_per_gpu):
    """Megatron-LM 2021 Eq. 4: 8*T*P / (n*X) seconds (recompute included)."""
    return training_time_s(training_flops(n_params, n_tokens, recompute=True), n_gpus,
                           flops_per_gpu)


def megatron_training_days(n_params, n_tokens, n_gpus, flops_per_gpu):
    """Eq. 4 in days: GPT-3 175B, 300e9 tokens, 1024 A100 at 140 TFLOP/s -> about 34."""
    return megatron_training_time_s(n_params, n_tokens, n_gpus, flops_per_gpu) / SECONDS_PER_DAY


FLOP_COUNTS = ("course", "megatron-eq3", "korthikanti", "palm", "torchtitan",
               "torchtitan-2024-04", "megatron-lm")


def team_flops_per_token(model, formula="course"):
    """Model FLOPs per token as each team counts them, for MFU beside their figures.

    * "course": ``model_flops_per_iteration`` (today's shapes: causal scores halved, as a
      fused kernel computes them);
    * "megatron-eq3": Eq. 3 over B s, recompute included (hardware FLOPs, Megatron-LM 2021;
      BLOOM's logger counts the same, its "4*2 co-efficient");
    * "korthikanti": 72 L s h^2 (1 + s/(6h) + V/(12hL)) per sequence (Korthikanti et al.
      2022, App. A: model FLOPs, every score counted);
    * "palm": 6 N + 12 L H Q T (Chowdhery et al. 2022, App. B: N the parameters less the
      token embedding, H heads of dim Q, T tokens; every score counted), which the Llama 3
      rows use;
    * "torchtitan": the same, as torchtitan's ``get_num_flop_per_token`` writes it ("we
      follow the convention and do not account for sparsity in causal attention");
    * "torchtitan-2024-04": torchtitan's first count (its April 2024 ``train.py``:
      ``get_num_params(model)``, every parameter, the token embedding too, then ``6 *
      num_params + 12 * l * h * q * t``), which its first published MFU used;
    * "megatron-lm": Megatron-LM's ``num_floating_point_operations`` (megatron/training/
      training.py), the count NeMo's model TFLOP/s and Nemotron-4's MFU use: 12 s L h^2
      (1 + kv/a + s/h + ffn/h (x 3/2 if gated) + V/(2 L h)) per sequence; every score
      counted, no norms, the output layer once.
    """
    s, L, h, V = model.s, model.L, model.h, model.V
    if formula == "course":
        return model_flops_per_iteration(model, 1) / s
    if formula == "megatron-eq3":
        return megatron_flops_per_iteration(model, 1) / s
    if formula == "korthikanti":
        return 72 * L * s * h**2 * (1 + s / (6 * h) + V / (12 * h * L)) / s
    if formula in ("palm", "torchtitan"):
        return 6 * (model.params() - V * h) + 12 * L * h * s
    if formula == "torchtitan-2024-04":
        return 6 * model.params() + 12 * L * h * s
    if formula == "megatron-lm":
        if model.moe is not None or model.head_dims is not None:
            raise ValueError(f"formula='megatron-lm' is written here for dense models with "
                             f"h/a head dims; {model.name or 'this model'} is not one")
        kv = (model.kv_heads or model.a) / model.a
        ffn = (model.ffn or 4 * h) / h * (1.5 if model.ffn and model.mlp == "swiglu" else 1)
        return 12 * L * h**2 * (1 + kv + s / h + ffn + V / (2 * L * h))
    raise ValueError(f"formula={formula!r} must be one of {', '.join(FLOP_COUNTS)}")
