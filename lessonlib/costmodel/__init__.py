"""A pure cost model of large-model training: memory, time and throughput of a layout.

No torch here, only arithmetic, so a notebook can predict a run before it starts and a test
can check the prediction against published numbers. Notation is Megatron-LM 2021's
(Narayanan et al.): p pipeline stages, t tensor-parallel size, d data-parallel size,
m micro-batches of b sequences, v interleaved chunks; a model has L layers, hidden size h,
a heads, sequence length s, vocabulary V.

The one entry point::

    from lessonlib.costmodel import MODELS, CLUSTERS, Layout, estimate
    est = estimate(MODELS["gpt3-175B"],
                   Layout(t=8, p=12, d=4, b=1, global_batch=1536),
                   CLUSTERS["dgx-a100"])
    est.tflops_per_gpu, est.step_time_s, est.bubble_fraction, est.memory.total
    print(est.summary())

returns an ``Estimate``: per-GPU memory by part (weights, gradients, optimizer state,
activations), the step time split into compute, elementwise, TP comm, PP comm, DP comm and
bubble, and achieved TFLOP/s per GPU counted as Megatron-LM 2021 counts it (Eq. 3).
``plan(model, cluster, n_gpus, global_batch)`` ranks every layout that fits and
``explain()`` says why the best wins; ``table1_report()`` compares the model with
Megatron-LM 2021's Table 1.

Modules, one idea each: ``hardware`` (GPU and cluster presets; collectives across servers),
``model`` (GPT shapes, Eq. 2, and today's: GQA, SwiGLU, untied embeddings, MoE; Llama 3 and
DeepSeek-V3 presets), ``memory``, ``layer_bytes`` (one layer's activation bytes per family, measured
to the byte on ``lessonlib.models.measured``'s layers), ``compute`` (FLOPs and training time; the teams' own FLOP counts), ``gemm``
(a GEMM's time from its shape: roofline, tile quantization, BF16 or FP8; the fused
attention kernel's own rate), ``kernels`` (eager PyTorch's unfused elementwise kernels and
torchtitan's op-level selective checkpointing), ``bubble``,
``comm`` (alpha-beta collectives, groups and servers), ``alpha_beta`` (the same model fitted
to measured all-reduces, and DDP's bucket overlap), ``layout`` (``Layout`` and its checks),
``throughput`` (``estimate``), ``axes`` (what context and expert parallelism and FSDP/HSDP
add to a step, placed by the rank order tp-cp-ep-dp-pp), ``planner``, ``search`` (the planner
over all five axes t, c, p, d, e, explained axis by axis), ``megatron2021``,
``korthikanti2022`` (recompute
and sequence parallelism against that paper's Tables 4 and 5), ``record`` (every published
run the course holds the model to, as data), ``published`` (those runs predicted, and
``published_report()``), ``measured`` (your own measured runs, read from a CSV, against the
model: the error, and the order of each job's layouts), ``overlap`` (what async TP, FSDP
prefetch and DualPipe hide, up to the compute beside them), ``gains`` (what FP8 and each
overlap buy a job, with and without), ``calibration`` (a machine's
measured GEMM rates and all-reduce times refit into a new GPU and cluster), ``context`` (context parallelism: causal work per rank,
the key/value ring, activations / c), ``moe`` (mixture-of-experts shapes: total vs active
parameters, expert-parallel memory, the all-to-all), ``resilience`` (what a straggler costs a
synchronous step; DiLoCo's link between two datacenters), and ``__main__`` (the command line).

Command line: ``python -m lessonlib.costmodel --help`` (examples in ``__main__``), e.g.
``python -m lessonlib.costmodel --model megatron-1T --plan --gpus 1024 --global-batch 2048``.
"""
from .bubble import bubble_fraction, bubble_time, stashed_microbatches
from .comm import (bus_bandwidth, busbw_factor, group_spans_nodes, members_per_node,
                   parameter_server_bytes, parameter_server_time_s, pp_elements_per_boundary,
                   ring_all_gather_time_s, ring_allreduce_bytes_per_rank,
                   ring_allreduce_time_s, ring_reduce_scatter_time_s, tp_elements_per_layer)
from .compute import (SECONDS_PER_DAY, SECONDS_PER_YEAR, megatron_flops_per_iteration,
                      megatron_training_days, megatron_training_time_s,
                      model_flops_per_iteration, rate_for_time, training_flops,
                      training_time_s)
from .hardware import CLUSTERS, GPU, GPUS, Cluster, get_cluster, get_gpu, make_cluster
from .megatron2021 import load_table1, table1_report, table1_rows
from .memory import (BYTES_PER_PARAM, MemoryBreakdown, activation_bytes,
                     activation_bytes_per_layer, in_flight_microbatches, memory_per_gpu,
                     memory_reserves, model_state_bytes, usable_memory_bytes)
from .model import GPT, MODELS, get_model
from .planner import Plan, candidate_layouts, explain, plan, tp_sweep
from .search import explain_axes, plan_job
from .throughput import Estimate, Layout, estimate

__all__ = [
    "bubble_fraction", "bubble_time", "stashed_microbatches",
    "bus_bandwidth", "busbw_factor", "group_spans_nodes", "members_per_node",
    "parameter_server_bytes",
    "parameter_server_time_s", "pp_elements_per_boundary", "ring_all_gather_time_s",
    "ring_allreduce_bytes_per_rank", "ring_allreduce_time_s", "ring_reduce_scatter_time_s",
    "tp_elements_per_layer",
    "SECONDS_PER_DAY", "SECONDS_PER_YEAR", "megatron_flops_per_iteration",
    "megatron_training_days", "megatron_training_time_s", "model_flops_per_iteration",
    "rate_for_time", "training_flops", "training_time_s",
    "CLUSTERS", "GPU", "GPUS", "Cluster", "get_cluster", "get_gpu", "make_cluster",
    "load_table1", "table1_report", "table1_rows",
    "BYTES_PER_PARAM", "MemoryBreakdown", "activation_bytes", "activation_bytes_per_layer",
    "in_flight_microbatches", "memory_per_gpu", "memory_reserves", "model_state_bytes",
    "usable_memory_bytes",
    "GPT", "MODELS", "get_model",
    "Plan", "candidate_layouts", "explain", "plan", "tp_sweep", "explain_axes", "plan_job",
    "Estimate", "Layout", "estimate",
]
