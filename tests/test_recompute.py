"""Recomputation in one process: a block's three modes give the same outputs and gradients,
keep the bytes the formula says (float32 and float64), a checkpoint's kept input is counted
by the meter, and a bad mode is refused naming the choices."""
import pytest
import torch

from lessonlib.costmodel.memory import course_layer_activation_bytes
from lessonlib.instruments.activations import checkpoint, saved_bytes
from lessonlib.models import Block, GPTConfig, TinyGPT, init_weights_, set_recompute


def test_a_checkpoint_counts_only_its_input():
    x = torch.randn(4, 8, requires_grad=True)
    with saved_bytes() as meter:
        y = checkpoint(lambda z: (z.sin() * z.cos()).exp(), x)
    assert meter.bytes == x.numel() * 4 and meter.tensors == [((4, 8), torch.float32, 128)]
    y.sum().backward()
    plain = x.detach().clone().requires_grad_()
    (plain.sin() * plain.cos()).exp().sum().backward()
    assert torch.equal(x.grad, plain.grad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_every_mode_is_the_same_layer_and_keeps_what_the_formula_says(dtype):
    b, s, h, a = 2, 12, 24, 3
    cfg = GPTConfig(seq=s, hidden=h, heads=a)
    x = torch.randn(b, s, h, dtype=dtype, generator=torch.Generator().manual_seed(0))
    results = {}
    for mode in ("none", "selective", "full"):
        block = init_weights_(Block(cfg, mode), 0, std=0.02).to(dtype)
        rows = x.clone().requires_grad_()
        with saved_bytes(exclude=block.parameters()) as meter:
            y = block(rows)
        y.pow(2).sum().backward()
        assert meter.bytes == course_layer_activation_bytes(
            b, s, h, a, recompute=mode, element_size=x.element_size()), mode
        results[mode] = (y.detach(), rows.grad, [p.grad for p in block.parameters()])
    for mode in ("selective", "full"):
        for got, want in zip(results[mode][:2], results["none"][:2]):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
        for got, want in zip(results[mode][2], results["none"][2]):
            torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_set_recompute_reaches_every_block_and_a_bad_mode_is_refused():
    model = set_recompute(TinyGPT(GPTConfig(layers=3)), "selective")
    assert [blk.recompute for blk in model.blocks] == ["selective"] * 3
    assert all(blk.attn.recompute_core for blk in model.blocks)
    with pytest.raises(ValueError, match="recompute='some' must be one of none, selective, full"):
        Block(GPTConfig(), "some")
