"""What the MoE lesson measures about routing, asserted: DeepSeek-V3's bias evens the load
with no auxiliary loss, dropless routing drops nothing, and the node limit bounds the nodes
a token reaches (``lessonlib.expert_parallel.measure``).

The balance studies train the tiny MoE GPT for 60 steps in one process (about a second
each); the node study is one 4-rank launch of one dropless step per node limit."""
import statistics

import pytest

from lessonlib.expert_parallel import measure


def _windows(load, start=20, width=10):
    """busiest / mean, averaged over each window of ``width`` steps from ``start`` on."""
    return [statistics.mean(max(s) * len(s) / sum(s) for s in load[a:a + width])
            for a in range(start, len(load), width)]


@pytest.mark.parametrize("gate", ["softmax", "sigmoid"])
def test_the_bias_brings_the_busiest_expert_closer_to_the_mean_than_no_balancing(gate):
    """Dropless, DeepSeek-V3's step (0.001), no auxiliary loss: in every 10-step window
    from step 20 to 59 the busiest expert of the first layer is closer to the mean load than
    without balancing, and over steps 30-59 by a wide margin (not a lucky step)."""
    none = measure.balance_study("none", gate=gate, capacity_factor=None)
    bias = measure.balance_study("bias", gate=gate, capacity_factor=None)
    assert all(a == 0 for a in bias.aux_losses)                 # no auxiliary loss at all
    assert bias.train_dropped_share == none.train_dropped_share == 0    # dropless
    assert all(b < n for b, n in zip(_windows(bias.load), _windows(none.load))), \
        (_windows(bias.load), _windows(none.load))
    assert bias.imbalance < 0.9 * none.imbalance, (bias.imbalance, none.imbalance)


def test_a_capacity_drops_in_training_and_the_auxiliary_loss_is_in_the_objective():
    aux = measure.balance_study("aux", steps=20, factors=())
    assert aux.train_dropped_share > 0 and all(a > 0 for a in aux.aux_losses)
    assert measure.balance_study(True, steps=2, factors=()).aux_losses[0] > 0  # True: aux


@pytest.mark.timeout(120)
def test_the_node_limit_bounds_the_nodes_a_token_reaches_not_the_one_hop_bytes():
    """4 ranks, each its own pretend node (2 experts each), top-2, dropless: with M = 1 each
    token's experts sit on one node, so a dispatch that crosses once per node sends fewer
    copies; the one-hop all-to-all moves k copies of every token either way."""
    study = measure.node_traffic_study(4, ranks_per_node=1, limits=(None, 1), gate="sigmoid",
                                       balance="none")
    free, limited = study[None], study[1]
    assert free["dropped"] == limited["dropped"] == 0
    assert limited["most_nodes_per_token"] == 1 < free["most_nodes_per_token"] == 2
    assert limited["node_copies_per_token"] < 0.7 * free["node_copies_per_token"]
    assert limited["alltoall_bytes"] == free["alltoall_bytes"]
    assert 0.5 < free["off_node_share"] < 0.9 and 0.5 < limited["off_node_share"] < 0.9
