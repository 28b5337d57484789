"""What runs when nothing is fused: eager PyTorch's elementwise kernels, and torchtitan's
op-level selective activation checkpointing.

What it teaches: the GEMMs are not the whole layer. Between them run memory-bound kernels
(norms, rotary embeddings, the SwiGLU product, residual adds, layout copies) that do almost
no arithmetic and stream their tensors through HBM. Megatron-LM fuses them (a fused
LayerNorm, bias-GeLU, softmax) and torch.compile does the same for a model written in plain
PyTorch; eager PyTorch launches each op as its own kernel, which reads its inputs from HBM
and writes its output back. The difference is measured: torchtitan's Llama 3.1 8B on 8 H100
runs 5,762 tokens/s per GPU eager and 6,667 with torch.compile (docs/performance.md, Table 1).

``eager_layer_forward_bytes`` counts those kernels for one Llama-style layer as torchtitan
writes it (``models/llama/model.py``, ``norms.py``), per token, 2 bytes per bf16 element, 4
per fp32 one:

    RMSNorm, twice: x.float(), pow, mean, x * rsqrt(...), type_as, * weight  36 B per h
    rotary on q and k: float(), complex multiply, type_as                      20 B per q/k
    repeat_kv on k and v (copies to every query head)                          2 kv + 2 h each
    the attention output's transpose(...).contiguous() copy                    4 B per h
    two residual adds                                                          6 B per h each
    silu(w1 x) and its product with w3 x                                       4 + 6 B per ffn

Each backward kernel reads the output's gradient and its saved input and writes the input's
gradient, about twice a forward kernel's traffic; a recompute runs the forward's kernels
again. So a step moves (3 + recomputes) x the forward's bytes.

``op_recompute_share``: torchtitan's ``selective_ac_option = "op"`` saves the outputs of
matmuls and of the attention kernel, "except every second mm" (its ``_custom_policy``:
``meta[mm_count_key] % 2 == 0`` -> PREFER_RECOMPUTE), and recomputes every other op. In a
layer's order wq, wk, wv, wo, w1, w3, w2 that recomputes wk, wo and w3 and every
elementwise kernel; the share of the layer's linear FLOPs it repeats is returned.

Pure arithmetic: ``python -c "from lessonlib.costmodel import MODELS;
from lessonlib.costmodel.kernels import *; print(eager_layer_forward_bytes(MODELS['llama3-8B']))"``.
"""
from functools import lru_cache

from .gemm import layer_gemms

# The forward's elementwise kernels per token, bytes per element of each width (see above).
RMSNORM_BYTES = 36          # per h, each of two norms
ROTARY_BYTES = 20           # per element of q and of k
RESIDUAL_BYTES = 6          # per h, each of two adds
COPY_BYTES = 4              # per h: the attention output made contiguous
SWIGLU_BYTES = 4 + 6        # per ffn element: silu, then the product
# A backward kernel against a forward one: reads the gradient and the saved input, writes
# the input's gradient.
BACKWARD_TRAFFIC = 2
KERNELS = ("fused", "eager")
# The loss over the logits, per logit element on the GPU (the vocabulary split t ways), as
# torchtitan's ``cross_entropy_loss`` runs it, ``F.cross_entropy(pred.float(), labels)``:
# the float32 cast (read 2, write 4); log-softmax, reading its input for the maximum, for the
# sum of exponentials and for the output it writes (12, 4); backward, the NLL gradient
# written dense (4), log-softmax's backward reading it and the saved output and writing the
# input's gradient (12), and the cast back to BF16 for the output layer's GEMMs (4, 2).
# Not fused where torch.compile compiles the model but not the loss (torchtitan's until
# April 2025).
LOSS_BYTES = 6 + 16 + 4 + 12 + 6
# Compiled (``Layout.loss``, ``layer_bytes.loss_bytes``): the forward reads the BF16 logits
# twice (their maximum, then the sum of exponentials), the backward reads them once and
# writes the BF16 gradient, in the kernels inductor generates (torch 2.13).
COMPILED_LOSS_BYTES = 2 + 2 + 2 + 2
# Megatron's ``vocab_parallel_cross_entropy`` on ``logits.float()`` (Megatron-Core
# tensor_parallel/cross_entropy.py, core_r0.8.0; Megatron-LM's mpu of 2021 runs the same
# ops), one kernel per op: the cast (2, 4); the maximum (4); in place, subtract it (4, 4),
# exponentiate (4, 4); sum (4); divide by the sum (4, 4); backward, in place on the saved
# softmax, multiply by the loss's gradient (4, 4), and the cast back to BF16 (4, 2).
MEGATRON_LOSS_BYTES = 6 + 4 + 8 + 8 + 4 + 8 + 8 + 6
# Its fused form (``cross_entropy_loss_fusion``, fusions/fused_cross_entropy.py): the same
# steps as four ``jit_fuser`` functions, torch.compile since torch 2.2 (core/jit.py), each one
# kernel: cast with the maximum (2, 4); subtract, exponentiate and sum (4, 4); divide (4,
# 4); the gradient, written in BF16 (4, 2).
MEGATRON_FUSED_LOSS_BYTES = 6 + 8 + 8 + 6
LOSS_BYTES_BY_KIND = {"eager": LOSS_BYTES, "compiled": COMPILED_LOSS_BYTES,
                      "megatron": MEGATRON_LOSS_BYTES,
                      "megatron-fused": MEGATRON_FUSED_LOSS_BYTES}


# The input embedding's backward (PyTorch's embedding_dense_backward on CUDA,
# EmbeddingBackwardKernel.cu: ``at::zeros({num_weights, grad.size(-1)})``, then a scatter of
# the micro-batch's rows into it) writes a dense gradient of the whole table, V/t x h on a
# GPU of a vocabulary-parallel embedding, zeroed first: 2 bytes per element (BF16). Then
# the framework reads it (2) and writes it into its exchange's buffer in the reduce dtype:
# FSDP2 copies it into its reduce-scatter input (``foreach_reduce``), PyTorch DDP into its
# bucket; Megatron-Core's ZeRO-1/2 and DDP add it into the persistent main-grad buffer
# (``param.main_grad.add_(param.grad.data)``, distributed_data_parallel.py, core_v0.8.0),
# which also reads that buffer. Per micro-batch, on the stage that holds the embedding.
EMBEDDING_GRAD_ZEROS = 2
EMBEDDING_GRAD_READ = 2


def embedding_grad_bytes(model, t=1, reduce_bytes=4, accumulates=True):
    """HBM bytes one GPU moves per micro-batch for the input embedding's dense gradient
    (above): zeroed, read, written into the exchange's buffer in ``reduce_bytes`` per element,
    and that buffer also read where it ``accumulates`` (Megatron's main grad)."""
    per_element = (EMBEDDING_GRAD_ZEROS + EMBEDDING_GRAD_READ
                   + reduce_bytes * (2 if accumulates else 1))
    return per_element * model.V / t * model.h


def loss_bytes(model, b=1, t=1, c=1, loss="eager"):
    """HBM bytes the cross entropy over one micro-batch's logits moves on one GPU, forward
    and backward: b s/c tokens, V/t logits each; ``loss``: how it runs (``Layout.loss``)."""
    return LOSS_BYTES_BY_KIND[loss] * b * model.s / c * model.V / t


def eager_layer_forward_bytes(model, b=1, t=1, c=1):
    """HBM bytes the forward's elementwise kernels move for one layer and b sequences, one
    kernel per op as eager PyTorch runs torchtitan's Llama layer; split over t and c."""
    qk_dim, v_dim = model.qk_v_head_dims()
    h, q = model.h, model.a * qk_dim
    kv = (model.kv_heads or model.a) * (qk_dim + v_dim) / 2     # one of K or V
    ffn = model.ffn or 4 * h
    per_token = (2 * RMSNORM_BYTES * h + ROTARY_BYTES * (q + kv)
                 + 2 * (2 * kv + 2 * h) + COPY_BYTES * h + 2 * RESIDUAL_BYTES * h
                 + SWIGLU_BYTES * ffn)
    return per_token * b * model.s / (t * c)


@lru_cache(maxsize=64)      # one value per model; the planner asks for every layout
def op_recompute_share(model):
    """Share of a layer's forward linear FLOPs that torchtitan's "op" policy recomputes: the
    second, fourth and sixth of wq, wk, wv, wo, w1, w3, w2 (wk, wo, w3)."""
    qk_dim, v_dim = model.qk_v_head_dims()
    h, q = model.h, model.a * qk_dim
    kv = (model.kv_heads or model.a) * qk_dim
    ffn = model.ffn or 4 * h
    widths = [q, kv, kv, h, ffn, ffn, ffn]      # output widths, each times h inputs
    return sum(widths[1::2]) / sum(widths)


@lru_cache(maxsize=64)
def norm_up_recompute_share(model):
    """Share of a layer's forward linear FLOPs that DeepSeek-V3's recompute repeats (§3.2.3):
    MLA's up-projections, the query latent to 128 heads of 192 and the key/value latent to
    128 keys and values of 128 (the rotary key comes from h, not recomputed), against every
    linear GEMM of the average layer (``gemm.layer_gemms``); 0 without MLA (the norms and
    SwiGLU's product are elementwise, ``throughput.py`` charges their bytes)."""
    if not model.mla_latents:
        return 0.0
    q_latent, kv_latent, rope = model.mla_latents
    qk_dim, v_dim = model.qk_v_head_dims()
    up = q_latent * model.a * qk_dim + kv_latent * model.a * (qk_dim - rope + v_dim)
    linear = sum(m * n * k * count for m, n, k, count, kind in layer_gemms(model, 1)
                 if kind == "linear") / model.s
    return up / linear
