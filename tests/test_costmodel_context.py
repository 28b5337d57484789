"""The cost model's context parallelism, without processes, against hand-computed numbers:
causal work per rank (contiguous about 2c-1 times unbalanced, zig-zag balanced), the
key/value block and its ring bytes (grouped-query attention makes them a/kv_heads smaller),
whether compute hides the ring, activations divided by c; ``GPT.kv_heads`` checked."""
import pytest

from lessonlib.costmodel import context as cx
from lessonlib.costmodel.memory import activation_bytes_per_layer
from lessonlib.costmodel.model import GPT


def test_causal_pairs_by_hand():
    # s = 8, c = 2, contiguous: chunks of 4; rank 0 scores 4*5/2 = 10, rank 1 16 + 10 = 26
    assert cx.causal_pairs_per_rank(8, 2, "contiguous") == [10, 26]
    # zig-zag: chunks of 2; rank 0 holds 0 and 3: 3 + (3*4 + 3) = 18; rank 1 holds 1, 2: 18
    assert cx.causal_pairs_per_rank(8, 2, "zigzag") == [18, 18]
    assert sum(cx.causal_pairs_per_rank(8, 2, "zigzag")) == 8 * 9 // 2
    assert cx.causal_pairs_per_rank(8, 2, "zigzag", causal=False) == [32, 32]


@pytest.mark.parametrize("c", [2, 4, 8, 16])
def test_contiguous_last_rank_does_2c_minus_1_times_the_first(c):
    work = cx.causal_pairs_per_rank(1024 * c, c, "contiguous")
    assert work[-1] / work[0] == pytest.approx(2 * c - 1, rel=1e-3)
    assert cx.imbalance(1024 * c, c, "zigzag") == 1.0


def test_kv_block_and_ring_bytes_with_grouped_query_attention():
    llama = cx.LLAMA3_405B
    assert (llama.L, llama.h, llama.a, llama.kv_heads, llama.V) == (126, 16384, 128, 8, 128256)
    # K and V of s/c = 8192 tokens, 8 heads of 128, bf16: 2 * 8192 * 8 * 128 * 2 bytes
    assert cx.kv_block_bytes(llama, 1, 16) == 2 * 8192 * 8 * 128 * 2 == 32 * 2**20
    full_heads = GPT(126, 16384, 128, 131072, 128256)
    assert cx.kv_block_bytes(full_heads, 1, 16) == 16 * cx.kv_block_bytes(llama, 1, 16)
    assert cx.ring_bytes_received_per_rank(4, 100) == (300, 700)
    assert cx.ring_bytes_received_per_rank(1, 100) == (0, 0)


def test_ring_hidden_behind_compute_when_shards_are_long():
    llama = cx.LLAMA3_405B
    n = cx.shortest_hidden_shard(llama, 989e12, 450e9)
    assert n == pytest.approx(8 * 2 * 989e12 / (128 * 450e9))
    short = GPT(1, 16384, 128, 16 * 64, 128256, kv_heads=8)      # 64 tokens per rank
    assert not cx.ring_step(short, 1, 16, 989e12, 450e9, layout="contiguous").hidden
    assert cx.ring_step(llama, 1, 16, 989e12, 450e9).hidden


def test_ring_step_per_gpu_and_break_even_share_one_accounting():
    # Llama 3 405B, s = 128K, c = 16, t = 8, one GPU's 400 Gb/s port (50e9 bytes/s)
    llama, peak, port = cx.LLAMA3_405B, 989e12, 50e9
    whole, per_gpu = (cx.ring_step(llama, 1, 16, peak, port, t=t) for t in (1, 8))
    # per GPU: a step's causal average, 4 h (s/c)^2 / 2 FLOPs (plus the diagonal's n/2c), / t
    n = 131072 // 16
    assert per_gpu.compute_s == pytest.approx(4 * 16384 * n * n / 2 / 8 / peak, rel=1e-4)
    assert per_gpu.transfer_s == pytest.approx(2 * n * 8 * 128 * 2 / 8 / port)   # 4 MiB
    assert per_gpu.compute_s == pytest.approx(whole.compute_s / 8)
    assert per_gpu.transfer_s == pytest.approx(whole.transfer_s / 8)
    # the break-even shard: 8 KV heads * 2 bytes * F / (128 heads * B) = 2,472 tokens
    shortest = cx.shortest_hidden_shard(llama, peak, port)
    assert shortest == pytest.approx(8 * 2 * peak / (128 * port)) == pytest.approx(2472.5)
    # ... and it is where ring_step's compute meets its transfer, at t = 1 and 8: a shard
    # 7 % shorter is exposed, 7 % longer hidden (c = 4; s/c even for the zig-zag chunks)
    for t in (1, 8):
        for factor, hidden in ((0.93, False), (1.07, True)):
            n = 2 * round(shortest * factor / 2)
            model = GPT(1, 16384, 128, 4 * n, 128256, kv_heads=8)
            assert cx.ring_step(model, 1, 4, peak, port, t=t).hidden is hidden, (t, n)
    with pytest.raises(ValueError, match="t=3 must divide the K/V heads"):
        cx.ring_step(llama, 1, 16, peak, port, t=3)


def test_activations_divided_by_c():
    model = GPT(32, 4096, 32, 32768, 128256)
    assert cx.activation_bytes_per_rank(model, 1, 8) == pytest.approx(
        activation_bytes_per_layer(model, 1, 1, True, "none") / 8)


def test_attention_flops_per_rank():
    model = GPT(1, 64, 4, 8, 100)
    assert cx.attention_flops_per_rank(model, 2, 2, "contiguous") == [4 * 2 * 64 * 10,
                                                                      4 * 2 * 64 * 26]


@pytest.mark.parametrize("bad", [0, 3, 5, True, 2.0])
def test_kv_heads_must_divide_heads(bad):
    with pytest.raises(ValueError, match="kv_heads=.* must be a positive divisor of heads=4"):
        GPT(1, 64, 4, 8, 100, kv_heads=bad)


def test_bad_settings_one_line():
    with pytest.raises(ValueError, match=r"s=10 must be a multiple of 4 \(zigzag, c=2\)"):
        cx.causal_pairs_per_rank(10, 2)
    with pytest.raises(ValueError, match="layout='ring'"):
        cx.imbalance(8, 2, "ring")


def test_bytes_sent_by_each_method_by_hand():
    # b = 1, s = 16, c = 4 (s/c = 4), 8 query heads of 2, K/V 2 heads, 2 bytes a value
    q = 1 * 8 * 4 * 2 * 2                                 # 128 bytes: q's shard, the output's
    kv = 2 * 1 * 2 * 4 * 2 * 2                            # 64 bytes: K and V's shards
    sent = {m: cx.cp_bytes_sent_per_rank(m, 4, 1, 16, 8, 2, 2) for m in cx.METHODS}
    assert sent["ring"] == (3 * kv, 3 * kv + 4 * kv)
    assert sent["allgather"] == (3 * kv, 3 * kv)
    assert sent["ulysses"] == (3 * (2 * q + kv) // 4,) * 2 == (240, 240)
    assert all(cx.cp_bytes_sent_per_rank(m, 1, 1, 16, 8, 2, 2) == (0, 0) for m in cx.METHODS)
    with pytest.raises(ValueError, match="method='p2p' must be one of ring, allgather, ulysses"):
        cx.cp_bytes_sent_per_rank("p2p", 2, 1, 16, 8, 2, 2)


def test_document_mask_work_per_ring_step():
    # c = 2, contiguous, documents of 3 and 5 tokens: rank 0 holds 0-3, rank 1 holds 4-7
    steps = cx.document_pairs_per_step([3, 5], 2, "contiguous")
    # rank 0: doc 0 (0-2) 6 scores, token 3 (doc 1) 1; rank 1, own block: tokens 4-7 of doc 1
    # score 2+3+4+5 minus the one key (3) in rank 0's block: 10; from rank 0's block: 4
    assert steps == [[7, 0], [10, 4]]
    work = cx.document_work([3, 5], 2, "contiguous")
    assert (work.ring, work.allgather, work.even) == (10 + 4, 14, 10.5)
    assert work.per_rank == [7, 14]
    with pytest.raises(ValueError, match="the documents' 7 tokens must split into 4"):
        cx.document_pairs_per_step([3, 4], 2)
    with pytest.raises(ValueError, match="document length"):
        cx.document_pairs_per_step([3, 0, 5], 2)


def test_ulysses_in_the_estimate_is_limited_by_the_kv_heads():
    from dataclasses import replace

    from lessonlib.costmodel import CLUSTERS, Layout, estimate
    from lessonlib.costmodel.model import MODELS
    m = replace(MODELS["llama3-405B"], s=131072)          # 128 heads, 8 KV heads
    with pytest.raises(ValueError, match="c=16 with cp_comm='ulysses' must divide the heads "
                                         r"of each of the t=8 ranks \(heads=128, kv_heads=8\)"):
        Layout(t=8, c=16, p=16, global_batch=16, cp_comm="ulysses").check(m)
    kw = dict(t=1, c=8, p=16, d=1, global_batch=16, recompute="none")
    times = {k: estimate(m, Layout(cp_comm=k, **kw), CLUSTERS["dgx-h100"]).time["cp_comm"]
             for k in ("ring", "allgather", "ulysses")}
    assert times["ulysses"] > 0 and times["allgather"] > 0
    assert "CP ulysses" in Layout(c=8, m=1, cp_comm="ulysses").describe()
