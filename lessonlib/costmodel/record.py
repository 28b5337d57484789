"""The published record as data: every run the course quotes, with the layout its team ran.

Each ``PublishedRun`` names its source (paper, table, row), the model, the cluster, the
layout the team ran (schedule, recompute, precision, overlap in ``Layout``), the published
figure and what kind it is:

* ``"tflops"``: TFLOP/s per GPU counted as the team counts it (Megatron-LM 2021 Eq. 3,
  recompute included: hardware FLOPs);
* ``"mfu"``: model FLOPs utilization of the BF16 peak, model FLOPs counted by the team's own
  formula (``compute.team_flops_per_token``);
* ``"tokens"``: tokens per second per GPU, which needs no FLOP count at all;
* ``"ratio"``: tokens/s over another row's (``versus``) or over the same run with one setting
  changed back (``versus_layout``): torch.compile over eager, Float8 over BF16, async TP
  over vanilla TP.

One module per record, the rows of each team in one function, with the readings each
needed in its note; ``published.py`` predicts them and prints the report. Which rows set
constants: none; every row is checked. A GEMM runs under the GPU's measured maximum
achievable matmul rate (``hardware.MAMF``, a published sweep) and the memory-bound passes
are counted (``throughput.ELEMENTWISE_PASSES``). The other terms take their numbers from
their sources, none fitted to a row:
``gemm.ATTENTION_PEAK_FRACTION`` (FlashAttention-2's 35 % of H100 peak, Shah et al. 2024)
and its 2.5x backward (Dao et al. 2022, Alg. 4); ``kernels.py``'s eager bytes and "op"
recompute (torchtitan's code); the SwiGLU/GQA activations (Korthikanti's method); DeepSeek-V3's
20 of 132 SMs (§3.2.2), MLA dims (§2.1.1), MTP (§2.2), FP8 dispatch (§3.3.4), recompute
(§3.2.3, §3.3.4); torchao's tensorwise casts (``gemm.TENSORWISE_CAST_BYTES``, from its code);
async TP's pieces (``overlap.py``); Grand Teton's 96 GB at 2.4 TB/s. Its 500 W limit is
priced by no source ("between SXM and NVL" by its team): the model runs those H100s at the
SXM's measured rate, and torchtitan's rows show what that leaves out.

Memory rows (``memory_runs``): torchtitan's peak GiB per GPU (its Tables 1-6, with their
settings) and the layouts Meta (Llama 3 Table 4) and DeepSeek-V3 ran, which must fit; none
sets a constant, every one is checked (``published.memory_report``).

Run ``python -m lessonlib.costmodel --published``.
"""
from dataclasses import dataclass, replace

from .layout import Layout
from .megatron2021 import load_table1, table1_layout, table1_model
from .model import GPT, MODELS

CHECKED = "checked"


@dataclass(frozen=True)
class PublishedRun:
    """One published training run and its figure; ``flops``: whose FLOP count the figure
    uses ("megatron-eq3", "korthikanti", "palm", "torchtitan"; "" for tokens/s)."""

    source: str
    model: GPT
    cluster: str
    layout: Layout
    metric: str
    published: float
    flops: str = ""
    role: str = CHECKED
    note: str = ""
    also: str = ""     # another FLOP count whose MFU is printed beside (a reading not taken)
    versus: str = ""   # metric "ratio": tokens/s over those of the run of this source,
    versus_layout: Layout = None    # or over the same model and cluster with this layout

    @property
    def n_gpus(self):
        return self.layout.n_gpus


def _megatron_rows():
    return [PublishedRun(f"Megatron-LM 2021 Table 1, {r['params_billion']} B",
                         table1_model(r), "dgx-a100", table1_layout(r), "tflops",
                         r["tflops_per_gpu"], "megatron-eq3", CHECKED,
                         "b and v from the authors' run scripts")
            for r in load_table1()]


# Korthikanti et al. 2022, Table 3 runs and Table 5's iteration time under selective
# recompute + sequence parallelism (s), with its MFU (%): name, L, h, a, p, GPUs, batch,
# micro-batch, v, seconds, MFU. All t = 8, s = 2048, V = 51200.
KORTHIKANTI = [("22B", 48, 6144, 64, 1, 8, 4, 4, 1, 1.10, 41.5),
               ("175B", 96, 12288, 96, 8, 64, 64, 1, 3, 13.75, 51.4),
               ("530B", 105, 20480, 128, 35, 280, 280, 1, 3, 37.83, 56.0),
               ("1T", 128, 25600, 160, 64, 512, 512, 1, 1, 71.49, 56.3)]


def _korthikanti_rows():
    rows = []
    for name, L, h, a, p, gpus, batch, mb, v, seconds, mfu in KORTHIKANTI:
        lay = Layout(t=8, p=p, d=gpus // (8 * p), b=mb, global_batch=batch, v=v,
                     recompute="selective", sequence_parallel=True)
        rows.append(PublishedRun(
            f"Korthikanti 2022 Table 5, {name} selective + SP", GPT(L, h, a, 2048, 51200, name),
            "dgx-a100", lay, "mfu", mfu / 100, "korthikanti",
            note=f"iteration {seconds} s; MFU by App. A's model FLOPs"))
    return rows


# Llama 3 405B (Dubey et al. 2024, Table 4 and §3.3.2): 16M tokens per batch, TP 8, PP 16,
# interleaved with the first and last stage one layer lighter, BF16 MFU of 989 TFLOP/s.
_LLAMA_NOTE = ("v=8: 126 layers + embedding + output layer as 16 stages of 8 one-layer "
               "chunks (the course's reading of §3.3.2; v is not printed); FSDP as Meta ran it "
               "(§3.3.2: optimizer state and gradients sharded, the weights not resharded after "
               "the forward), which holds what ZeRO-2 holds; "
               "the paper states no FLOP count: the course reads its MFU as counting the scores "
               "a causal kernel computes (halved), and prints PaLM's count (not halved) beside")


def _llama_rows():
    base = MODELS["llama3-405B"]
    common = dict(t=8, p=16, b=1, v=8, uneven_stages=True, recompute="none",
                  sequence_parallel=True, zero_stage=2)
    return [
        PublishedRun("Llama 3 Table 4, 8,192 GPUs 8K", base, "dgx-h100",
                     Layout(d=64, global_batch=2048, **common), "mfu", 0.43, "course", also="palm",
                     note="8K tokens 'without activation checkpointing' (§3.3.2); " + _LLAMA_NOTE),
        PublishedRun("Llama 3 Table 4, 16,384 GPUs 8K", base, "dgx-h100",
                     Layout(d=128, global_batch=2048, **common), "mfu", 0.41, "course", also="palm",
                     note=_LLAMA_NOTE),
        PublishedRun("Llama 3 Table 4, 128K", replace(base, s=131072), "dgx-h100",
                     Layout(c=16, d=4, global_batch=128, cp_comm="allgather", **common),
                     "mfu", 0.38, "course", also="palm",
                     note="the row prints DP 4: 8*16*16*4 = 8,192 GPUs, while the text says "
                          "16,384; the course takes the table's own degrees (d=4, 8,192 "
                          "GPUs); per-GPU figures barely move with d=8 (m 32 -> 16). "
                          "All-gather CP (§3.3.2); no recompute, as at 8K: with c=16 each "
                          "GPU holds 8K tokens' activations. " + _LLAMA_NOTE),
    ]


def _torchtitan_rows():
    """Its Table 1 eager, with torch.compile and with Float8: the same run but for one thing
    each, so the ratios check ``kernels.py``'s eager count and the FP8 terms (tensorwise
    casts, the head in BF16); and its async-TP benchmark, each ratio over the same layout
    with async TP off."""
    note = ("benchmarks/llama3_h100_202412_torchtitan.md; 8 H100 of Meta's Grand Teton (96 GB "
            "HBM2e at 2.4 TB/s, 500 W: docs/performance.md; the 500 W limit unpriced, the "
            "SXM's matmul rate taken), FSDP, local batch 2, 8K tokens, "
            "recompute 'op' (torchtitan's default: every second matmul); MFU by torchtitan's "
            "count (6 x non-embedding params + 12Lhs per token, causal not halved)")
    lay = Layout(d=8, b=2, m=1, zero_stage=3, recompute="op", overlap_comm=True)
    m8, teton = MODELS["llama3-8B"], "grand-teton-h100-96gb"
    source, compiled = ("torchtitan Llama 3.1 8B on 8 H100, eager",
                        "torchtitan Llama 3.1 8B, torch.compile / eager")
    async_note = ("benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md, its table and "
                  "commands: BF16, torch.compile, the same Grand Teton H100s; "
                  "--parallelism.enable_async_tensor_parallel against vanilla TP (SP on, as "
                  "torchtitan's TP plan shards the norms' sequence); 8K tokens; ")
    tp70 = Layout(t=8, d=32, b=16, m=1, zero_stage=3, recompute="full",
                  sequence_parallel=True, overlap_comm=True, async_tp=True)
    tp8 = Layout(t=8, d=8, b=12, m=1, zero_stage=3, recompute="op", sequence_parallel=True,
                 overlap_comm=True, async_tp=True)
    return [PublishedRun(source, m8, teton, replace(lay, kernels="eager"), "tokens", 5762,
                         "torchtitan", note="eager, 33.7 % MFU; " + note),
            PublishedRun(compiled, m8, teton, lay, "ratio", 6667 / 5762, "torchtitan",
                         versus=source, note="6,667 tokens/s with torch.compile, which fuses "
                         "the elementwise kernels (39.0 % MFU), over 5,762 eager; " + note),
            PublishedRun("torchtitan Llama 3.1 8B, Float8 / compile", m8, teton,
                         replace(lay, precision="fp8", fp8_scaling="tensorwise"), "ratio",
                         8532 / 6667, "torchtitan", versus=compiled,
                         note="8,532 tokens/s with torch.compile and Float8 over 6,667 with "
                         "compile alone; torchao's Float8Linear with tensorwise scaling on "
                         "every nn.Linear but the output head (torchtitan's float8 converter "
                         "skips 'output'); FSDP's float8 all-gather taken as off (the file "
                         "names no option; torchtitan's default and its 8B config leave it "
                         "off), so the weights travel in BF16; " + note),
            PublishedRun("torchtitan async TP, Llama 3 70B, 256 H100", MODELS["llama3-70B"],
                         teton, tp70, "ratio", 652.4 / 597.3, versus_layout=replace(
                             tp70, async_tp=False),
                         note=async_note + "FSDP 32 x TP 8, local batch 16, full recompute; "
                         "597.3 -> 652.4 tokens/s per GPU"),
            PublishedRun("torchtitan async TP, Llama 3 8B, 64 H100", m8, teton, tp8, "ratio",
                         4809 / 4378, versus_layout=replace(tp8, async_tp=False),
                         note=async_note + "FSDP 8 x TP 8, local batch 12, recompute 'op'; "
                         "4,378 -> 4,809 tokens/s per GPU")]


def _deepseek_row():
    return PublishedRun(
        "DeepSeek-V3 Table 1: 14.8T tokens in 2.664M H800 GPU hours", MODELS["deepseek-v3"],
        "hgx-h800", Layout(p=16, d=128, e=64, b=1, global_batch=15360, schedule="dualpipe",
                           zero_stage=1, recompute="norm-up", precision="fp8", max_nodes=4,
                           comm_sm_share=20 / 132, grad_dtype="fp32", moment_dtype="bf16"),
        "tokens", 14.8e12 / (2.664e6 * 3600), "",
        note="an average over the whole pre-training, not a step; batch 15,360 x 4K (§4.2); "
             "DualPipe, EP 64, ZeRO-1, FP8 linear GEMMs, tokens on at most 4 nodes; RMSNorm, "
             "MLA up-projections (§3.2.3) and SwiGLU's output (§3.3.4) recomputed; FP32 "
             "gradients, BF16 Adam moments, the MoE inputs cached in FP8 and the attention "
             "output in E5M6 (§3.3.4); the FP8 "
             "quantization kernels' traffic (§3.5.2: BF16 read, quantized, FP8 written back, "
             "read again by the MMA; §3.3.4: 128x1 tiles again in the backward) as memory-bound "
             "time (gemm.fp8_quantization_bytes); the output head in BF16 (§3.3.1) on the "
             "rank that also holds the first stage (§3.2.3), which DualPipe's two "
             "directions share: the two nearly cancel. Not modelled: time outside steps "
             "(evaluation, checkpoints, restarts), in the GPU hours, unsized. The batch ramp "
             "(3,072 -> 15,360 over 469B tokens, §4.2) costs 0.2 % here (m 24 -> 120: "
             "DualPipe's bubble, (PP/2 - 1)(F&B + B - 3W), weighs more at small m).")



@dataclass(frozen=True)
class PublishedMemory:
    """One published peak memory per GPU, in GiB, and the layout that reached it; or, with
    ``gib`` None, a layout its team ran, which must therefore fit."""

    source: str
    model: GPT
    cluster: str
    layout: Layout
    gib: float = None
    note: str = ""


_TITAN_MEMORY = ("torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Memory(GiB): the "
                 "caching allocator's peak reserved bytes (its metrics' max_reserved), which "
                 "include fragmentation the model leaves out; ")


def _torchtitan_memory_rows():
    """torchtitan's Tables 1-6 as memory rows, with their settings: FSDP (ZeRO-3 as FSDP2
    runs it), selective AC read as its op-level default, CP all-gather (its default rotate
    method), PP with its default of as many micro-batches as stages."""
    m8, m70, m405 = MODELS["llama3-8B"], MODELS["llama3-70B"], MODELS["llama3-405B"]
    teton = "grand-teton-h100-96gb"
    fsdp8 = Layout(d=8, b=2, m=1, zero_stage=3, recompute="op")
    fsdp128 = replace(fsdp8, d=128, global_batch=256)
    rows = []
    for table, lay, gibs in (("Table 1, 8B on 8 GPUs", fsdp8, (82.4, 77.0, 76.8)),
                             ("Table 3, 8B on 128 GPUs", fsdp128, (67.0, 62.0, 61.8))):
        for what, kernels, precision, gib in zip(("eager", "compile", "compile + Float8"),
                                                 ("eager", "fused", "fused"),
                                                 ("bf16", "bf16", "fp8"), gibs):
            rows.append(PublishedMemory(f"torchtitan {table}, {what}", m8, teton, replace(
                lay, kernels=kernels, precision=precision, fp8_scaling="tensorwise"), gib,
                _TITAN_MEMORY + "local batch 2, selective AC"))
    for c, gib in zip((1, 2, 4, 8), (83.9, 84.2, 84.0, 84.5)):
        rows.append(PublishedMemory(
            f"torchtitan Table 2, 8B FSDP {8 // c} CP {c}, {32 * c}K", replace(m8, s=32768 * c),
            teton, Layout(c=c, d=8 // c, b=1, m=1, zero_stage=3, recompute="full",
                          cp_comm="allgather", precision="fp8", fp8_scaling="tensorwise"),
            gib, _TITAN_MEMORY + "local batch 1, full AC, compile + Float8"))
    tp70 = Layout(t=8, d=32, b=16, m=1, zero_stage=3, recompute="full", sequence_parallel=True,
                  precision="fp8", fp8_scaling="tensorwise", tp_plan="pytorch")
    rows += [PublishedMemory("torchtitan Table 4, 70B FSDP 32 x TP 8", m70, teton, tp70, 71.9,
                             _TITAN_MEMORY + "local batch 16, full AC, compile + Float8"),
             PublishedMemory("torchtitan Table 4, 70B, async TP", m70, teton,
                             replace(tp70, async_tp=True), 67.6, _TITAN_MEMORY)]
    pp = Layout(t=8, p=8, d=8, b=4, m=8, zero_stage=3, recompute="full", sequence_parallel=True,
                precision="fp8", fp8_scaling="tensorwise", async_tp=True, tp_plan="pytorch")
    rows += [PublishedMemory("torchtitan Table 5, 405B 3D, 1F1B", m405, teton, pp, 82.5,
                             _TITAN_MEMORY + "local batch 32 as 8 micro-batches of 4 (its "
                             "default: as many as stages), full AC"),
             PublishedMemory("torchtitan Table 5, 405B 3D, interleaved", m405, teton,
                             replace(pp, v=2, uneven_stages=True), 72.7,
                             _TITAN_MEMORY + "v = 2 and the first and last stage a layer "
                             "lighter read, not printed")]
    for c, gib in zip((1, 2, 4, 8), (75.3, 75.9, 77.1, 84.9)):
        rows.append(PublishedMemory(
            f"torchtitan Table 6, 405B CP {c}, {32 * c}K", replace(m405, s=32768 * c), teton,
            replace(pp, c=c, d=8 // c, b=1, m=8, global_batch=None, cp_comm="allgather"), gib,
            _TITAN_MEMORY + "local batch 8, 1F1B, full AC"))
    return rows


def memory_runs():
    """Every published peak memory the course holds the model to, and the layouts that must
    fit because their teams ran them (Llama 3 Table 4, DeepSeek-V3)."""
    fit = [PublishedMemory(r.source, r.model, r.cluster, r.layout, None, "ran, so it fits")
           for r in _llama_rows() + [_deepseek_row()]]
    return fit + _torchtitan_memory_rows()


def published_runs():
    """Every published run the course holds the cost model to."""
    return (_megatron_rows() + _korthikanti_rows() + _llama_rows() + _torchtitan_rows()
            + [_deepseek_row()])
