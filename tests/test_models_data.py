"""Tiny models and data: deterministic from a seed, rank-agnostic, and they learn."""
import pytest
import torch
from torch import nn

from lessonlib import baseline as train, data, models


def test_gpt_is_deterministic_from_its_seed_and_ignores_the_global_rng():
    torch.manual_seed(123)
    a = models.TinyGPT(seed=7)
    torch.manual_seed(456)
    b = models.TinyGPT(seed=7)
    for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(p, q), name
    assert not torch.equal(a.embed.tok.weight, models.TinyGPT(seed=8).embed.tok.weight)


def test_gpt_parts_in_sequence_are_the_same_function():
    model = models.TinyGPT(models.GPTConfig(layers=3), seed=0)
    idx = torch.randint(0, 64, (2, 32))
    assert len(model.parts()) == 5
    torch.testing.assert_close(nn.Sequential(*model.parts())(idx), model(idx))


def test_gpt_output_shape_and_causality():
    cfg = models.GPTConfig()
    model = models.TinyGPT(cfg)
    idx = torch.randint(0, cfg.vocab, (3, cfg.seq))
    logits = model(idx)
    assert logits.shape == (3, cfg.seq, cfg.vocab)
    changed = idx.clone()
    changed[:, -1] = (changed[:, -1] + 1) % cfg.vocab  # the future must not leak backwards
    torch.testing.assert_close(model(changed)[:, :-1], logits[:, :-1])


@pytest.mark.parametrize("bad", [dict(hidden=65, heads=4), dict(layers=0), dict(vocab=2.5)])
def test_bad_gpt_shapes_are_refused_with_the_setting_named(bad):
    with pytest.raises(ValueError, match="GPTConfig"):
        models.GPTConfig(**bad)


def test_mlp_stack_shapes_and_seed():
    stack = models.mlp_stack(width=8, depth=3, seed=1, out=2)
    assert stack(torch.randn(5, 8)).shape == (5, 2)
    assert models.count_parameters(stack) == 8 * 8 * 2 + 8 * 2 + 8 * 2 + 2


def test_shipped_corpus_is_the_generator_output():
    assert data.load_corpus() == data.generate_corpus()


def test_batches_are_reproducible_and_shards_partition_the_batch():
    tokens, tok = data.corpus_tokens()
    x1, y1 = data.lm_batch(tokens, 4, 16, step=3)
    x2, _ = data.lm_batch(tokens, 4, 16, step=3)
    assert torch.equal(x1, x2) and torch.equal(x1[:, 1:], y1[:, :-1])
    assert tok.decode(tok.encode("the castle.")) == "the castle."
    shards = [data.shard(x1, r, 2) for r in range(2)]
    assert sorted(map(tuple, torch.cat(shards).tolist())) == sorted(map(tuple, x1.tolist()))
    with pytest.raises(ValueError, match="multiple of 3"):
        data.shard(x1, 0, 3)


def test_a_hundred_cpu_steps_visibly_lower_the_loss():
    run = train.train_tiny_gpt(steps=100, batch=8)
    first, last = sum(run.losses[:10]) / 10, sum(run.losses[-10:]) / 10
    assert last < first - 1.0, (first, last)
    assert train.measured_flops(run) > 0


def test_shipped_results_are_read_from_one_place():
    from lessonlib.data import DATA_DIR, stored

    assert (DATA_DIR / "castle_corpus.txt").exists()
    assert stored("dp_cpu_results.json")["allreduce_sweep"]["lab"] == "allreduce"


def test_allreduce_measurements_come_back_as_named_rows():
    from lessonlib.data_parallel.bench import AlgorithmRun, BenchRun, records

    ring = AlgorithmRun(times=[3.0, 1.0, 2.0], max_error=0.0, bytes_sent=768, bytes_received=768)
    one = BenchRun(rank=1, sizes={1024: {"ring": ring}}, info={})
    (row,) = records({4: [one]})
    assert (row.n, row.rank, row.size_bytes, row.algorithm, row.bytes_sent) == (4, 1, 1024,
                                                                              "ring", 768)
    assert row.median_s == 2.0
