"""What is resident on a GPU, counted by hand, and the published memory rows with their errors.

Without processes: the loss's float32 peak split by vocabulary-parallel TP, full recompute
with SP at 1/t, fp32 gradients, ZeRO-3's gathered working set, all-gather CP's K/V, the named
reserves; then ``--published``'s memory rows: Meta's three Table 4 layouts fit as Meta ran
them, DeepSeek-V3's does not (a saving the model misses, reported), and every torchtitan row's
error, with the two outside 15 % named."""
import pytest

from lessonlib.costmodel import CLUSTERS, MODELS, GPUS, layer_bytes
from lessonlib.costmodel.memory import (activation_bytes_per_layer, memory_per_gpu,
                                        memory_reserves, usable_memory_bytes, working_bytes)
from lessonlib.costmodel.published import memory_report, memory_rows

M8 = MODELS["llama3-8B"]


def test_the_loss_peaks_at_12_bytes_per_vocabulary_entry_split_by_tp():
    assert layer_bytes.loss_bytes(8192, 2, 128256) == 12 * 128256 * 8192 * 2
    one, eight = (memory_per_gpu(M8, t=t, b=1, recompute="full") for t in (1, 8))
    assert one.logits == 8 * eight.logits == 12 * M8.V * M8.s


def test_full_recompute_with_sp_keeps_the_input_at_one_over_t():
    full = activation_bytes_per_layer(M8, 1, 8, False, "full")
    assert full == 2 * M8.s * M8.h
    assert activation_bytes_per_layer(M8, 1, 8, True, "full") * 8 == full


def test_fp32_gradients_and_bf16_moments():
    bf16 = memory_per_gpu(M8, b=1, recompute="full")
    fp32 = memory_per_gpu(M8, b=1, recompute="full", grad_bytes=4, optimizer_bytes=8)
    assert fp32.gradients == 2 * bf16.gradients and fp32.optimizer * 12 == bf16.optimizer * 8


def test_zero3_working_set_is_the_gathered_output_layer_and_two_layers():
    layer, head = M8.layer_params(), M8.V * M8.h
    work = working_bytes(M8, recompute="none", zero_stage=3)
    assert work == 2 * (head + 2 * layer) + (2 + 4) * max(head, layer)
    assert working_bytes(M8, recompute="none", zero_stage=2) == 2 * layer
    assert working_bytes(M8, recompute="none", zero_stage=1) == 0


def test_allgather_cp_holds_one_layers_k_and_v_of_the_whole_sequence():
    kv_dim = 8 * 128                                    # 8 KV heads of 128
    ring = working_bytes(M8, recompute="none", c=4, cp_comm="ring")
    gathered = working_bytes(M8, recompute="none", c=4, cp_comm="allgather")
    assert gathered - ring == 4 * M8.s * kv_dim * 2


def test_usable_memory_is_the_reported_memory_less_named_reserves():
    h100 = GPUS["H100-SXM5"]
    assert h100.memory_bytes == 81559 * 2**20
    reserves = memory_reserves(3)
    assert set(reserves) == {"cuda_context", "nccl_buffers", "fragmentation"}
    assert usable_memory_bytes(h100, 3) == h100.memory_bytes - sum(reserves.values())


ROWS = memory_rows()


def test_meta_fits_as_it_ran_deepseek_does_not_and_says_so():
    ran = {r["row"].source: r["estimate"] for r in ROWS if r["row"].gib is None}
    llama = [est for source, est in ran.items() if source.startswith("Llama 3")]
    # Table 4's three rows, its 128K row in both readings; at v = 2, the default for a v no
    # table prints (record.SILENT), the model counts 89 GiB of the 78 usable: a saving the
    # model misses (published.MEMORY_GAP), as for DeepSeek-V3
    assert len(llama) == 4 and all(est.layout.recompute == "none" for est in llama)
    deepseek = next(est for source, est in ran.items() if source.startswith("DeepSeek"))
    assert not deepseek.fits                      # reported as a saving the model misses


def test_torchtitan_rows_printed_with_their_errors():
    titan = [r for r in ROWS if r["row"].gib is not None]
    assert len(titan) == 18                      # Tables 1-6
    outside = sorted(r["row"].source for r in titan if abs(r["error"]) > 0.15)
    # the 70B FSDP x TP rows: the model counts 57 GiB of the 68-72 torchtitan reserved
    assert outside == ["torchtitan Table 4, 70B FSDP 32 x TP 8",
                       "torchtitan Table 4, 70B, async TP"]
    text = memory_report()
    assert "memory row" in text and f"{titan[0]['error']:+.1%}" in text
    assert CLUSTERS["grand-teton-h100-96gb"].gpu.memory_bytes == pytest.approx(96e9)
