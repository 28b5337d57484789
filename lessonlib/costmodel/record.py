"""The published record as data: every run the course quotes, with the layout its team ran.

One job: the published rows, each with its source, its table's columns and the layout read
from them; its length is the rows.

Each ``PublishedRun`` names its source (paper, table, row), the model, the cluster, the
layout the team ran (schedule, recompute, precision, overlap in ``Layout``), the table's own
columns for that row (``columns``: GPUs, degrees, batch, tokens, as printed), the published
figure and what kind it is, the kind the team published:

* ``"seconds"``: the step (iteration) time;
* ``"tflops"``: TFLOP/s per GPU counted as the team counts it (``flops``: Megatron-LM 2021
  Eq. 3 with recompute, hardware FLOPs; PaLM's count for Llama 3);
* ``"mfu"``: model FLOPs utilization of the BF16 peak, model FLOPs counted by the team's own
  formula (``compute.team_flops_per_token``);
* ``"tokens"``: tokens per second per GPU, which needs no FLOP count at all.

Every other column a table publishes for the row is kept in ``beside`` and predicted too
(BLOOM's TFLOP/s beside its step; Nemotron-4's MFU beside its step; NeMo's model TFLOP/s
beside its tokens); a row measured against
another (``versus``: torch.compile over eager, Float8 over BF16, async TP over vanilla TP)
prints the ratio of the two beside its absolute figure, never instead.

No readings per row. A row's settings follow its table's columns (``columns``, checked by
tests/test_costmodel_record.py); what a table does not print takes one default for every
row (``SILENT``), never a value chosen for a row. Where a table contradicts itself (Llama 3's
128K row), each reading is a row of its own, naming the column it departs from
(``contradicts``), and both are printed.

Which rows set constants: none; every row is checked. A GEMM runs under the GPU's measured
maximum achievable matmul rate (``hardware.MAMF``, a published sweep) at the share a Hopper
GPU sustains at its power limit (``hardware.SUSTAINED``, measured) and the memory-bound passes
are counted (``throughput.ELEMENTWISE_PASSES``). The other terms take their numbers from
their sources, none fitted to a row:
``gemm.ATTENTION_H100_TFLOPS`` (FlashAttention-2, cuDNN's and FlashAttention-3's fused
attention on H100 by sequence length, Shah et al. 2024, Fig. 5 and 6) and its 2.5x
backward FLOPs (Dao et al. 2022, Alg. 4); the CP that torchtitan runs
(``axes.cp_torchtitan_s``, PyTorch's code); ``kernels.py``'s eager bytes and "op" recompute
(torchtitan's code) and Megatron's cross entropy (``kernels.MEGATRON_LOSS_BYTES``, from
its code); the ranks in Megatron-Core's order (``layout.py``) and each model chunk's
data-parallel exchange under the interleaved schedule (``axes._chunk_hidden``, from its
schedules.py); the data-parallel exchange in the buckets or units each framework cuts it
into, each paying its latency (``axes.exchange_collectives``, from their code); the
SwiGLU/GQA activations (Korthikanti's method); DeepSeek-V3's 20 of
132 SMs (§3.2.2), MLA dims (§2.1.1), MTP (§2.2), FP8 dispatch (§3.3.4), recompute (§3.2.3,
§3.3.4); torchao's tensorwise casts (``gemm.TENSORWISE_CAST_BYTES``, from its code) and
Transformer Engine's (``gemm.TE_INPUT_BYTES``, from its code); PyTorch's copies around a
sequence-parallel collective and the collectives its async-TP pass fuses (``overlap.py``,
from PyTorch's code) and the compute slowed under every hidden transfer (Lee et al. 2025's
average, ``overlap.CONTENTION``); Grand Teton's 96 GB at 2.4 TB/s. Its 500 W
limit, "between SXM and NVL" by its team, is placed between those two datasheets by its
power (``hardware.power_limited_share``): a reading, not a measurement of the part.

Memory rows (``memory_runs``): torchtitan's peak GiB per GPU (its Tables 1-6, with their
settings) and the layouts Meta (Llama 3 Table 4) and DeepSeek-V3 ran, which must fit; none
sets a constant, every one is checked (``published.memory_report``).

Run ``python -m lessonlib.costmodel --published``.
"""
from dataclasses import dataclass, field, replace

from .hardware import get_cluster, make_cluster
from .layout import Layout
from .megatron2021 import load_table1, table1_layout, table1_model
from .model import GPT, MODELS

CHECKED = "checked"

# What a team does not print, the same for every row (never a value per row):
# b = 1 where no micro-batch is printed and no local batch gives it; v = 2 model chunks per
# stage for an interleaved schedule whose chunks are not printed (torchtitan's default at its
# benchmarks' commit, torchtitan/parallelisms/pipelining_utils.py: "Multi-stage schedules
# support more than 2 stages per rank, but this is the default"), raised to the fewest that
# fit where 2 does not (``fewest_chunks_that_fit``: the run happened, so it fit); no
# recompute where none is named (Megatron-LM runs none unless --recompute-granularity is
# given); SP with every t > 1.
SILENT = {"b": 1, "v": 2, "recompute": "none"}


def fewest_chunks_that_fit(model, lay, cluster):
    """``lay`` with SILENT's v, or the fewest chunks per stage above it, up to a layer per
    chunk, that divide the stage's layers and with which the run fits in memory: the rule
    for every interleaved row whose team prints no v (each further chunk buys memory with
    more point-to-point messages, so a team stops where it fits)."""
    from .throughput import estimate        # the record is data; only this rule needs a model
    cluster = get_cluster(cluster) if isinstance(cluster, str) else cluster
    for v in range(SILENT["v"], -(-model.L // lay.p) + 1):     # up to a layer per chunk
        try:
            candidate = replace(lay, v=v)
            if estimate(model, candidate, cluster).fits:
                return candidate
        except ValueError:                  # v does not divide the stage's layers
            continue
    return replace(lay, v=SILENT["v"])

# BLOOM's cluster, Jean Zay (bigscience train/tr11-176B-ml/README.md, Hardware): 8 A100 80GB
# per node "Using NVLink 4 inter-gpu connects, 4 OmniPath links" (Omni-Path: 100 Gb/s each).
JEAN_ZAY = make_cluster("A100-80GB", 8, 100, name="jean-zay-a100", network_ports=4)


@dataclass(frozen=True)
class PublishedRun:
    """One published training run and its figure; ``flops``: whose FLOP count the figure
    uses ("megatron-eq3", "korthikanti", "palm", "torchtitan", "megatron-lm"; "" for
    tokens/s or seconds). ``columns``: the row as its table prints it (``gpus``, ``t``,
    ``c``, ``p``, ``d``, ``e``, ``micro_batch``, ``local_batch``, ``global_batch``
    sequences, ``tokens_per_batch``, ``seq``); ``contradicts``: the columns this reading of
    a self-contradicting table departs from; ``beside``: the row's other published figures,
    ((metric, value, flops), ...)."""

    source: str
    model: GPT
    cluster: object   # a key of hardware.CLUSTERS or a Cluster
    layout: Layout
    metric: str
    published: float
    flops: str = ""
    role: str = CHECKED
    note: str = ""
    versus: str = ""   # the row (source) whose tokens/s this one's are printed over
    columns: dict = field(default_factory=dict)
    contradicts: tuple = ()
    beside: tuple = ()

    @property
    def n_gpus(self):
        return self.layout.n_gpus


def layout_columns(run):
    """The row's settings as its table's columns would print them: GPUs, each degree,
    model chunks per stage, micro-batch, local batch (sequences per data-parallel rank per
    step), global batch and tokens per batch, sequence length."""
    lay = run.layout
    batch = lay.global_batch if lay.global_batch is not None else lay.b * lay.m * lay.d
    return {"gpus": lay.n_gpus, "t": lay.t, "c": lay.c, "p": lay.p, "d": lay.d, "e": lay.e,
            "v": lay.v, "micro_batch": lay.b, "local_batch": batch // lay.d,
            "global_batch": batch, "tokens_per_batch": batch * run.model.s, "seq": run.model.s}


def contradictions(run):
    """{column: (the table's value, the row's)} for every column of the row's table that its
    settings contradict."""
    mine = layout_columns(run)
    return {k: (v, mine[k]) for k, v in run.columns.items() if mine[k] != v}


def _megatron_rows():
    rows = []
    for r in load_table1():
        columns = {"gpus": r["gpus"], "t": r["t"], "p": r["p"], "global_batch": r["batch"],
                   "seq": 2048}
        rows.append(PublishedRun(f"Megatron-LM 2021 Table 1, {r['params_billion']} B",
                                 table1_model(r), "dgx-a100", table1_layout(r), "tflops",
                                 r["tflops_per_gpu"], "megatron-eq3", CHECKED,
                                 "b, v and the DDP (PyTorch's, overlapped, or Megatron's "
                                 "local one) from the authors' run scripts", columns=columns))
    return rows


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
                     recompute="selective", sequence_parallel=True, loss="megatron")
        rows.append(PublishedRun(
            f"Korthikanti 2022 Table 5, {name} selective + SP", GPT(L, h, a, 2048, 51200, name),
            "dgx-a100", lay, "seconds", seconds, "korthikanti",
            note="iteration time of Table 5; MFU by App. A's model FLOPs beside",
            columns={"gpus": gpus, "t": 8, "p": p, "global_batch": batch, "seq": 2048,
                     "micro_batch": mb},
            beside=(("mfu", mfu / 100, "korthikanti"),)))
    return rows


def _bloom_row():
    """BLOOM-176B at iteration 85,376 (bigscience train/tr11-176B-ml/README.md): its log line
    and its replica setup."""
    bloom = GPT(70, 14336, 112, 2048, 250880, "bloom-176B")
    lay = Layout(t=4, p=12, d=8, b=2, global_batch=2048, zero_stage=1, recompute="full",
                 grad_dtype="fp32", reduce_dtype="fp32", loss="megatron",
                 zero_reduce="all-reduce")
    return PublishedRun(
        "BLOOM-176B, 384 A100, iteration 85,376", bloom, JEAN_ZAY, lay, "seconds", 104.70,
        "megatron-eq3",
        note="'elapsed time per iteration (s): 104.70 ... global batch size: 2048 ... TFLOPs: "
             "149.77' (the log at the end of the first epoch); 'TP=4 PP=12 DP=8 MBS=2', "
             "SEQ_LEN=2048, ZeRO-1 in DeepSpeed's BF16 optimizer, which accumulates the "
             "gradients in fp32 and reduces those (bf16_optimizer.py: 'hp_grad.data.add_("
             "lp.grad.data.to(hp_grad.dtype)', get_grads_for_reduction returns "
             "self.fp32_groups_gradients_flat; the engine all-reduces them whole, "
             "buffered_allreduce_fallback: zero_reduce='all-reduce'), "
             "activation checkpointing "
             "('it's the hardware TFLOPs that we calculate - using the 4*2 co-efficient', "
             "Megatron-LM 2021 Eq. 3: 149.76 from the step); 70 layers, h 14336, 112 heads, "
             "the 250,680-token vocabulary padded to 250,880 (a multiple of 128 x TP), "
             "GeLU MLP, tied embeddings (ALiBi: no position table, counted here as s x h)",
        columns={"gpus": 384, "t": 4, "p": 12, "d": 8, "micro_batch": 2, "global_batch": 2048,
                 "seq": 2048},
        beside=(("tflops", 149.77, "megatron-eq3"),))


# Nemotron-4 15B (arXiv 2402.16819, Table 2 and §2): 8-way TP and data parallelism with a
# distributed optimizer on DGX H100; DP, batch (sequences of 4,096), iteration s, MFU %.
NEMOTRON = [(96, 384, 0.57, 34.3), (192, 768, 0.58, 33.3), (288, 1152, 0.64, 30.5)]


def _nemotron_rows():
    rows = []
    for d, batch, seconds, mfu in NEMOTRON:
        lay = Layout(t=8, d=d, b=SILENT["b"], global_batch=batch, zero_stage=1,
                     recompute=SILENT["recompute"], sequence_parallel=True,
                     attention_kernel="cudnn", reduce_dtype="fp32", loss="megatron")
        rows.append(PublishedRun(
            f"Nemotron-4 15B Table 2, DP {d}", MODELS["nemotron-4-15B"], "dgx-h100", lay,
            "seconds", seconds, "megatron-lm",
            note="8-way TP and data parallelism, 'a distributed optimizer to shard the "
                 "optimizer state over the data-parallel replicas' (§2): ZeRO-1; micro-batch "
                 "and recompute not printed: the course's defaults for every row (SILENT); "
                 "MFU by Megatron-LM's count (megatron/training/training.py, "
                 "num_floating_point_operations), which gives 34.1 / 33.6 / 30.4 % from the "
                 "table's own times; attention by cuDNN, as Megatron-LM runs it on H100 "
                 "(--transformer-impl defaults to transformer_engine, which selects cuDNN's "
                 "fused attention on sm90); gradients reduced in fp32, as Megatron-LM does "
                 "under bf16 (arguments.py: 'bfloat16 requires gradient accumulation and "
                 "all-reduce to be done in fp32')",
            columns={"gpus": 8 * d, "t": 8, "d": d, "global_batch": batch,
                     "tokens_per_batch": batch * 4096, "seq": 4096},
            beside=(("mfu", mfu / 100, "megatron-lm"),)))
    return rows


# Megatron-Core r0.8.0's weak scaling on H100 (NVIDIA/Megatron-LM README, "Training Speed
# and Scalability", images/model_table.png, commit f2e5db4, July 2024): GPT models with a
# 131,072-token vocabulary and 4,096-token sequences. Size, heads, hidden, layers, TP, PP,
# DP, GPUs, batch, per-GPU TFLOP/s, MFU %. Added after the time terms were set, held out.
MCORE_WEAK = [("1.7B", 16, 2048, 24, 1, 1, 48, 48, 192, 408.8, 41),
              ("7.1B", 32, 4096, 30, 2, 1, 48, 96, 192, 465.9, 47),
              ("16B", 48, 6144, 32, 4, 1, 48, 192, 192, 489.1, 49),
              ("32B", 56, 7168, 48, 8, 1, 48, 384, 192, 459.6, 46),
              ("70B", 64, 8192, 84, 8, 2, 48, 768, 384, 419.7, 42),
              ("119B", 80, 10240, 92, 8, 4, 48, 1536, 768, 420.5, 43),
              ("177B", 96, 12288, 96, 8, 6, 48, 2304, 1152, 432.8, 44),
              ("314B", 128, 16384, 96, 8, 8, 48, 3072, 1536, 474.4, 48),
              ("462B", 144, 18432, 112, 8, 16, 48, 6144, 3072, 459.9, 47)]
_MCORE_NOTE = (
    "Megatron-LM README (core r0.8.0, H100): 'fine-grained overlapping of data-parallel "
    "(--overlap-grad-reduce --overlap-param-gather), tensor-parallel (--tp-comm-overlap) and "
    "pipeline-parallel communication (enabled by default)'; --overlap-param-gather needs the "
    "distributed optimizer (ZeRO-1) and --tp-comm-overlap sequence parallelism (arguments.py); "
    "Megatron-LM's defaults for what the README does not print: GeLU MLP of 4h (no "
    "--swiglu), every head its own K/V, attention in cuDNN through Transformer Engine, "
    "gradients reduced in fp32, the unfused loss; embeddings untied, as the sizes count "
    "(177B: 12 L h^2 + 2 V h); pipelines interleaved, since the README overlaps their "
    "communication and Megatron-LM does so only with virtual stages (arguments.py turns "
    "overlap_p2p_comm off without them); v not printed: the rule for every interleaved row "
    "(fewest_chunks_that_fit), which must divide a stage's layers (23 for 119B, 7 for "
    "462B); micro-batch and recompute not printed: SILENT; per-GPU TFLOP/s by "
    "Megatron-LM's count, MFU beside")


def _mcore_rows():
    rows = []
    for size, a, h, L, t, p, d, gpus, batch, tflops, mfu in MCORE_WEAK:
        model = GPT(L, h, a, 4096, 131072, f"mcore-gpt-{size}", ffn=4 * h,
                    tied_embeddings=False, mlp="gelu")
        lay = Layout(t=t, p=p, d=d, b=SILENT["b"], global_batch=batch, zero_stage=1,
                     recompute=SILENT["recompute"], sequence_parallel=t > 1,
                     async_tp=t > 1, overlap_comm=True, attention_kernel="cudnn",
                     reduce_dtype="fp32", loss="megatron")
        if p > 1:
            lay = fewest_chunks_that_fit(model, replace(lay, v=SILENT["v"], overlap_p2p=True),
                                         "dgx-h100")
        rows.append(PublishedRun(
            f"Megatron-Core weak scaling, GPT {size}", model, "dgx-h100", lay, "tflops",
            tflops, "megatron-lm", note=_MCORE_NOTE,
            columns={"gpus": gpus, "t": t, "p": p, "d": d, "global_batch": batch,
                     "seq": 4096},
            beside=(("mfu", mfu / 100, "megatron-lm"),)))
    # Its strong scaling (images/strong_scaling.png and the text): the 177B model from 96 to
    # 4,608 H100s at 1,152 sequences throughout, 'a reduction in MFU from 47% to 42%'. The
    # figure prints no layout: TP 8 x PP 6 as the table's 177B row, the same model and batch
    # (its 2,304-GPU point), a reading; held out.
    model, lay = next((r.model, r.layout) for r in rows if r.source.endswith(" 177B"))
    for gpus, mfu in ((96, 47), (4608, 42)):
        d = gpus // (lay.t * lay.p)
        rows.append(PublishedRun(
            f"Megatron-Core strong scaling, GPT 177B on {gpus}", model, "dgx-h100",
            replace(lay, d=d, m=1152 // d), "mfu", mfu / 100, "megatron-lm",
            note=_MCORE_NOTE + "; TP 8 x PP 6 read from the table's 177B row",
            columns={"gpus": gpus, "global_batch": 1152, "seq": 4096}))
    return rows


# NeMo's published pre-training benchmarks (NVIDIA/NeMo docs/source/performance/
# performance_summary.md, container 24.07, DGX-H100, FP8, as first published: 4c73f77,
# August 2024; the file's two later revisions, "vboost numbers" the first, moved each of
# these rows by 2 % at most): model, GPUs, GBS, MBS, sequence, TP, PP, CP, VP, tokens/s per
# GPU, model TFLOP/s per GPU. The Llama 3 rows were met first; the Llama 2 and Nemotron rows
# of the same table were added after the time terms were set, held out. The Nemotron rows'
# misses then led to two corrections read in code (a squared-ReLU MLP's GEMMs,
# ``gemm.layer_gemms``; a pipeline send under SP, ``throughput``), so those rows are no
# longer a clean held-out test; the Llama rows are. Its GPT-3 rows are ``NEMO_2407_GPT3``.
NEMO_2407 = [("llama3-8B", 8, 128, 1, 8192, 1, 1, 2, 1, 12036, 697),
             ("llama3-70B", 64, 128, 1, 8192, 4, 4, 2, 5, 1533, 738),
             ("llama2-7B", 8, 128, 1, 4096, 1, 1, 1, 1, 16847, 776),
             ("llama2-13B", 16, 128, 1, 4096, 1, 4, 1, 10, 8646, 754),
             ("llama2-70B", 64, 128, 1, 4096, 4, 4, 1, 20, 1707, 759),
             ("nemotron-3-8B", 64, 256, 4, 4096, 2, 1, 1, 1, 12701, 653),
             ("nemotron-3-22B", 64, 256, 2, 4096, 2, 4, 1, 10, 4256, 554),
             ("nemotron-4-340B", 128, 32, 1, 4096, 8, 8, 1, 12, 322, 678)]
# What the table does not print, from the release's own launcher config of each model
# (NeMo-Framework-Launcher 24.07, conf/training/llama/llama{2,3}_*.yaml and nemotron/
# nemotron_*.yaml): every one sets 'overlap_grad_sync' and 'overlap_param_sync' true and
# names distributed fused Adam (ZeRO-1); these differ. 'ub_tp_comm_overlap' (TP's transfers
# under its GEMMs, as Megatron-Core splits them) and 'overlap_p2p_comm' (the interleaved
# pipeline's sends under other chunks' compute): set by each file. The 340B's file also
# sets selective recompute, 'grad_sync_dtype: bf16' and 'dtype: bf16' (the optimizer's
# state); the others name no recompute and no grad_sync_dtype, so fp32, which NeMo's
# communication-overlap guide calls "the default precision". Its file is laid out PP 12 x
# VP 8, where the table prints PP 8 x VP 12: the table's columns are taken, the file's other
# settings with them, a reading. Where a file sets 'cross_entropy_loss_fusion: true' the loss
# is Megatron's fused one; elsewhere Megatron-Core's default, unfused.
NEMO_2407_CONFIG = {
    "llama3-8B": dict(async_tp=False, overlap_p2p=False, loss="megatron-fused"),
    "llama3-70B": dict(async_tp=True, overlap_p2p=True, loss="megatron-fused"),
    "llama2-7B": dict(async_tp=False, overlap_p2p=False),
    "llama2-13B": dict(async_tp=False, overlap_p2p=True),
    "llama2-70B": dict(async_tp=True, overlap_p2p=True),
    "nemotron-3-8B": dict(async_tp=True, overlap_p2p=False, loss="megatron-fused"),
    "nemotron-3-22B": dict(async_tp=True, overlap_p2p=True, loss="megatron-fused"),
    "nemotron-4-340B": dict(async_tp=False, overlap_p2p=False, recompute="selective",
                            reduce_dtype="bf16", moment_dtype="bf16")}
# The same table's GPT-3 rows, added after every time term was set, held out (predicted
# before they were added: +2.3, -2.6, +4.0, -8.1 %). The models of NeMo's own GPT-3 recipes
# (NeMo-Framework-Launcher 24.07, conf/training/gpt3/5b.yaml, 20b.yaml, 175b.yaml): L, h,
# heads, a GeLU MLP of 4h, the GPT-2 BPE vocabulary of 50,257 padded to a multiple of 128 x
# TP ('make_vocab_size_divisible_by: 128'), 2,048 tokens, embeddings tied (NeMo's default),
# attention fused by Transformer Engine. Size, L, h, heads, GPUs, GBS, MBS, TP, PP, VP,
# tokens/s per GPU, model TFLOP/s per GPU; then 'ub_tp_comm_overlap' and 'overlap_p2p_comm'
# as each file sets them. The 512-GPU row links its TFLOP/s to MLPerf Training. Not
# modelled: the files' dropout of 0.1 ('hidden_dropout', 'attention_dropout').
NEMO_2407_GPT3 = [("5B", 24, 4096, 32, 64, 2048, 4, 1, 1, 1, 23406, 765, False, False),
                  ("20B", 44, 6144, 48, 64, 256, 2, 2, 1, 1, 5851, 750, True, False),
                  ("175B", 96, 12288, 96, 128, 256, 1, 4, 8, 6, 716, 771, False, True),
                  ("175B", 96, 12288, 96, 512, 2048, 2, 4, 8, 6, 825, 888, False, True)]
GPT2_VOCAB = 50257
_NEMO_NOTE = ("Megatron-Core under NeMo: Transformer Engine's layers, so attention in cuDNN "
              "on H100 (--transformer-impl transformer_engine, which selects FusedAttention "
              "on sm90) and FP8 by TE's default recipe, delayed scaling (fp8_scaling='te'); "
              "context parallelism as Megatron-Core runs it, the ring (p2p); SP with t > 1; "
              "the optimizer, the overlaps, the recompute and the reduce dtype the "
              "release's own launcher config of the model sets (NEMO_2407_CONFIG); model "
              "TFLOP/s by Megatron-LM's count, which NeMo's uses")


def _nemo_layout(t, **settings):
    """A layout as NeMo runs Megatron-Core (``_NEMO_NOTE``): the distributed optimizer with
    its exchange overlapped, SP with t > 1, Transformer Engine's cuDNN attention and, in FP8,
    its delayed scaling; ``settings`` the rest of the row's."""
    return Layout(t=t, zero_stage=1, sequence_parallel=t > 1, fp8_scaling="te",
                  attention_kernel="cudnn", overlap_comm=True, **settings)


def _nemo_rows():
    rows = []
    for name, gpus, batch, mbs, seq, t, p, c, v, tokens, tflops in NEMO_2407:
        d = gpus // (t * p * c)
        settings = {"recompute": SILENT["recompute"], "reduce_dtype": "fp32",
                    "loss": "megatron", **NEMO_2407_CONFIG[name]}
        lay = _nemo_layout(t, p=p, c=c, d=d, v=v, b=mbs, global_batch=batch, precision="fp8",
                           **settings)
        model = MODELS[name]
        family, size = name.rsplit("-", 1)
        rows.append(PublishedRun(
            f"NeMo 24.07 DGX-H100, {_NEMO_NAMES[family]} {size} FP8", model, "dgx-h100",
            lay, "tokens", tokens, "", note=_NEMO_NOTE,
            columns={"gpus": gpus, "t": t, "p": p, "c": c, "v": v, "micro_batch": mbs,
                     "global_batch": batch, "seq": seq},
            beside=(("tflops", tflops, "megatron-lm"),)))
    for size, L, h, a, gpus, batch, mbs, t, p, v, tokens, tflops, tp_overlap, p2p_overlap \
            in NEMO_2407_GPT3:
        vocab = -(-GPT2_VOCAB // (128 * t)) * 128 * t
        model = GPT(L, h, a, 2048, vocab, f"nemo-gpt3-{size}", ffn=4 * h, mlp="gelu")
        lay = _nemo_layout(t, p=p, d=gpus // (t * p), v=v, b=mbs, global_batch=batch,
                           precision="fp8", recompute=SILENT["recompute"], reduce_dtype="fp32",
                           loss="megatron", async_tp=tp_overlap, overlap_p2p=p2p_overlap)
        rows.append(PublishedRun(
            f"NeMo 24.07 DGX-H100, GPT-3 {size} FP8 on {gpus}", model, "dgx-h100", lay,
            "tokens", tokens, "", note=_NEMO_NOTE + "; the GPT-3 rows: NEMO_2407_GPT3",
            columns={"gpus": gpus, "t": t, "p": p, "v": v, "micro_batch": mbs,
                     "global_batch": batch, "seq": 2048},
            beside=(("tflops", tflops, "megatron-lm"),)))
    return rows


# NeMo's long-sequence table (NVIDIA/NeMo docs/source/performance/
# performance_long_sequence.md, "LLAMA2-7B (FP8) - H100", container 24.03.01, DGX-H100; the
# batch column as its 2025 revisions print it, a2c4cc8, the figures unchanged since their
# first, cd3a808, October 2024): the "With CP" columns, sequence K tokens, GPUs, batch, TP,
# PP, DP, CP, model TFLOP/s per GPU. Its "Without CP" column prints no layout and is left
# out. What the table does not print is the release's launcher config of the model
# (NeMo-Framework-Launcher 24.03.01, conf/training/llama/llama2_7b.yaml): micro-batch 1, no
# recompute ('activations_checkpoint_granularity: null'), distributed fused Adam with
# 'overlap_grad_sync' and 'overlap_param_sync', no TP overlap, no virtual pipeline. Added
# after every time term was set, held out: predicted before it was added.
NEMO_2403_LONG = [(4, 4, 1024, 1, 1, 4, 1, 768), (8, 8, 512, 1, 2, 4, 1, 730),
                  (16, 16, 256, 2, 1, 8, 1, 660), (32, 32, 128, 2, 1, 8, 2, 610),
                  (64, 64, 64, 4, 1, 8, 2, 574), (128, 128, 32, 4, 1, 8, 4, 555),
                  (256, 256, 16, 4, 1, 8, 8, 549), (512, 512, 8, 8, 1, 4, 16, 549),
                  (1024, 1024, 4, 8, 1, 4, 32, 536)]


def _nemo_long_rows():
    rows = []
    for k, gpus, batch, t, p, d, c, tflops in NEMO_2403_LONG:
        lay = _nemo_layout(t, p=p, c=c, d=d, b=1, global_batch=batch, precision="fp8",
                           recompute="none", reduce_dtype="fp32", loss="megatron")
        rows.append(PublishedRun(
            f"NeMo 24.03 long sequence, Llama 2 7B FP8, {k}K", replace(
                MODELS["llama2-7B"], s=1024 * k), "dgx-h100", lay, "tflops", tflops,
            "megatron-lm", note=_NEMO_NOTE.replace("NEMO_2407_CONFIG", "NEMO_2403_LONG"),
            columns={"gpus": gpus, "t": t, "p": p, "d": d, "c": c, "global_batch": batch,
                     "seq": 1024 * k}))
    return rows


_NEMO_NAMES = {"llama3": "Llama 3", "llama2": "Llama 2", "nemotron-3": "Nemotron-3",
               "nemotron-4": "Nemotron-4"}


# Llama 3 405B (Dubey et al. 2024, Table 4 and §3.3.2): 16M tokens per batch, TP 8, PP 16,
# interleaved with the first and last stage one layer lighter; TFLOP/s per GPU and BF16 MFU.
_LLAMA_NOTE = ("v not printed (Figure 6 illustrates 2): the rule for every interleaved row, "
               "v = 2 or the fewest chunks that fit (SILENT; 126 layers + embedding + output "
               "as 16 stages of 8 layers); FSDP "
               "as Meta ran it (§3.3.2: optimizer state and gradients sharded, the weights not "
               "resharded after the forward), which holds what ZeRO-2 holds; TFLOP/s per GPU "
               "and MFU (430 / 989 = 43 %: one count) by PaLM's count (Chowdhery et al. 2022, "
               "App. B: 6N + 12LHQT per token, every score counted; torchtitan, Meta's "
               "PyTorch trainer, counts the same), the course's causal-halved count beside")
_LLAMA_128K = ("All-gather CP (§3.3.2); no recompute named: the default for every row "
               "(SILENT), as at 8K. The table's columns contradict each other: 16,384 GPUs, "
               "while TP 8 x CP 16 x PP 16 x DP 4 = 8,192; both readings are rows. ")


def _llama_rows():
    base = MODELS["llama3-405B"]
    common = dict(t=8, p=16, b=SILENT["b"], v=SILENT["v"], uneven_stages=True,
                  recompute=SILENT["recompute"], sequence_parallel=True, zero_stage=2)
    tokens = 16 * 2**20
    long = replace(base, s=131072)

    def row(source, model, lay, tflops, mfu, columns, note, contradicts=()):
        return PublishedRun(source, model, "dgx-h100", lay, "tflops", tflops, "palm",
                            note=note + _LLAMA_NOTE, columns=columns,
                            contradicts=contradicts, beside=(("mfu", mfu, "palm"),))

    cols8k = {"t": 8, "c": 1, "p": 16, "tokens_per_batch": tokens, "seq": 8192}
    cols128k = {"gpus": 16384, "t": 8, "c": 16, "p": 16, "d": 4, "tokens_per_batch": tokens,
                "seq": 131072}
    def fit(model, lay):
        return fewest_chunks_that_fit(model, lay, "dgx-h100")

    return [
        row("Llama 3 Table 4, 8,192 GPUs 8K", base,
            fit(base, Layout(d=64, global_batch=2048, **common)),
            430, 0.43, dict(cols8k, gpus=8192, d=64),
            "8K tokens 'without activation checkpointing' (§3.3.2); "),
        row("Llama 3 Table 4, 16,384 GPUs 8K", base,
            fit(base, Layout(d=128, global_batch=2048, **common)),
            400, 0.41, dict(cols8k, gpus=16384, d=128), ""),
        row("Llama 3 Table 4, 128K", long,
            fit(long, Layout(c=16, d=4, global_batch=128, cp_comm="allgather", **common)),
            380, 0.38, cols128k, "Reading 1, the table's degrees (DP 4, 8,192 GPUs). " + _LLAMA_128K,
            contradicts=("gpus",)),
        row("Llama 3 Table 4, 128K, 16,384 GPUs", long,
            fit(long, Layout(c=16, d=8, global_batch=128, cp_comm="allgather", **common)),
            380, 0.38, cols128k, "Reading 2, the table's GPUs (DP 8). " + _LLAMA_128K,
            contradicts=("d",)),
    ]


_TITAN = ("torchtitan benchmarks/llama3_h100_202412_torchtitan.md, TPS/GPU; Grand Teton H100s "
          "(96 GB HBM2e at 2.4 TB/s, the default 500 W power limit); ")
_ASYNC = ("torchtitan benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md, its table and "
          "commands: torch.compile, the same Grand Teton H100s; "
          "--parallelism.enable_async_tensor_parallel against vanilla TP (SP on, as "
          "torchtitan's TP plan shards the norms' sequence); 8K tokens; ")


# A benchmark met after the model's time terms were set, so a held-out check of them: Llama
# 3.1 8B under FSDP on 4 and 8 hosts of 8 H200s (400 Gb/s per GPU), June 2025 (torchtitan
# benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md, first published as
# llama3_8b_h200_2025-06_torchtitan.md, by the Trainy team): GPUs, TPS/GPU and
# Memory(GiB) at the 100th step. Its time rows came in at +0.5 and +2.2 % as the model
# stood. Its memory rows did not (+36 %): they led to the compiled loss (``Layout.loss``),
# read in torchtitan's code of that date and the kernels inductor generates, not fitted.
H200_2506 = [(32, 10938, 47.96), (64, 10753, 46.97)]
_H200 = ("torchtitan benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md (Trainy, June "
         "2025), its command: llama3_8b.toml (FSDP over every GPU, 8,192 tokens, selective AC "
         "'op'), local batch 2, --training.compile (the loss compiled too: torchtitan "
         "e7c0cae's build_cross_entropy_loss), Float8 (torchao, tensorwise); "
         "--float8.enable_fsdp_float8_all_gather not modelled: the weights' gathers counted "
         "in BF16, hidden under compute either way, and the gathered layer's 1-byte copy "
         "(about 0.2 GB less) not counted; ")


def _h200_layout(gpus):
    return Layout(d=gpus, b=2, m=1, zero_stage=3, recompute="op", overlap_comm=True,
                  reduce_dtype="fp32", precision="fp8", fp8_scaling="tensorwise",
                  loss="compiled")


def _h200_rows():
    return [PublishedRun(f"torchtitan H200 benchmark, 8B FSDP on {gpus}, compile + Float8",
                         MODELS["llama3-8B"], "dgx-h200", _h200_layout(gpus), "tokens", tps,
                         "torchtitan", note=_H200 + "TPS/GPU",
                         columns={"gpus": gpus, "d": gpus, "local_batch": 2,
                                  "global_batch": 2 * gpus, "seq": 8192})
            for gpus, tps, _ in H200_2506]


# Met after the model's terms were set too, and held out the same way: torchtitan's first
# published figures (docs/performance.md, April 2024), Llama 3 under FSDP on 64 A100 80GB:
# model, AC, tokens/s per GPU ("WPS") and MFU by torchtitan's count of then (every
# parameter, the embedding too: ``compute.team_flops_per_token``, "torchtitan-2024-04").
A100_2404 = [("8B", "op", 2973, 0.582), ("70B", "full", 331, 0.517)]
_A100 = ("torchtitan docs/performance.md (April 2024): 'Llama 3 models with FSDP2 on 64 A100 "
         "(80GB) GPUs', local batch 1 (the file), 8,192 tokens (its llama3 tomls), no "
         "torch.compile "
         "(the tomls' compile = false, so eager kernels), FSDP2 reducing in fp32 "
         "(MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)), "
         "its prefetch; the servers' network not printed: a DGX A100's taken, FSDP's traffic "
         "hidden under compute either way; ")


def _a100_rows():
    return [PublishedRun(f"torchtitan April 2024, {size} FSDP on 64 A100, {ac} AC",
                         MODELS[f"llama3-{size}"], "dgx-a100",
                         Layout(d=64, b=1, m=1, zero_stage=3, recompute=ac, overlap_comm=True,
                                kernels="eager", reduce_dtype="fp32"),
                         "tokens", tps, "torchtitan-2024-04", note=_A100 + "WPS per GPU",
                         columns={"gpus": 64, "d": 64, "local_batch": 1, "global_batch": 64,
                                  "seq": 8192},
                         beside=(("mfu", mfu, "torchtitan-2024-04"),))
            for size, ac, tps, mfu in A100_2404]



# NVIDIA's DGX Cloud benchmarking recipes (NVIDIA/dgxc-benchmarking, release 24.11.1): step
# times on H100 servers in BF16 and in FP8, each workload run by its own config, every
# setting the table does not print read from that file. Met after the model's time terms
# were set, held out (but for the two corrections the NeMo Nemotron rows led to, which these
# rows' Nemotron-4 figures confirmed); of each table the fewest and the most GPUs. Its Llama
# 3.1 405B recipe is not here: it runs a proxy (a GPT-2 tokenizer, 16 query groups) the
# model's presets lack. Model, file, (t, p, c, v, micro-batch), {precision: {GPUs: (global
# batch, seconds)}}.
DGXC_2411 = [
    ("llama3-8B", "llama3.1/README_8b.md", (1, 1, 2, 1, 1),
     {"bf16": {8: (128, 12.91), 128: (2048, 13.10)},
      "fp8": {8: (128, 9.67), 128: (2048, 9.82)}}),
    ("llama3-70B", "llama3.1/README_70b.md", (4, 4, 2, 5, 1),
     {"bf16": {64: (128, 14.72), 2048: (4096, 14.98)},
      "fp8": {64: (128, 11.01), 2048: (4096, 11.39)}}),
    ("nemotron-4-15B", "nemotron/README_15b.md", (4, 1, 1, 1, 4),
     {"bf16": {16: (64, 2.83), 2048: (8192, 2.96)},
      "fp8": {16: (64, 2.08), 2048: (8192, 2.18)}}),
    ("nemotron-4-340B", "nemotron/README_340b.md", (8, 8, 1, 12, 1),
     {"bf16": {128: (32, 4.61), 2048: (512, 4.84)},
      "fp8": {128: (32, 3.16), 2048: (512, 3.49)}})]
# What each config sets that the tables do not print (llama3.1/llama3.1_8b.yaml,
# llama3.1_70b.yaml, nemotron/nemotron4-15b-synth.yaml, nemotron4-340b-synth.yaml): all four
# name distributed fused Adam (ZeRO-1), 'overlap_grad_sync' and 'overlap_param_sync' true and
# 'grad_sync_dtype: bf16' and 'cross_entropy_loss_fusion: true' (Megatron's fused loss);
# 'ub_tp_comm_overlap' and 'overlap_p2p_comm' as below; the 340B
# selective recompute and its optimizer state in bf16 ('dtype: bf16'), the others none.
DGXC_2411_CONFIG = {
    "llama3-8B": dict(async_tp=False, overlap_p2p=False),
    "llama3-70B": dict(async_tp=True, overlap_p2p=True),
    "nemotron-4-15B": dict(async_tp=True, overlap_p2p=False),
    "nemotron-4-340B": dict(async_tp=False, overlap_p2p=False, recompute="selective",
                            moment_dtype="bf16")}
_DGXC_NOTE = ("NVIDIA/dgxc-benchmarking 24.11.1, the workload's README (training step time) "
              "and config: Megatron-Core under NeMo, Transformer Engine's layers (attention "
              "in cuDNN), FP8 by TE's delayed scaling where the run is FP8 (launch.sh: "
              "'model.fp8', 'model.fp8_hybrid'), the settings DGXC_2411_CONFIG reads from "
              "the config. Not modelled: the FP8 runs keep FP8 weights ('fp8_params')")


# Its release 25.04 (tag v25.04.02, llama3.1/README.md and nemotron/README.md), met after
# every time term above was set, held out (predicted before they were added: -0.5 to +10.4 %
# for Llama, then -7.1 to +0.1 % for Nemotron-4 15B): Llama 3.1 8B, 70B and, no longer a
# proxy, 405B (126 layers, its own tokenizer), and Nemotron-4 15B, each table's fewest and
# most GPUs; the 70B runs another layout in FP8 than in BF16. Its Nemotron-4 340B is not
# here: its README prints no VP where the release's recommended config
# (scripts/performance/recommended_model_configs/model_configs_h100.csv) sets 12. NeMo at the
# commit its setup.sh pins (d2b2155, NVIDIA/NeMo), whose performance recipes
# (recipes/llama3_8b.py, llama3_70b.py, llama31_405b.py, nemotron4_15b.py,
# pretrain_performance_optimizations) set: the distributed optimizer with the exchange
# overlapped, gradients reduced in bf16 ('grad_reduce_in_fp32 = False'), Megatron's fused
# loss ('cross_entropy_loss_fusion'), 'tp_comm_overlap' for 70B, 405B and 15B, not 8B; the
# pipeline's sends overlapped where v > 1 (MegatronCommOverlapCallback); the 405B's first
# and last stages a layer lighter ('account_for_embedding_in_pipeline_split', '..._loss_...');
# FP8 by TE's delayed scaling ('bf16_with_fp8_mixed': fp8 'hybrid', 'fp8_params' true, not
# modelled); no recompute.
DGXC_2504 = [
    ("llama3-8B", (1, 1, 2, 1, 1),
     {"bf16": {8: (128, 12.27), 128: (2048, 12.33)},
      "fp8": {8: (128, 9.33), 128: (2048, 9.54)}}),
    ("llama3-70B", (4, 4, 2, 5, 1), {"bf16": {64: (128, 14.66), 2048: (4096, 14.66)}}),
    ("llama3-70B", (4, 8, 1, 5, 1), {"fp8": {64: (128, 9.86), 2048: (4096, 10.15)}}),
    ("llama3-405B", (8, 8, 2, 8, 1),
     {"bf16": {512: (256, 19.78), 2048: (1024, 19.87)},
      "fp8": {512: (256, 12.37), 2048: (1024, 12.56)}}),
    ("nemotron-4-15B", (2, 1, 1, 1, 2),
     {"bf16": {16: (64, 2.66), 2048: (8192, 2.78)},
      "fp8": {16: (64, 1.98), 2048: (8192, 2.09)}})]
DGXC_2504_CONFIG = {
    "llama3-8B": dict(async_tp=False, overlap_p2p=False),
    "llama3-70B": dict(async_tp=True, overlap_p2p=True),
    "llama3-405B": dict(async_tp=True, overlap_p2p=True, uneven_stages=True),
    "nemotron-4-15B": dict(async_tp=True, overlap_p2p=False)}
_DGXC_2504_NOTE = ("NVIDIA/dgxc-benchmarking 25.04.02, llama3.1/ and nemotron/README.md "
                   "(training step time), run by NeMo's performance recipes at the commit "
                   "its setup.sh pins: the settings DGXC_2504 and DGXC_2504_CONFIG read "
                   "from them")


def _dgxc_rows():
    releases = (("24.11", [(name, shape, tables) for name, _, shape, tables in DGXC_2411],
                 DGXC_2411_CONFIG, {name: f"{_DGXC_NOTE}; {readme}"
                                    for name, readme, _, _ in DGXC_2411}),
                ("25.04", DGXC_2504, DGXC_2504_CONFIG,
                 {name: _DGXC_2504_NOTE for name in DGXC_2504_CONFIG}))
    rows = []
    for release, table, config, notes in releases:
        for name, shape, tables in table:
            rows += _dgxc_table_rows(release, name, shape, tables, config[name], notes[name])
    return rows


def _dgxc_table_rows(release, name, shape, tables, config, note):
    t, p, c, v, mbs = shape
    model, rows = MODELS[name], []
    settings = {"recompute": SILENT["recompute"], **config}
    for precision, columns in tables.items():
        for gpus, (batch, seconds) in columns.items():
            lay = _nemo_layout(t, p=p, c=c, d=gpus // (t * p * c), v=v, b=mbs,
                               global_batch=batch, precision=precision, reduce_dtype="bf16",
                               loss="megatron-fused", **settings)
            rows.append(PublishedRun(
                f"NVIDIA DGXC {release}, {_DGXC_NAMES[name]} {precision.upper()} on {gpus}",
                model, "dgx-h100", lay, "seconds", seconds, "", note=note,
                columns={"gpus": gpus, "t": t, "p": p, "c": c, "v": v, "micro_batch": mbs,
                         "global_batch": batch, "seq": model.s}))
    return rows


_DGXC_NAMES = {"llama3-8B": "Llama 3.1 8B", "llama3-70B": "Llama 3.1 70B",
               "llama3-405B": "Llama 3.1 405B",
               "nemotron-4-15B": "Nemotron-4 15B", "nemotron-4-340B": "Nemotron-4 340B"}

_FLOAT8 = ("torch.compile and torchao's Float8Linear with tensorwise scaling on every nn.Linear "
           "but the output head (torchtitan's float8 converter skips 'output'); FSDP's float8 "
           "all-gather taken as off (the file names no option; torchtitan's default and its "
           "8B config leave it off), so the weights travel in BF16")


def _titan(source, model, lay, tokens, columns, note, versus=""):
    return PublishedRun(source, model, "grand-teton-h100-96gb", lay, "tokens", tokens,
                        "torchtitan", note=note, versus=versus, columns=columns)


def _torchtitan_rows():
    """torchtitan's benchmark tables in absolute tokens/s per GPU, each with its settings: FSDP
    (ZeRO-3 with prefetch; its gradients reduce-scattered in fp32, torchtitan's
    --training.mixed_precision_reduce, whose only choice is "float32"), its default
    selective AC read as per-op ('op'), compile as fused kernels, Float8 as torchao's
    tensorwise scaling on every nn.Linear but the output head, all-gather CP as PyTorch's
    ``context_parallel`` runs it (its default rotate method: ``cp_comm="torchtitan"``), PP
    with as many micro-batches as stages (its default); and the async-TP benchmark; TP as
    PyTorch's plan runs it (``tp_plan="pytorch"``: batch-first activations, the gathered
    input kept). A run measured against another prints the ratio beside."""
    m8, m70, m405 = MODELS["llama3-8B"], MODELS["llama3-70B"], MODELS["llama3-405B"]
    rows = []
    for table, gpus, tps in (("Table 1", 8, (5762, 6667, 8532)),
                             ("Table 3", 128, (5605, 6514, 8380))):
        lay = Layout(d=gpus, b=2, m=1, zero_stage=3, recompute="op", overlap_comm=True,
                     reduce_dtype="fp32")
        names = [f"torchtitan {table}, 8B FSDP on {gpus}, {what}"
                 for what in ("eager", "compile", "compile + Float8")]
        variants = (replace(lay, kernels="eager"), lay,
                    replace(lay, precision="fp8", fp8_scaling="tensorwise"))
        cols = {"gpus": gpus, "d": gpus, "local_batch": 2, "global_batch": 2 * gpus,
                "seq": 8192}
        notes = ("eager: every elementwise kernel its own pass", "torch.compile fuses the "
                 "elementwise kernels", _FLOAT8)
        for i, (name, variant, tokens) in enumerate(zip(names, variants, tps)):
            rows.append(_titan(name, m8, variant, tokens, cols, _TITAN + notes[i] + "; local "
                               "batch 2, selective AC", names[i - 1] if i else ""))
    for c, tokens in zip((1, 2, 4, 8), (3890, 2540, 1071, 548)):
        lay = Layout(c=c, d=8 // c, b=1, m=1, zero_stage=3, recompute="full",
                     cp_comm="torchtitan", precision="fp8", fp8_scaling="tensorwise",
                     overlap_comm=True, reduce_dtype="fp32")
        rows.append(_titan(f"torchtitan Table 2, 8B FSDP {8 // c} CP {c}, {32 * c}K",
                           replace(m8, s=32768 * c), lay, tokens,
                           {"gpus": 8, "c": c, "d": 8 // c, "local_batch": 1,
                            "seq": 32768 * c},
                           _TITAN + "compile + Float8, local batch 1, full AC"))
    tp70 = Layout(t=8, d=32, b=16, m=1, zero_stage=3, recompute="full", sequence_parallel=True,
                  precision="fp8", fp8_scaling="tensorwise", overlap_comm=True,
                  tp_plan="pytorch", reduce_dtype="fp32")
    cols = {"gpus": 256, "t": 8, "d": 32, "local_batch": 16, "global_batch": 512, "seq": 8192}
    rows += [_titan("torchtitan Table 4, 70B 2D", m70, tp70, 829, cols,
                    _TITAN + "FSDP 32 x TP 8, compile + Float8, full AC"),
             _titan("torchtitan Table 4, 70B 2D + async TP", m70, replace(tp70, async_tp=True),
                    876, cols, _TITAN + "the same with async TP", "torchtitan Table 4, 70B 2D")]
    pp = Layout(t=8, p=8, d=8, b=4, m=8, zero_stage=3, recompute="full", sequence_parallel=True,
                precision="fp8", fp8_scaling="tensorwise", async_tp=True, overlap_comm=True,
                tp_plan="pytorch", reduce_dtype="fp32")
    cols = {"gpus": 512, "t": 8, "p": 8, "d": 8, "local_batch": 32, "global_batch": 256,
            "seq": 8192}
    rows += [_titan("torchtitan Table 5, 405B 3D, 1F1B", m405, pp, 100, cols,
                    _TITAN + "compile + Float8 + async TP, local batch 32 as 8 micro-batches "
                    "of 4 (its default: as many as stages), full AC"),
             _titan("torchtitan Table 5, 405B 3D, interleaved", m405,
                    replace(pp, v=SILENT["v"], uneven_stages=True), 128, cols,
                    _TITAN + "interleaved 1F1B: v = 2, its default (SILENT), the first and "
                    "last stage a layer lighter, as its split puts them",
                    "torchtitan Table 5, 405B 3D, 1F1B")]
    for c, tokens in zip((1, 2, 4, 8), (76, 47, 31, 16)):
        rows.append(_titan(f"torchtitan Table 6, 405B CP {c}, {32 * c}K",
                           replace(m405, s=32768 * c),
                           replace(pp, c=c, d=8 // c, b=1, m=8, global_batch=None,
                                   cp_comm="torchtitan"), tokens,
                           {"gpus": 512, "t": 8, "p": 8, "c": c, "d": 8 // c,
                            "local_batch": 8, "seq": 32768 * c},
                           _TITAN + "4D, compile + Float8 + async TP + 1F1B, local batch 8 "
                           "as 8 micro-batches of 1, full AC"))
    a70 = replace(tp70, precision="bf16", async_tp=False)
    a8 = Layout(t=8, d=8, b=12, m=1, zero_stage=3, recompute="op", sequence_parallel=True,
                overlap_comm=True, tp_plan="pytorch", reduce_dtype="fp32")
    c70 = {"gpus": 256, "t": 8, "d": 32, "local_batch": 16, "seq": 8192}
    c8 = {"gpus": 64, "t": 8, "d": 8, "local_batch": 12, "seq": 8192}
    # Its float8 tensorwise rows were added after the time terms were set, held out; its
    # float8 rowwise rows are not here: the course has no rowwise scaling, and the file
    # notes that their vanilla baseline is low for a reason being fixed (torchtitan 1207).
    for precision, (v70, s70, v8, s8) in (("bf16", (597.3, 652.4, 4378, 4809)),
                                          ("fp8", (809.8, 942.4, 5078.1, 5570.1))):
        fp8 = dict(precision="fp8", fp8_scaling="tensorwise") if precision == "fp8" else {}
        what = " Float8" if fp8 else ""
        note = _ASYNC + (_FLOAT8 if fp8 else "BF16") + "; "
        vanilla70, vanilla8 = (f"torchtitan async-TP, 70B on 256,{what} vanilla TP",
                               f"torchtitan async-TP, 8B on 64,{what} vanilla TP")
        rows += [_titan(vanilla70, m70, replace(a70, **fp8), v70, c70,
                        note + "FSDP 32 x TP 8, local batch 16, full AC"),
                 _titan(f"torchtitan async-TP, 70B on 256,{what} async TP", m70,
                        replace(a70, async_tp=True, **fp8), s70, c70, note + "the same, async",
                        vanilla70),
                 _titan(vanilla8, m8, replace(a8, **fp8), v8, c8,
                        note + "FSDP 8 x TP 8, local batch 12, recompute 'op'"),
                 _titan(f"torchtitan async-TP, 8B on 64,{what} async TP", m8,
                        replace(a8, async_tp=True, **fp8), s8, c8, note + "the same, async",
                        vanilla8)]
    return rows


def _deepseek_row():
    return PublishedRun(
        "DeepSeek-V3 Table 1: 14.8T tokens in 2.664M H800 GPU hours", MODELS["deepseek-v3"],
        "hgx-h800", Layout(p=16, d=128, e=64, b=1, global_batch=15360, schedule="dualpipe",
                           zero_stage=1, recompute="norm-up", precision="fp8", max_nodes=4,
                           comm_sm_share=20 / 132, grad_dtype="fp32", moment_dtype="bf16"),
        "tokens", 14.8e12 / (2.664e6 * 3600), "",
        columns={"gpus": 2048, "p": 16, "e": 64, "global_batch": 15360, "seq": 4096},
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
    method, ``cp_comm="torchtitan"``), PP with its default of as many micro-batches as stages."""
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
                          cp_comm="torchtitan", precision="fp8", fp8_scaling="tensorwise"),
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
            replace(pp, c=c, d=8 // c, b=1, m=8, global_batch=None, cp_comm="torchtitan"), gib,
            _TITAN_MEMORY + "local batch 8, 1F1B, full AC"))
    return rows


def memory_runs():
    """Every published peak memory the course holds the model to, and the layouts that must
    fit because their teams ran them (Llama 3 Table 4, DeepSeek-V3)."""
    fit = [PublishedMemory(r.source, r.model, r.cluster, r.layout, None, "ran, so it fits")
           for r in _llama_rows() + [_deepseek_row()]]
    held_out = [PublishedMemory(f"torchtitan H200 benchmark, 8B FSDP on {gpus}",
                                MODELS["llama3-8B"], "dgx-h200", _h200_layout(gpus), gib,
                                _H200 + "Memory(GiB), the allocator's peak reserved bytes")
                for gpus, _, gib in H200_2506]
    return fit + _torchtitan_memory_rows() + held_out


def published_runs():
    """Every published run the course holds the cost model to."""
    return (_megatron_rows() + _korthikanti_rows() + [_bloom_row()] + _nemotron_rows()
            + _llama_rows() + _torchtitan_rows() + _nemo_rows() + _nemo_long_rows()
            + [_deepseek_row()] + _h200_rows() + _a100_rows() + _dgxc_rows() + _mcore_rows())
