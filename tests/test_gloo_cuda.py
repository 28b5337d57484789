"""The shared-GPU mode's detour for point-to-point (``lessonlib.gloo_cuda``), run on CPU ranks
whose "GPU" is the placement audit's stand-in: every send and receive goes through a CPU copy
and still delivers, the audit sees the rank's own tensors, and the mode is asked for by name
only (without it, nothing is wrapped and a gloo rank computes on the CPU)."""
import pytest

import lessonlib
import placement_workers as W
from lessonlib import device, gloo_cuda
from lessonlib.instruments import placement


@pytest.mark.timeout(60)
def test_point_to_point_goes_through_the_cpu_and_delivers(monkeypatch):
    monkeypatch.setenv(placement.STAND_IN_ENV, "1")
    monkeypatch.setenv(device.SHARED_GPU_ENV, "1")
    ranks = lessonlib.launch(W.through_the_detour, 2, backend="gloo", timeout=40)
    assert all(r["detour"] for r in ranks)
    assert [r["batched"] for r in ranks] == [[1.0] * 3, [0.0] * 3]
    assert ranks[1]["async"] == [7.0, 7.0] and ranks[1]["blocking"] == [9.0, 9.0]


def test_the_mode_is_asked_for_by_name(monkeypatch):
    monkeypatch.delenv(device.SHARED_GPU_ENV, raising=False)
    assert not device.shared_gpu()
    monkeypatch.setattr(device, "gpu_count", lambda: 1)
    assert not device.shared_gpu() and device.resolve_backend("auto", 1) == "nccl"
    monkeypatch.setenv(device.SHARED_GPU_ENV, "1")
    assert device.shared_gpu() and device.resolve_backend("auto", 1) == "gloo"
    assert set(gloo_cuda.CPU_DETOUR) <= set(placement.COLLECTIVES)
    assert not set(gloo_cuda.CPU_DETOUR) & set(gloo_cuda.ON_CUDA)
