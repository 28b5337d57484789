"""The saved-tensor meter counts each storage once and leaves the weights out. One process."""
import torch
from torch import nn

from lessonlib.instruments.activations import ActivationMeter, checkpoint, saved_bytes


def test_a_linear_layer_keeps_its_input_and_not_its_weight():
    layer = nn.Linear(8, 4).double()
    x = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
    with saved_bytes(exclude=layer.parameters()) as meter:
        layer(x).sum()
    assert meter.bytes == x.numel() * 8


def test_views_of_one_storage_are_counted_once():
    x = torch.randn(4, 6, requires_grad=True)
    with saved_bytes() as meter:
        a, b = x.chunk(2, dim=1)
        (a * b).sum()        # saves both halves: two views of x's one storage
    assert meter.bytes == x.numel() * 4
    assert len(meter.tensors) == 1



def test_one_rule_for_views_micro_batches_and_a_fused_projection():
    batch = torch.randn(4, 6, requires_grad=True)
    with saved_bytes() as meter:
        halves = [half * half for half in batch.chunk(2)]     # each micro-batch its own rows
        assert meter.bytes == batch.numel() * 4 // 2 * 2
        twice = (batch[:2] * batch[:2].t().t()).sum()         # one view seen twice: once
    assert meter.bytes == batch.numel() * 4 and len(halves) == 2 and twice.requires_grad
    qkv = torch.randn(2, 5, 3 * 4, requires_grad=True)
    with saved_bytes() as meter:
        q, k, v = qkv.split(4, dim=-1)                        # strided views of one storage
        out = (q * k).sum() + (q * v).sum()
    assert meter.bytes == qkv.numel() * 4 and len(meter.tensors) == 1 and out.requires_grad
    wide = torch.randn(2, 9, requires_grad=True)
    with saved_bytes() as meter:
        (wide[:, :4] ** 2).sum()                              # a column slice: its own bytes
    assert meter.bytes == 2 * 4 * 4


def test_live_bytes_follow_the_backward_and_a_checkpoint_lets_its_input_go():
    x = torch.randn(4, 8, requires_grad=True)
    meter = ActivationMeter()
    with meter.forward():
        first = checkpoint(lambda z: z.sin().exp(), x)        # keeps x only
    with meter.forward():
        second = (x[:2] ** 2).sum()                           # rows of x, already kept
    assert (meter.live_groups, meter.live_bytes, meter.bytes) == (2, 128, 128)
    first.sum().backward()
    assert (meter.live_groups, meter.live_bytes) == (1, 64)
    second.backward()
    assert (meter.live_groups, meter.live_bytes, meter.bytes) == (0, 0, 128)
    assert (meter.peak_groups, meter.peak_bytes) == (2, 128)
