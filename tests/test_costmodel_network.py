"""Collectives across servers: NCCL's channels over every port (multi-ring) against one flat
ring, by hand, and Megatron-LM 2021's Fig. 13 (162 B parameters on 64 A100)."""
import json
from dataclasses import replace

import pytest

from lessonlib.costmodel import CLUSTERS, MODELS, Layout, estimate, make_cluster, tp_sweep
from lessonlib.costmodel.__main__ import main
from lessonlib.costmodel.comm import members_per_node
from lessonlib.costmodel.layout import GRAD_DTYPES

DGX = CLUSTERS["dgx-a100"]  # 8 GPUs per server, one 200 Gb/s (25 GB/s) port per GPU
FLAT = replace(DGX, collectives="flat-ring")
ONE_PORT = make_cluster("A100", 8, network_ports=1, collectives="flat-ring")


@pytest.mark.parametrize("n, size, stride, g, members", [
    (64, 16, 1, 8, 8),    # TP of 16: 8 members in each of 2 servers
    (64, 8, 1, 8, 8),     # TP of 8 fills one server: no crossing
    (64, 8, 8, 8, 1),     # DP striding by a server: one member per server
    (64, 16, 4, 8, 2),    # t*p = 4: two members of each DP group per server
    (12, 3, 1, 8, 1),     # t=3: the group 6, 7, 8 has one member in the second server
    (4, 4, 1, 8, 4),      # everything in one server
    (2**40, 2**39, 2, 8, 4),  # huge grids are looked at by pattern, not rank by rank
])
def test_members_per_node_by_hand(n, size, stride, g, members):
    assert members_per_node(n, size, stride, g) == members


def test_group_link_uses_every_members_port_on_dgx():
    gb = 1e9
    assert DGX.group_link(64, 8, 1) == (300 * gb, 5e-6)  # NVLink, per direction
    bandwidth, latency = DGX.group_link(64, 16, 1)
    assert bandwidth == 8 * 25 * gb  # 8 ports of 25 GB/s, under NVLink's 300
    # 15 ring steps: 1 crosses between the 2 servers (10 us), 14 stay on NVLink (5 us)
    assert latency == pytest.approx((1 * 10e-6 + 14 * 5e-6) / 15)
    assert DGX.group_link(64, 8, 8)[0] == 25 * gb  # one member per server: one port
    assert DGX.group_link(64, 16, 4)[0] == 2 * 25 * gb
    # A flat ring crosses through one port; a server with one port shares it
    assert FLAT.group_link(64, 16, 1) == (25 * gb, 10e-6)
    assert ONE_PORT.group_link(64, 16, 4)[0] == 25 * gb / 4  # 4 DP groups share the port
    assert ONE_PORT.link(True)[0] == 25 * gb / 8 and DGX.link(True)[0] == 25 * gb


def _ratios(cluster, global_batch=128):
    """TFLOP/s per GPU of t = 16 and t = 32 relative to t = 8, p = 64/t, d = 1."""
    sweep = {t: e for t, _, e in tp_sweep(MODELS["gpt-161B"], cluster, 64, global_batch)}
    best = max(e.tflops_per_gpu for e in sweep.values())
    t8 = sweep[8].tflops_per_gpu
    return sweep[16].tflops_per_gpu / t8, sweep[32].tflops_per_gpu / t8, t8 / best


def test_fig13_leaving_the_server_costs_up_to_2x_not_several_times():
    """Megatron-LM 2021 Fig. 13 (162.2 B, 64 A100, batch 128): t = 8 with p = 8 is best and
    other (t, p) are "up to 2x" slower. The model's 161.6 B shape with b = 1: t = 16 and 32
    lose about 1.4x and 2.3x; t = 8 is within several percent of the best (t = 4 by 7 %)."""
    t16, t32, t8_of_best = _ratios(DGX)
    assert 0.6 < t16 < 0.9
    assert 0.4 < t32 < t16
    assert t8_of_best > 0.92


def test_a_flat_ring_through_one_port_makes_the_cliff_several_times_steeper():
    # The cost model before it knew NCCL's channels: t = 16 at 0.28x of t = 8, t = 32 0.15x.
    for cluster in (FLAT, ONE_PORT):
        t16, t32, _ = _ratios(cluster)
        assert t16 < 0.35 and t32 < 0.2


# --- the command line: one line naming the flag, exit status 2 (issue probes) -------------

CLI = ["--model", "gpt-161B", "--t", "8", "--p", "8", "--global-batch", "64"]


@pytest.mark.parametrize("extra, flag", [
    (["--network-gbit", "nan"], "network-gbit=nan"),
    (["--network-gbit", "-200"], "network-gbit=-200"),
    (["--network-gbit", "1e-320"], "network-gbit=1e-320"),     # inf s, printed as Infinity
    (["--network-gbit", "1e-300"], "network-gbit=1e-300"),     # a 5.8e299 s step
    (["--global-batch", "0"], "global-batch=0"),
    (["--gpus", "0"], "gpus=0"),
    (["--t", "0", "--gpus", "8"], "t=0"),
    (["--seq", "0"], "seq=0"),
    (["--zero", "4"], "zero=4"),
    (["--network-ports", "0"], "network-ports=0"),
    (["--t", "eight"], "--t"),
    (["--collectives", "tree"], "--collectives"),
])
def test_cli_bad_value_one_line_naming_the_flag(capsys, extra, flag):
    try:
        status = main(CLI + extra)
    except SystemExit as exc:  # argparse's own error, one line too
        status = exc.code
    assert status == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and flag in err, err


def test_cli_json_never_prints_a_number_json_cannot_hold(capsys):
    argv = ["--model", "gpt2-small", "--global-batch", "16", "--d", "16", "--json"]
    assert main(argv + ["--network-gbit", "1e-320"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == ("error: network-gbit=1e-320 must be a port speed in Gb/s from "
                                 "0.001 to 1000000, e.g. 200 (HDR) or 400 (NDR)\n")
    assert main(argv + ["--network-gbit", "0.001"]) == 0     # the slowest port still prints
    assert json.loads(capsys.readouterr().out)["step_time_s"] < 1e3


def test_estimate_refuses_a_step_whose_time_is_infinite():
    with pytest.raises(ValueError, match="network_gbit=1e-300 must be a port speed in Gb/s"):
        make_cluster("A100", 8, 1e-300)
    crawling = replace(DGX, network_bytes_per_s=1e-310)          # built around make_cluster
    with pytest.raises(ValueError) as err:
        estimate(MODELS["gpt2-small"], Layout(d=16, global_batch=16), crawling)
    assert str(err.value) == ("the step time is not finite (dp_comm inf s): a setting is out of "
                              "range, e.g. the cluster's network_gbit or a bandwidth near zero")


def test_cli_cluster_settings(capsys):
    assert main(CLI + ["--t", "16", "--p", "4", "--json"]) == 0
    multi = json.loads(capsys.readouterr().out)
    assert main(CLI + ["--t", "16", "--p", "4", "--network-ports", "1", "--collectives",
                       "flat-ring", "--json"]) == 0
    flat = json.loads(capsys.readouterr().out)
    assert flat["time_s"]["tp_comm"] > 5 * multi["time_s"]["tp_comm"]


def test_nvlink_sharp_speeds_only_all_reduces_inside_an_nvswitch_server():
    """NCCL's all-reduce runs NVLS on H100/H200 servers: busbw 420-480 GB/s at 5-8 GPUs
    against the ring's 370 (nccl issues 1455, 1442; nccl-tests 212); nothing else gains."""
    h100, teton = CLUSTERS["dgx-h100"], CLUSTERS["grand-teton-h100-96gb"]
    assert h100.allreduce_speedup(64, 8, 1) == pytest.approx(480 / 370)   # a server's TP
    assert teton.allreduce_speedup(8, 8, 1) == pytest.approx(480 / 370)   # HGX NVSwitches
    assert h100.allreduce_speedup(8, 6, 1) == pytest.approx(440 / 370)
    for cluster, args in ((h100, (64, 16, 1)), (h100, (64, 8, 8)), (h100, (8, 4, 1)),
                          (DGX, (8, 8, 1)), (CLUSTERS["hgx-h800"], (8, 8, 1))):
        assert cluster.allreduce_speedup(*args) == 1.0, (cluster.name, args)
    ring = replace(h100, gpu=replace(h100.gpu, nvlink_sharp=False))
    m8 = MODELS["llama3-8B"]

    def times(lay):
        return [estimate(m8, lay, c).time for c in (h100, ring)]

    fast, slow = times(Layout(t=8, m=1, recompute="none"))          # TP's all-reduces
    # the bytes 480/370 times faster; the ring steps' latencies as they were
    assert slow["tp_comm"] * 370 / 480 < fast["tp_comm"] < slow["tp_comm"] * 0.85
    fast, slow = times(Layout(t=8, m=1, recompute="none", sequence_parallel=True))
    assert fast["tp_comm"] == slow["tp_comm"]                        # gathers, scatters
    fast, slow = times(Layout(d=8, m=1, recompute="none"))           # DDP in one server
    assert fast["dp_comm"] < slow["dp_comm"]
    fast, slow = times(Layout(d=8, m=1, recompute="none", zero_stage=1))
    assert fast["dp_comm"] == slow["dp_comm"]


def test_gradients_travel_in_the_reduce_dtype_and_weights_in_16_bits():
    """Megatron-LM under bf16 and torchtitan's FSDP reduce gradients in fp32: the
    gradients' half of the exchange doubles, the weights' all-gathers do not."""
    from lessonlib.costmodel.axes import _exchange_s
    from lessonlib.costmodel.comm import (ring_all_gather_time_s, ring_allreduce_time_s,
                                          ring_reduce_scatter_time_s)
    params, bw, lat = 1e9, 50e9, 1e-5
    for zero in (0, 1, 3):
        lay = Layout(d=8, m=1, zero_stage=zero)
        fp32 = replace(lay, reduce_dtype="fp32")
        (g16, r16), (g32, r32) = (_exchange_s(x, params, 8, 8, bw, lat) for x in (lay, fp32))
        assert g32 == g16                                        # weights still 16-bit
        grads = ring_reduce_scatter_time_s(8, 2 * params, bw, lat)
        if zero == 0:
            assert r32 - r16 == pytest.approx(ring_allreduce_time_s(8, 2 * params, bw, 0))
        else:
            assert r32 - r16 == pytest.approx(grads - lat * 7)
        if zero == 1:      # the reduce-scatter, and the weights' gather apart
            assert r16 == pytest.approx(grads)
            assert g16 == pytest.approx(ring_all_gather_time_s(8, 2 * params, bw, lat))
    assert "fp32 reduce" in Layout(m=1, reduce_dtype="fp32").describe()
    with pytest.raises(ValueError, match="reduce_dtype='fp16' must be one of bf16, fp32"):
        Layout(m=1, reduce_dtype="fp16")


def test_deepspeeds_bf16_optimizer_all_reduces_the_gradients_whole():
    """ZeRO-1 under DeepSpeed's BF16 optimizer (BLOOM's): the gradients all-reduced, not
    reduce-scattered; the weights' gather unchanged."""
    from lessonlib.costmodel.axes import _exchange_s, exchange_collectives
    from lessonlib.costmodel.comm import ring_all_gather_time_s, ring_allreduce_time_s
    lay = Layout(d=8, m=1, zero_stage=1)
    whole = replace(lay, zero_reduce="all-reduce")
    (g1, r1), (g2, r2) = (_exchange_s(x, 1e9, 8, 8, 50e9, 1e-5) for x in (lay, whole))
    # DeepSpeed all-reduces in buffers of 5e8 elements: two here, each paying its latency
    assert exchange_collectives(whole, 1e9, 8, 1) == 2
    assert r2 == pytest.approx(2 * ring_allreduce_time_s(8, 1e9, 50e9, 1e-5))
    assert g2 == pytest.approx(2 * ring_all_gather_time_s(8, 1e9, 50e9, 1e-5))
    assert g1 == pytest.approx(ring_all_gather_time_s(8, 2e9, 50e9, 1e-5))
    assert r2 > 1.9 * r1 and "grads all-reduced" in whole.describe()
    with pytest.raises(ValueError, match="zero_reduce='ring' must be one of reduce-scatter"):
        Layout(m=1, zero_reduce="ring")
    with pytest.raises(ValueError, match="zero_stage=3 has no such choice"):
        Layout(d=8, m=1, zero_stage=3, zero_reduce="all-reduce")


def test_an_exchange_runs_as_buckets_or_units_each_paying_its_latency():
    """The data-parallel exchange is many collectives, not one: Megatron-Core's buckets of
    max(40M, 1M x d) parameters, PyTorch DDP's of 25 MiB, FSDP's one per layer, DeepSpeed's
    buffers of 5e8 elements; one piece where Megatron reduces without overlap. The bytes are
    the same; each piece pays its ring's latency."""
    import math
    from lessonlib.costmodel.axes import _exchange_s, exchange_collectives
    zero1 = Layout(d=64, m=1, zero_stage=1, overlap_comm=True)
    assert exchange_collectives(zero1, 8e9, 64, 32) == 125          # 8e9 / (1M x 64)
    assert exchange_collectives(zero1, 8e9, 16, 32) == 200       # the 40M floor at d = 16
    assert exchange_collectives(replace(zero1, overlap_comm=False), 8e9, 64, 32) == 1
    ddp = Layout(d=64, m=1, zero_stage=0, overlap_comm=True)
    assert exchange_collectives(ddp, 8e9, 64, 32) == math.ceil(
        8e9 * GRAD_DTYPES[ddp.reduce_dtype] / 2 ** 20 / 25)
    assert exchange_collectives(Layout(d=64, m=1, zero_stage=3), 8e9, 64, 32) == 32
    once = _exchange_s(replace(zero1, overlap_comm=False), 8e9, 64, 64, 50e9, 1e-5)
    buckets = _exchange_s(zero1, 8e9, 64, 64, 50e9, 1e-5)
    for one, many in zip(once, buckets):       # the gathers, then the reduce-scatters
        assert many - one == pytest.approx(124 * 63 * 1e-5)


def test_fsdp2_copies_each_gathered_unit_and_each_gradient_on_the_compute_stream():
    """foreach_all_gather_copy_out after every gather (16 bits read and written) and
    foreach_reduce_scatter_copy_in before the reduce-scatter (16 bits read, the reduce dtype
    written): under FSDP2's ZeRO-3 only, over more than one GPU; Megatron-Core's FSDP, whose
    parameters are views of the gathered bucket, copies nothing."""
    from lessonlib.costmodel.axes import fsdp_copies_s
    from lessonlib.costmodel.memory import stage_params
    m, hbm = MODELS["llama3-8B"], 1e12
    lay = Layout(d=8, b=2, m=1, zero_stage=3, recompute="none", reduce_dtype="fp32")
    params = stage_params(m, 1, 1)
    assert fsdp_copies_s(m, lay, hbm) == pytest.approx((2 * 4 + 2 + 4) * params / hbm)
    assert fsdp_copies_s(m, replace(lay, recompute="full"), hbm) == pytest.approx(
        (3 * 4 + 2 + 4) * params / hbm)
    for other in (replace(lay, zero_stage=1), replace(lay, d=1, global_batch=None),
                  replace(lay, fsdp_impl="megatron")):
        assert fsdp_copies_s(m, other, hbm) == 0.0
    assert "Megatron FSDP" in replace(lay, fsdp_impl="megatron").describe()
    with pytest.raises(ValueError, match="^fsdp_impl='deepspeed' must be one of pytorch, "
                                         "megatron$"):
        replace(lay, fsdp_impl="deepspeed")
