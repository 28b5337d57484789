"""DiLoCo and Streaming DiLoCo: the course's own equals torchft's in float64 on the same seeds;
the ledger's bytes per token are 1/H of data parallelism's; the cost model's WAN term.
2 replicas of one rank, 8 inner steps of the tiny GPT, H = 4."""
import pytest
import torch

from lessonlib.costmodel.resilience import WAN_BANDWIDTH, WAN_LATENCY, wan_step
from lessonlib.faults import diloco_runs
from lessonlib.faults.diloco import fragments
from lessonlib.faults.replicas import model_and_optimizer

pytestmark = pytest.mark.timeout(180)
H, STEPS = 4, 8


@pytest.fixture(scope="module")
def ours():
    return {count: diloco_runs.diloco(2, STEPS, H, count) for count in (1, 2)}


@pytest.mark.parametrize("count", [1, 2], ids=["diloco", "streaming-F2"])
def test_the_courses_diloco_equals_torchfts(ours, count):
    theirs = diloco_runs.torchft_diloco(2, STEPS, H, count)
    for r in range(2):
        torch.testing.assert_close(ours[count][r].state, theirs[r].state, rtol=0, atol=1e-12)
        assert ours[count][r].losses == pytest.approx(theirs[r].losses, rel=0, abs=1e-12)
    # DiLoCo ends on a sync (step 8): the replicas agree; streaming's last sync was fragment 1
    same = all(torch.equal(ours[count][0].state[k], ours[count][1].state[k])
               for k in ours[count][0].state)
    assert same == (count == 1)


def test_diloco_sends_one_h_th_of_ddps_bytes_per_token(ours):
    ddp = diloco_runs.ddp(2, STEPS)
    for count in (1, 2):
        for r in range(2):
            per_token = ours[count][r].bytes_sent / ours[count][r].tokens
            assert ddp[r].bytes_sent / ddp[r].tokens == H * per_token, (count, r)


def test_fragments_cut_the_model_by_parts():
    model, _ = model_and_optimizer()
    parts = fragments(model, 2)
    assert [len(p) for p in parts] == [2, 1]           # embedding + block | head
    assert sum(p.numel() for f in parts for p in f.parameters()) == \
        sum(p.numel() for p in model.parameters())
    with pytest.raises(ValueError, match="fragments=4: the model has 3 parts"):
        fragments(model, 4)


def test_diloco_pays_the_wan_once_per_h_steps():
    # 1 s of compute, 10 GB across a 1 GB/s link with 0.05 s latency: 10.05 s per exchange
    step = wan_step(t_compute=1.0, model_bytes=10e9, bandwidth=1e9, latency=0.05, H=100)
    assert step.ddp_s == pytest.approx(11.05) and step.diloco_s == pytest.approx(1.1005)
    assert step.ddp_link_share == pytest.approx(10.05 / 11.05)
    # 4 fragments of 2.5 GB every 25 steps, each behind one step of compute: 1.55 s sticks out
    streaming = wan_step(1.0, 10e9, 1e9, 0.05, H=100, fragments=4, overlap=1)
    assert streaming.streaming_s == pytest.approx(1 + 1.55 / 25)
    assert wan_step(1.0, 10e9, 1e9, 0.05, H=1).diloco_s == pytest.approx(11.05)   # H=1: DDP
    with pytest.raises(ValueError, match="multiple of fragments"):
        wan_step(1.0, 1e9, 1e9, 0.0, H=10, fragments=4)


def test_the_typical_link_between_datacenters_prices_a_10_gb_exchange_at_80_s():
    # 1 Gbit/s (Streaming DiLoCo's Table 1) and 20 ms one way: 80.02 s per exchange of 10 GB
    assert WAN_BANDWIDTH * 8 == 1e9 and WAN_LATENCY == 0.02
    step = wan_step(1.0, 10e9, WAN_BANDWIDTH, WAN_LATENCY, H=500)
    assert step.ddp_s == pytest.approx(81.02) and step.diloco_s == pytest.approx(1 + 80.02 / 500)
