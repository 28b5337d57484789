"""Where a GPU's memory goes during training: weights, gradients, optimizer state, activations.

Model state. Mixed-precision Adam keeps 16 bytes per parameter: 2 for the 16-bit weights,
2 for the 16-bit gradients, 12 for the fp32 master weights, momentum and variance (ZeRO,
Rajbhandari et al. 2020, §3.1). Tensor and pipeline parallelism split the parameters over
t*p GPUs; ZeRO stage 1, 2, 3 additionally shards the optimizer state, then the gradients,
then the weights over the d data-parallel replicas.

Activations. Korthikanti et al. 2022 (Table 2) count the bytes one transformer layer keeps
for the backward pass, in 16-bit, for a micro-batch of b sequences:

    no parallelism               s*b*h*(34 + 5*a*s/h)
    tensor parallel (TP)         s*b*h*(10 + 24/t + 5*a*s/(h*t))
    TP + sequence parallel (SP)  s*b*h*(34 + 5*a*s/h) / t
    TP + selective recompute     s*b*h*(10 + 24/t)          (SP: s*b*h*34/t)
    full recompute               2*s*b*h                    (only each layer's input)

Under 1F1B the first stage holds min(p, m) micro-batches of its L/p layers: about L layers'
worth, whatever p is (Korthikanti et al. 2022, Eq. 5); interleaving with v chunks multiplies
that by 1 + (p-1)/(p*v). GPipe holds all m micro-batches.

Run ``python -m lessonlib.costmodel --model gpt3-175B --t 8 --p 12 --d 4 --microbatch 1
--global-batch 1536`` to see the split for one layout.
"""
import math
from dataclasses import dataclass

from .bubble import stashed_microbatches

# ZeRO (Rajbhandari et al. 2020), §3.1: bytes per parameter of mixed-precision Adam.
WEIGHT_BYTES = 2  # 16-bit weights
GRAD_BYTES = 2  # 16-bit gradients
OPTIMIZER_BYTES = 12  # fp32 master weights + momentum + variance, 4 bytes each
BYTES_PER_PARAM = WEIGHT_BYTES + GRAD_BYTES + OPTIMIZER_BYTES  # 16

RECOMPUTE_MODES = ("none", "selective", "full")


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes on the busiest GPU (the first pipeline stage), by part."""

    weights: float
    gradients: float
    optimizer: float
    activations: float

    @property
    def model_state(self):
        return self.weights + self.gradients + self.optimizer

    @property
    def total(self):
        return self.model_state + self.activations

    def as_dict(self):
        return {"weights": self.weights, "gradients": self.gradients,
                "optimizer": self.optimizer, "activations": self.activations,
                "total": self.total}


def model_state_bytes(n_params, zero_stage=0, d=1):
    """(weights, gradients, optimizer) bytes per GPU for ``n_params`` parameters on it.

    ZeRO (Rajbhandari et al. 2020), Figure 1: stage 1 -> 4P + 12P/d, stage 2 -> 2P + 14P/d,
    stage 3 -> 16P/d.
    """
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage={zero_stage!r} must be 0, 1, 2 or 3")
    weights = WEIGHT_BYTES * n_params / (d if zero_stage >= 3 else 1)
    grads = GRAD_BYTES * n_params / (d if zero_stage >= 2 else 1)
    optimizer = OPTIMIZER_BYTES * n_params / (d if zero_stage >= 1 else 1)
    return weights, grads, optimizer


def layers_per_stage(L, p):
    """Layers on the busiest stage: the first stages take one more when p does not divide L."""
    return math.ceil(L / p)


def stage_params(model, t, p):
    """Parameters on one GPU of the first stage: its layers and the embeddings, split by t.

    The token embedding is split over t (vocabulary-parallel, Megatron-LM 2019 §3); the
    position embedding is replicated. The last stage holds a copy of the token embedding for
    the tied output layer, and fewer layers when p does not divide L, so it is never larger.
    """
    layers = layers_per_stage(model.L, p) * model.layer_params()
    return (layers + model.V * model.h) / t + model.s * model.h


def activation_bytes_per_layer(model, b, t=1, sequence_parallel=False, recompute="none"):
    """Bytes one layer keeps for backward, per micro-batch (Korthikanti et al. 2022, Table 2)."""
    if recompute not in RECOMPUTE_MODES:
        raise ValueError(f"recompute={recompute!r} must be one of {', '.join(RECOMPUTE_MODES)}")
    s, h, a = model.s, model.h, model.a
    sbh = s * b * h
    attention = 5 * a * s / h  # softmax input/output and dropout mask: grows with s^2
    if recompute == "full":
        return 2 * sbh
    if sequence_parallel:
        return sbh * 34 / t if recompute == "selective" else sbh * (34 + attention) / t
    if recompute == "selective":
        return sbh * (10 + 24 / t)
    return sbh * (10 + 24 / t + attention / t)


def in_flight_microbatches(schedule, p, m, v=1, stage=0):
    """Micro-batches' worth of activations ``stage`` holds at its peak.

    ``stashed_microbatches`` (1F1B: min(p - stage, m), GPipe: m), times
    1 + (p-1)/(p*v) for interleaved 1F1B (Korthikanti et al. 2022, Eq. 5).
    """
    held = stashed_microbatches(schedule, p, m, stage)
    if schedule == "1f1b" and v > 1:
        held *= 1 + (p - 1) / (p * v)
    return held


def activation_bytes(model, t, p, b, m, v=1, recompute="full", sequence_parallel=False,
                     schedule="1f1b"):
    """Activation bytes on a GPU of the first stage at its peak.

    With full recompute the backward of one layer rebuilds that layer's activations, so one
    layer's worth (without recompute) is added as working memory.
    """
    per_layer = activation_bytes_per_layer(model, b, t, sequence_parallel, recompute)
    stored = per_layer * layers_per_stage(model.L, p) * in_flight_microbatches(
        schedule, p, m, v)
    if recompute == "full":
        stored += activation_bytes_per_layer(model, b, t, sequence_parallel, "none")
    return stored


def memory_per_gpu(model, t=1, p=1, d=1, b=1, m=1, v=1, recompute="full",
                   sequence_parallel=False, zero_stage=0, schedule="1f1b"):
    """MemoryBreakdown of the busiest GPU for a (t, p, d) layout and micro-batching (b, m)."""
    weights, grads, optimizer = model_state_bytes(stage_params(model, t, p), zero_stage, d)
    acts = activation_bytes(model, t, p, b, m, v, recompute, sequence_parallel, schedule)
    return MemoryBreakdown(weights, grads, optimizer, acts)
