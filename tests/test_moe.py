"""The MoE layer on one process: routing, capacity, drops, the auxiliary loss, a tiny MoE GPT.

The layer is checked against a token-by-token reference written from GShard's definition
(each token's k choices in queue order, first choices first; a choice past its expert's
capacity adds nothing), in float64."""
import math

import pytest
import torch

from lessonlib.baseline import corpus_batches
from lessonlib.models import MOE_CONFIG, MoELayer, aux_loss, init_weights_, lm_loss, moe_gpt
from lessonlib.moe import capacity, route


def _layer(E=4, k=2, C=1.0, shared=False, h=8):
    return init_weights_(MoELayer(h, E, top_k=k, capacity_factor=C, ffn_mult=2,
                                  shared_expert=shared), 0).double()


def _x(b=2, s=6, h=8, seed=1):
    return torch.randn(b, s, h, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _reference(layer, x):
    """Token by token: softmax, the k best experts (lower index on ties), queue places."""
    tokens = x.reshape(-1, x.shape[-1])
    T, E, k = tokens.shape[0], layer.n_experts, layer.top_k
    cap = math.ceil(layer.capacity_factor * k * T / E)
    probs = torch.softmax(layer.router(tokens), -1)
    order = [sorted(range(E), key=lambda e: (-probs[t, e].item(), e))[:k] for t in range(T)]
    load, out, dropped = [0] * E, torch.zeros_like(tokens), 0
    for j in range(k):
        for t in range(T):
            e = order[t][j]
            weight = probs[t, e] / (1 if k == 1 else sum(probs[t, c] for c in order[t]))
            if load[e] < cap:
                out[t] += weight * layer.experts[e](tokens[t])
            else:
                dropped += 1
            load[e] += 1
    if layer.shared is not None:
        out = out + layer.shared(tokens)
    return out.view_as(x), dropped


@pytest.mark.parametrize("k,C,shared", [(1, 1.0, False), (2, 1.0, True), (2, 0.5, False),
                                        (2, 2.0, False)])
def test_the_layer_equals_gshards_definition_token_by_token(k, C, shared):
    layer, x = _layer(k=k, C=C, shared=shared), _x()
    want, dropped = _reference(layer, x)
    got = layer(x)
    assert got.shape == x.shape
    torch.testing.assert_close(got, want)
    assert layer.stats["dropped"] == dropped
    assert sum(layer.stats["tokens_per_expert"]) == k * 12 - dropped
    assert max(layer.stats["tokens_per_expert"]) <= capacity(12, 4, k, C)
    if C == 0.5:
        assert dropped > 0


def test_capacity_and_ties_are_deterministic():
    assert capacity(16, 4, 2, 1.25) == 10 and capacity(10, 4, 1, 1.0) == 3
    r = route(torch.zeros(6, 4, dtype=torch.float64), 2, 1.0)   # every expert ties
    assert r.tokens_per_expert.tolist() == [3, 3, 0, 0] and r.capacity == 3
    assert r.routed_per_expert.tolist() == [6, 6, 0, 0]
    assert r.token.tolist() == [0, 1, 2, 0, 1, 2]          # first in the batch, first served


def test_the_auxiliary_loss_is_alpha_when_balanced_and_in_the_graph():
    r = route(torch.zeros(8, 4, dtype=torch.float64), 1, 2.0)
    # all to expert 0: f = (1, 0, 0, 0), P = 1/4 each -> alpha * 4 * 1/4 = alpha
    assert r.aux_loss.item() == pytest.approx(0.01)
    logits = torch.eye(4, dtype=torch.float64).repeat(2, 1) * 5   # 2 tokens per expert
    r = route(logits, 1, 1.0)
    p = torch.softmax(logits, -1).mean(0)
    assert r.aux_loss.item() == pytest.approx(0.01 * 4 * (0.25 * p).sum().item())
    layer, x = _layer(), _x()
    layer(x)
    layer.stats["aux_loss"].backward()
    assert layer.router.weight.grad.abs().sum() > 0


def test_bad_settings_get_one_line():
    for kwargs, words in (({"n_experts": 4, "top_k": 5}, "top_k=5 must be a positive integer at most 4"),
                          ({"n_experts": 4, "capacity_factor": 0}, "capacity_factor=0 must be a finite positive"),
                          ({"n_experts": 0}, "n_experts=0 must be a positive integer")):
        with pytest.raises(ValueError, match=words) as info:
            MoELayer(8, **kwargs)
        assert "\n" not in str(info.value)


def test_a_tiny_moe_gpt_learns_the_corpus():
    torch.manual_seed(0)
    model = moe_gpt(MOE_CONFIG, n_experts=4, top_k=2)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    batches, losses = corpus_batches(MOE_CONFIG, 16, seed=0), []
    for step in range(40):
        x, y = batches(step)
        loss = lm_loss(model(x), y)
        (loss + aux_loss(model)).backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0]
    assert all(len(b.mlp.stats["tokens_per_expert"]) == 4 for b in model.blocks)


def test_a_layer_copies_after_a_forward():
    import copy
    layer = _layer()
    layer(_x())
    twin = copy.deepcopy(layer)
    assert twin.stats == {} and layer.stats["dropped"] >= 0
    torch.testing.assert_close(twin(_x()), layer(_x()))
