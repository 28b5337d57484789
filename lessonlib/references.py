"""The published figures the lessons quote, each with the source that states it.

What it teaches: a number about a real system is the paper's, not ours, and says where it
is from. A notebook's prose may quote a figure listed here when the same cell names its
source (tests/prose_numbers.py checks it), so a figure edited in the prose alone no longer
matches the list and the suite fails; the list itself is read against the papers.

``QUOTES`` holds the sentences the deep dives quote from a real system, word for word, with
the section or file they are from: tests/test_quotes.py checks that each notebook prints
them as listed (and that a passage those notebooks put in quotation marks is one of them),
and reads the ones from an installed package (torch, torchao) against its file.

Laptop:  ``python -c "from lessonlib.references import PUBLISHED; print(PUBLISHED['gpt3'])"``
GPU box: the same; pure Python.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Source:
    citation: str                  # where the figures are stated
    names: tuple[str, ...]         # how the lessons' prose names it (any one of them)
    figures: dict[float, str]      # each figure and what it is


def _source(citation: str, names: tuple[str, ...], **figures: float) -> Source:
    """A source whose figures are given by keyword (what each is) for readability."""
    return Source(citation, names, {value: what for what, value in figures.items()})


PUBLISHED: dict[str, Source] = {
    "gpt3": _source(
        "Brown et al. 2020, Table 2.1; Megatron-LM 2021 (Narayanan et al., SC21) §1 and Eq. 4; "
        "Korthikanti et al. 2022 §5", ("GPT-3",),
        billion_parameters=175, layers=96, hidden=12288, heads=96, sequence=2048,
        billion_tokens=300, years_on_one_v100=288, days_on_1024_a100=34, a100s=1024,
        tflops_per_a100=140, five_a_s_over_h=80),
    "megatron2019": _source(
        "Shoeybi et al. 2019 (Megatron-LM), §1 and §5.1", ("Megatron-LM 2019",),
        tflops_on_one_v100=39, percent_of_peak=30, tp_scaling_efficiency_percent=77,
        tp_dp_scaling_efficiency_percent=74, gpus=512),
    "megatron2021": _source(
        "Narayanan et al. 2021 (Megatron-LM, SC21): §1, Eq. 4, Table 1, Fig. 13 and its "
        "run_figure_13.sh", ("Megatron-LM 2021", "Megatron-LM's", "Narayanan"),
        days_for_gpt3=34, a100s=1024, tflops_per_gpu=140, fig13_billion_parameters=162.2,
        fig13_hidden=20480, fig13_heads=128, fig13_layers=32, fig13_gpus=64,
        fig13_small_batch=32, fig13_large_batch=128, table1_smallest_hidden=2304,
        table1_largest_pipeline=64, one_t_gpus=3072,
        one_t_layers=128, one_t_hidden=25600, one_t_days=84, one_t_tflops=163),
    "a100": _source(
        "NVIDIA A100 datasheet; DGX A100 (Megatron-LM 2021 §5): 8 x 200 Gb/s HDR InfiniBand",
        ("A100",), peak_tflops=312, memory_gb=80, nvlink_gb_s_each_way=300,
        infiniband_gbit_s=200, infiniband_gbyte_s=25, sms=108),
    "mamf": _source(
        "Bekman, Machine Learning Engineering, \"Maximum Achievable Matmul FLOPS comparison "
        "table\" (BF16 dense, the best of a sweep of GEMM shapes)",
        ("maximum achievable matmul", "MAMF"), a100_tflops=271.2, h100_tflops=794.5,
        h100_fp8_tflops=1402.6),
    "msmf": _source(
        "Bekman, Machine Learning Engineering, compute/accelerator/benchmarks, \"What we "
        "measured: alone vs all-8 concurrent\" (H200 BF16, all 8 GPUs busy, n = 40): MSMF "
        "698.6 and MAMF 823.9 TFLOP/s", ("MSMF", "Bekman"), msmf_tflops=698.6,
        mamf_tflops=823.9),
    "v100": _source("NVIDIA V100 datasheet", ("V100",), peak_tflops=125, nvlink_gb_s=300),
    "h100": _source(
        "NVIDIA H100 SXM5 datasheet (dense, without 2:4 sparsity)", ("H100", "H200"),
        peak_tflops=989, fp8_tflops=1979, memory_gb=80, h200_memory_gb=141,
        nvlink_gb_s=900, infiniband_gbit_s=400, power_w=700),
    "attention-kernels": _source(
        "Shah et al. 2024 (FlashAttention-3, arXiv 2407.08608), Fig. 5: BF16 forward on an "
        "H100 SXM5, head dim 128, causal mask, 8K tokens", ("Shah et al.",),
        fa2_causal_8k_tflops=333, cudnn_causal_8k_tflops=529),
    "overlap-contention": _source(
        "Lee et al. 2025, \"Characterizing Compute-Communication Overlap in GPU-Accelerated "
        "Distributed Deep Learning: Performance and Power Implications\", abstract",
        ("Lee et al.",), average_slowdown_percent=18.9, worst_slowdown_percent=40.0),
    # DeepSeek-V3's report gives no H800 NVLink specification (§3.1 names the GPU only;
    # §3.2.2, on its all-to-all kernels, says NVLink "offers a bandwidth of 160 GB/s"):
    # 400 GB/s is NVIDIA's figure.
    "h800": _source("NVIDIA H800 SXM5 specification: NVLink 400 GB/s; the GPU of DeepSeek-V3 "
                    "(DeepSeek-AI 2024, §3.1)", ("H800",), nvlink_gb_s=400),
    "pytorch_ddp": _source(
        "Li et al., VLDB 2020 (PyTorch Distributed), §3.2 and abstract",
        ("DDP", "Li et al.", "bucket_cap_mb"), default_bucket_mib=25, gpus=256),
    "zero": _source(
        "Rajbhandari et al. 2020 (ZeRO), §7.2.2: stage 3 moves 3Ψ per rank, 1.5x the 2Ψ of "
        "data parallelism's all-reduce (stages 1 and 2 move 2Ψ, §7.2.1)", ("ZeRO",),
        stage3_traffic_over_all_reduce=1.5),
    "korthikanti": _source(
        "Korthikanti et al. 2022 (arXiv 2205.05198), Table 2, Table 4, §5, App. A",
        ("Korthikanti",), bytes_per_sbh=34, attention_term=5, matmul_flops_per_bsh2=24,
        gpt3_five_a_s_over_h=80, selective_saves_percent=70, selective_costs_percent=2.7,
        table4_sp_faster_percent=3,  # Table 4: 19.0 ms with SP against 19.6 without
        table4_billion_parameters=22),
    "llama3": _source(
        "Dubey et al. 2024 (The Llama 3 Herd of Models), Table 3, Table 4 and §3.3.2",
        ("Llama 3",), billion_parameters=405, layers=126, hidden=16384, ffn=53248, heads=128,
        kv_heads=8, vocabulary=128256, gpus=16384, gpus_at_8k=8192, sequences_at_128k=128,
        million_tokens_per_step=16, tflops_8k=430, tflops_8k_16k_gpus=400, tflops_128k=380,
        mfu_8k=43, mfu_8k_16k_gpus=41, mfu_128k=38, tokens_k=128, point_release=3.1),
    "deepseek_v3": _source(
        "DeepSeek-AI 2024 (DeepSeek-V3, arXiv 2412.19437): §2.1, §3.1-3.3, §3.5.1, §4.2, "
        "Table 1",
        ("DeepSeek-V3",), billion_parameters=671, billion_active=37, layers=61, hidden=7168,
        routed_experts=256, chosen_experts=8, gpus=2048, pipeline=16, expert_parallel=64,
        servers=8, nodes_per_token=4, trillion_tokens=14.8, million_gpu_hours=2.664,
        bias_step=0.001, tile=128, nvlink_gb_s=160, infiniband_gb_s=50, nvlink_over_ib=3.2,
        sms_for_communication=20, h800_sms=132),
    "switch": _source("Fedus et al. 2021 (Switch Transformer), §2.2", ("Switch", "alpha"),
                      alpha=0.01),
    # The abstract says 47B and 13B; Table 1 lists the architecture only (46.7 B and 12.9 B
    # are what the course's count of that architecture gives, costmodel/moe.py).
    "mixtral": _source("Jiang et al. 2024 (Mixtral of Experts), abstract and Table 1",
                       ("Mixtral",), experts=8, chosen=2, billion_parameters=47,
                       billion_active=13, hidden=4096),
    "torchtitan": _source(
        "torchtitan benchmarks/llama3_h100_202412_torchtitan.md (its Table 1; the text says "
        "\"33% to 39% MFU\"; 33.7 and 39.0 are the course's, by torchtitan's own FLOP count "
        "per token) and asyncTP_llama3_h100_2025-06_torchtitan.md (its table and commands: "
        "BF16 and Float8 tensorwise, torch.compile, FSDP x TP 8)", ("torchtitan",),
        eager_tokens_per_s=5762, compiled_tokens_per_s=6667, float8_tokens_per_s=8532,
        eager_mfu_by_its_formula=33.7, compiled_mfu_by_its_formula=39.0, mfu_low=33,
        power_limit_w=500, async_tp_70b=1.09,
        async_tp_8b=1.10, float8_over_compiled=1.28, async_tp_70b_gpus=256,
        async_tp_70b_fsdp=32, async_tp_8b_gpus=64, async_tp_tensor_parallel=8,
        async_tp_70b_local_batch=16, async_tp_8b_local_batch=12,
        async_tp_70b_tokens_per_s=597.3, async_tp_70b_async_tokens_per_s=652.4,
        async_tp_8b_tokens_per_s=4378, async_tp_8b_async_tokens_per_s=4809,
        async_tp_70b_float8_tokens_per_s=809.8, async_tp_70b_float8_async_tokens_per_s=942.4,
        async_tp_8b_float8_tokens_per_s=5078.1, async_tp_8b_float8_async_tokens_per_s=5570.1,
        table3_compiled_tokens_per_s=6514, table3_float8_tokens_per_s=8380,
        table4_70b_tokens_per_s=829, table4_70b_async_tokens_per_s=876),
}


@dataclass(frozen=True)
class Quote:
    source: str                    # who says it, and where (section, or file and name)
    text: str                      # word for word, as the notebooks print it
    notebooks: tuple[str, ...]     # the notebooks (their two-digit numbers) that print it
    installed: str = ""            # a module of an installed package whose file holds it


def _quote(source: str, text: str, *notebooks: str, installed: str = "") -> Quote:
    return Quote(source, " ".join(text.split()), notebooks, installed)


LLAMA3 = "Dubey et al. 2024 (The Llama 3 Herd of Models), §3.3.2"
DEEPSEEK_V3 = "DeepSeek-AI 2024 (DeepSeek-V3, arXiv 2412.19437)"

QUOTES: dict[str, Quote] = {
    "llama3_cp_exposed": _quote(
        LLAMA3, "Although the all-gather communication latency is exposed in the critical "
        "path, we still adopt this approach for two main reasons", "12"),
    "llama3_cp_masks": _quote(
        LLAMA3, "it is easier and more flexible to support different types of attention masks "
        "in all-gather based CP attention, such as the document mask", "12"),
    "llama3_cp_gqa": _quote(
        LLAMA3, "the exposed all-gather latency is small as the communicated K and V tensors "
        "are much smaller than Q tensor due to the use of GQA", "12"),
    "torchtitan_cp_default": _quote(
        "torchtitan, torchtitan/config/job_config.py, context_parallel_rotate_method",
        "The default value is 'allgather'.", "12"),
    "torch_cp_default": _quote(
        "PyTorch, torch/distributed/tensor/experimental/_context_parallel/_attention.py, "
        "_ContextParallelOptions", "rotate_method: _RotateMethod = _RotateMethod.ALL_GATHER",
        "12", installed="torch.distributed.tensor.experimental._context_parallel._attention"),
    "torchtitan_parallelize": _quote(
        "torchtitan, torchtitan/models/llama3/infra/parallelize.py, its opening comment",
        "the PT-D parallelisms (except pipeline parallelism)", "15"),
    "torchtitan_mfu": _quote(
        "torchtitan, benchmarks/llama3_h100_202412_torchtitan.md",
        "33% to 39% MFU", "15"),
    "mixtral_megablocks": _quote(
        "Jiang et al. 2024 (Mixtral of Experts), §2.1", "MoE layers can be run efficiently on "
        "single GPUs with high performance specialized kernels", "13"),
    "deepseek_dropless": _quote(
        f"{DEEPSEEK_V3}, §2.1.2", "does not drop any tokens during training", "13"),
    "deepseek_cluster": _quote(
        f"{DEEPSEEK_V3}, §3.1",
        "DeepSeek-V3 is trained on a cluster equipped with 2048 NVIDIA H800 GPUs", "13"),
    "deepseek_two_copies": _quote(
        f"{DEEPSEEK_V3}, §3.2.1", "Although DualPipe requires keeping two copies of the model "
        "parameters, this does not significantly increase the memory consumption since we use "
        "a large EP size during training", "13"),
    "deepseek_serving_ep": _quote(
        f"{DEEPSEEK_V3}, §3.4.1 (serving, not training)", "For the MoE part, we use 32-way "
        "Expert Parallelism (EP32), which ensures that each expert processes a sufficiently "
        "large batch size, thereby enhancing computational efficiency", "13"),
    "deepseek_no_tp": _quote(
        f"{DEEPSEEK_V3}, §3.2", "we meticulously optimize the memory footprint during "
        "training, thereby enabling us to train DeepSeek-V3 without using costly Tensor "
        "Parallelism (TP)", "15"),
    "deepseek_nvlink": _quote(
        f"{DEEPSEEK_V3}, §3.2.2",
        "NVLink offers a bandwidth of 160 GB/s, roughly 3.2 times that of IB (50 GB/s)", "15"),
    "deepseek_20_sms": _quote(
        f"{DEEPSEEK_V3}, §3.5.1", "we allocate 20 out of the 132 SMs available in the H800 "
        "GPU for this purpose", "15"),
    "deepseek_e4m3": _quote(
        f"{DEEPSEEK_V3}, §3.3.2", "we adopt the E4M3 format on all tensors for higher "
        "precision", "16"),
    "deepseek_tiles": _quote(
        f"{DEEPSEEK_V3}, §3.3.2", "(1) for activations, we group and scale elements on a "
        "1x128 tile basis (i.e., per token per 128 channels); and (2) for weights, we group and "
        "scale elements on a 128x128 block basis (i.e., per 128 input channels per 128 output "
        "channels)", "16"),
    "deepseek_high_precision": _quote(
        f"{DEEPSEEK_V3}, §3.3.1", "the embedding module, the output head, MoE gating modules, "
        "normalization operators, and attention operators", "16"),
    "deepseek_dualpipe_general": _quote(
        f"{DEEPSEEK_V3}, §3.2.1", "even in more general scenarios without a heavy "
        "communication burden, DualPipe still exhibits efficiency advantages", "16"),
    "torchao_rowwise_bf16": _quote(
        "torchao 0.18, torchao/float8/float8_ops.py, addmm_float8_unwrapped",
        "work around torch._scaled_mm not having float32 output type", "16",
        installed="torchao.float8.float8_ops"),
    "torchao_one_all_reduce": _quote(
        "torchao 0.18, torchao/float8/fsdp_utils.py, precompute_float8_dynamic_scale_for_fsdp",
        "It performs a single all-reduce to compute the scales for all float8 weights.", "16",
        installed="torchao.float8.fsdp_utils"),
    "dualpipe_cut_in_half": _quote(
        "deepseek-ai/DualPipe, README.md, DualPipeV", "DualPipeV is a concise V-shape schedule "
        "derived from DualPipe using a \"cut-in-half\" procedure, introduced by Sea AI Lab",
        "16"),
}
