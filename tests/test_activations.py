"""The saved-tensor meter counts each storage once and leaves the weights out. One process."""
import torch
from torch import nn

from lessonlib.instruments.activations import saved_bytes


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
