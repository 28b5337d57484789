"""The MoE layer on one process: routing, capacity, drops, the auxiliary loss, a tiny MoE GPT.

The layer is checked against a token-by-token reference written from GShard's definition
(each token's k choices in queue order, first choices first; a choice past its expert's
capacity adds nothing) and DeepSeek-V3's (§2.1.2: sigmoid affinities, the weights of the k
chosen renormalised; a bias that moves the choice only; a token's experts from its M best
nodes, a node scored by the sum of its ceil(k/M) best scores; no capacity), in float64."""
import math

import pytest
import torch

from lessonlib.baseline import corpus_batches
from lessonlib.models import MOE_CONFIG, init_weights_, lm_loss, moe_gpt
from lessonlib.models.moe import MoELayer, aux_loss, update_biases
from lessonlib.models.moe_routing import capacity, route
from lessonlib.models.moe_routing import bias_update


def _layer(E=4, k=2, C=1.0, shared=False, h=8, **routing):
    return init_weights_(MoELayer(h, E, top_k=k, capacity_factor=C, ffn_mult=2,
                                  shared_expert=shared, **routing), 0).double()


def _x(b=2, s=6, h=8, seed=1):
    return torch.randn(b, s, h, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _choices(layer, scores, bias):
    """Each token's k experts, from the definitions: the k best of s + b (lower index on
    ties), among the experts of its M best nodes when the layer limits them."""
    E, k, M, n = layer.n_experts, layer.top_k, layer.max_nodes, layer.experts_per_node
    order = []
    for row in scores.tolist():
        choose = [row[e] + bias[e] for e in range(E)]
        allowed = list(range(E))
        if M is not None:
            node_score = [sum(sorted(choose[j * n:(j + 1) * n], reverse=True)[:-(-k // M)])
                          for j in range(E // n)]
            nodes = sorted(range(E // n), key=lambda j: (-node_score[j], j))[:M]
            allowed = [e for e in allowed if e // n in nodes]
        order.append(sorted(allowed, key=lambda e: (-choose[e], e))[:k])
    return order


def _reference(layer, x):
    """Token by token: affinities, the k chosen experts, their weights, queue places."""
    tokens = x.reshape(-1, x.shape[-1])
    T, E, k = tokens.shape[0], layer.n_experts, layer.top_k
    C = layer.capacity_factor
    cap = math.inf if C is None else math.ceil(C * k * T / E)
    logits = layer.router(tokens)
    probs = torch.softmax(logits, -1) if layer.gate == "softmax" else torch.sigmoid(logits)
    bias = [0.0] * E if layer.expert_bias is None else layer.expert_bias.tolist()
    order = _choices(layer, probs, bias)
    renormalise = k > 1 or layer.gate == "sigmoid"
    load, out, dropped = [0] * E, torch.zeros_like(tokens), 0
    for j in range(k):
        for t in range(T):
            e = order[t][j]
            weight = probs[t, e] / (sum(probs[t, c] for c in order[t]) if renormalise else 1)
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


RECIPES = {  # DeepSeek-V3's options, alone and together, against the definition
    "softmax-bias": dict(balance="bias"),
    "sigmoid-bias": dict(gate="sigmoid", balance="bias", C=None),
    "sigmoid-k1": dict(gate="sigmoid", balance="none", k=1),
    "sigmoid-nodes": dict(gate="sigmoid", balance="bias", E=8, max_nodes=1, experts_per_node=2),
    "softmax-nodes-dropless": dict(E=8, k=3, C=None, max_nodes=2, experts_per_node=2),
}
SKEW = torch.tensor([0.3, -0.2, 0.1, -0.3, 0.2, 0.0, -0.1, 0.25], dtype=torch.float64)


def _recipe_layer(name, bias=SKEW):
    recipe = dict(RECIPES[name])
    layer = _layer(**recipe)
    if layer.expert_bias is not None:
        layer.expert_bias.copy_(bias[:layer.n_experts])
    return layer


@pytest.mark.parametrize("name", list(RECIPES))
def test_the_layer_equals_the_definition_token_by_token(name):
    layer, x = _recipe_layer(name), _x()
    want, dropped = _reference(layer, x)
    torch.testing.assert_close(layer(x), want)
    assert layer.stats["dropped"] == dropped
    if layer.capacity_factor is None:
        assert dropped == 0 and layer.stats["capacity"] is None
        assert layer.stats["tokens_per_expert"] == layer.stats["routed_per_expert"]
    tokens = x.reshape(-1, 8)
    if layer.max_nodes is not None:     # every token's experts on at most M nodes
        r = route(layer.router(tokens), layer.top_k, None, **layer.routing_options())
        expert = torch.arange(layer.n_experts).repeat_interleave(r.tokens_per_expert)
        nodes = {}
        for token, e in zip(r.token.tolist(), expert.tolist()):
            nodes.setdefault(token, set()).add(e // layer.experts_per_node)
        assert max(len(n) for n in nodes.values()) <= layer.max_nodes
    if layer.expert_bias is not None:   # the bias changed some choices (so the test sees it)
        logits = layer.router(tokens)
        probs = torch.sigmoid(logits) if layer.gate == "sigmoid" else torch.softmax(logits, -1)
        assert _choices(layer, probs, [0.0] * 8) != _choices(layer, probs, SKEW.tolist())


@pytest.mark.parametrize("name", ["softmax-bias", "sigmoid-nodes"])
def test_a_bias_shared_by_all_experts_changes_nothing(name):
    """The bias only chooses: a constant added to every expert's bias chooses the same k,
    so the output is the same to the last bit."""
    x = _x()
    base = _recipe_layer(name, bias=torch.zeros(8, dtype=torch.float64))(x)
    shifted = _recipe_layer(name, bias=torch.full((8,), 0.25, dtype=torch.float64))(x)
    assert torch.equal(base, shifted)


@pytest.mark.parametrize("gate", ["softmax", "sigmoid"])
def test_the_bias_update_evens_a_skewed_load(gate):
    """DeepSeek-V3's update: up by gamma below the mean load, down above, still if equal.
    On a router that favours two experts, 50 updates bring the busiest expert's load toward
    the mean: the last 10 steps' busiest / mean is well below the first's."""
    assert bias_update(torch.zeros(3), torch.tensor([3, 1, 2]), 0.1).tolist() == \
        pytest.approx([-0.1, 0.1, 0.0])
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 8, generator=gen, dtype=torch.float64)
    logits[:, :2] += 1.5                                   # experts 0 and 1 favoured
    bias, ratios = torch.zeros(8, dtype=torch.float64), []
    for _ in range(50):
        load = route(logits, 2, None, balance="bias", gate=gate, bias=bias).routed_per_expert
        ratios.append(load.max().item() * 8 / load.sum().item())
        bias = bias_update(bias, load, 0.01)
    assert ratios[0] > 2 and max(ratios[-10:]) < 0.6 * ratios[0], ratios


def test_the_bias_is_a_buffer_moved_only_by_update_bias():
    layer = _layer(balance="bias", bias_step=0.01)
    assert "expert_bias" in dict(layer.named_buffers()) and "expert_bias" in layer.state_dict()
    assert all(p is not layer.expert_bias for p in layer.parameters())
    layer(_x())
    load = layer.stats["routed_per_expert"]
    update_biases(layer)
    mean = sum(load) / len(load)
    assert layer.expert_bias.tolist() == pytest.approx(
        [0.01 * ((n < mean) - (n > mean)) for n in load])
    plain = _layer()
    assert plain.expert_bias is None and "expert_bias" not in plain.state_dict()
    plain(_x())
    update_biases(plain)                                    # a no-op without balance="bias"


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
    layer.aux_loss.backward()
    assert layer.router.weight.grad.abs().sum() > 0


def test_bad_settings_get_one_line():
    for kwargs, words in (({"n_experts": 4, "top_k": 5}, "top_k=5 must be a positive integer at most 4"),
                          ({"n_experts": 4, "capacity_factor": 0}, "capacity_factor=0 must be a finite positive"),
                          ({"n_experts": 0}, "n_experts=0 must be a positive integer"),
                          ({"n_experts": 4, "bias_step": -0.1},
                           "bias_step=-0.1 must be a finite number >= 0"),
                          ({"n_experts": 4, "balance": "switch"},
                           "balance='switch' must be one of 'aux', 'bias', 'none'"),
                          ({"n_experts": 4, "gate": "relu"},
                           "gate='relu' must be one of 'softmax', 'sigmoid'"),
                          ({"n_experts": 4, "max_nodes": 3, "experts_per_node": 2},
                           "max_nodes=3 must be a positive integer at most 2"),
                          ({"n_experts": 4, "max_nodes": 1, "experts_per_node": 3},
                           "experts_per_node=3 must divide n_experts=4"),
                          ({"n_experts": 4, "top_k": 3, "max_nodes": 1, "experts_per_node": 2},
                           "max_nodes=1 nodes of experts_per_node=2 hold fewer than top_k=3"),
                          ({"n_experts": 4, "max_nodes": 1},
                           "experts_per_node=None must be a positive integer")):
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
