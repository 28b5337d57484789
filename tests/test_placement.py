"""No CPU tensor under NCCL: every launched entry point of the course (what the notebooks
launch, the runs modules, the bug zoo's checks) runs on CPU ranks whose "GPU" is a stand-in
(``lessonlib.instruments.placement.stand_in``), and the first tensor that stayed on the CPU (in the
model's compute, next to one on the device, or handed to a collective) fails the launch with
its traceback. The labs' rank functions run the same way in tests/test_gpu_check.py."""
import pytest
import torch
from torch import nn

import lessonlib
import placement_workers as W
from lessonlib import device
from lessonlib.instruments import placement
from lessonlib.launcher import RankError


@pytest.mark.timeout(240)
def test_every_launched_entry_point_keeps_its_tensors_on_the_ranks_device(monkeypatch):
    monkeypatch.setenv(placement.STAND_IN_ENV, "1")
    done = lessonlib.launch(W.drive, 2, list(W.ENTRY_POINTS), timeout=200)
    assert done[0] == list(W.ENTRY_POINTS)
    with pytest.raises(RankError, match=r"LeftOnCpu: linear got a torch.float32 tensor of shape \(2, 3\)"):
        lessonlib.launch(W.left_behind, 2, timeout=60)       # the ranks do run on the stand-in


@pytest.mark.timeout(60)
def test_the_stand_in_names_the_first_tensor_left_on_the_cpu(monkeypatch):
    """In this process (the mode is undone after): what it marks, and what it lets pass."""
    monkeypatch.setattr(nn.Parameter, "__new__", nn.Parameter.__new__)
    monkeypatch.setattr(device, "_stand_in", [])
    for name in placement.COLLECTIVES:
        monkeypatch.setattr(placement.dist, name, getattr(placement.dist, name))
        monkeypatch.setattr(placement.c10d, name, getattr(placement.c10d, name))
    mode = placement.stand_in()
    try:
        dev = device.current_device()
        assert dev == device.STAND_IN
        layer = nn.Linear(3, 2)
        x, y = torch.randn(4, 3), torch.randn(4, 3, device=dev)
        with pytest.raises(placement.LeftOnCpu, match=r"linear got a torch.float32 tensor of shape \(2, 3\)"):
            layer(y)                                  # the layer was never moved
        layer.to(dev)
        with pytest.raises(placement.LeftOnCpu, match=r"shape \(4, 3\)"):
            layer(x)                                  # the batch was never moved
        out = layer(x.to(dev))
        out.sum().backward()
        torch.optim.AdamW(layer.parameters()).step()
        assert out not in mode.cpu and layer.weight.grad not in mode.cpu
        assert out.detach().cpu() in mode.cpu         # results brought home are the CPU's
        torch.sin(x) @ torch.randn(3, 3)              # making data on the CPU is not reported
        with pytest.raises(placement.LeftOnCpu, match="all_reduce"):
            placement.dist.all_reduce(torch.ones(2))
    finally:
        mode.__exit__(None, None, None)
        placement._started.remove(mode)


def test_timed_steps_run_with_the_gpu_audit_paused_after_an_audited_pass(tmp_path, monkeypatch):
    """Issue: step times were measured with the audit's check on every torch call. Now the
    untimed steps (at least one) are the audited pass and the timed ones pay nothing."""
    import torch

    from lessonlib import comm
    from lessonlib.instruments import placement
    from lessonlib.lab import labkit

    seen = []

    class Spy(placement._OffDevice):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    monkeypatch.setattr(comm, "barrier", lambda group=None: None)
    spy = Spy(tmp_path)
    spy.__enter__()
    monkeypatch.setattr(placement, "_started", [spy])
    try:
        counts = []

        def step():
            before = len(seen)
            torch.ones(3).sum()
            counts.append(len(seen) - before)

        times = labkit.time_steps(step, steps=2, warmup=0)
        assert len(times) == 2 and counts[0] > 0 and counts[1:] == [0, 0], counts
    finally:
        spy.__exit__(None, None, None)


def test_every_timed_loop_pauses_the_audit_after_its_audited_pass(tmp_path, monkeypatch):
    """Issue: the pipeline, hybrid, five-axis and assembly-line labs timed their steps with
    the audit's check on every torch call. ``placement.timed`` pauses it from the first timed
    step on (step 0 always audited), and every such loop runs its steps inside it."""
    import inspect

    import torch

    from lessonlib import model_parallel
    from lessonlib.hybrid import trainer
    from lessonlib.instruments import placement
    from lessonlib.pipeline import schedule_runs as pipeline_runs

    seen = []

    class Spy(placement._OffDevice):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return func(*args, **(kwargs or {}))

    spy = Spy(tmp_path)
    spy.__enter__()
    monkeypatch.setattr(placement, "_started", [spy])
    try:
        for warmup, audited in ((0, [True, False, False]), (2, [True, True, False])):
            counts = []
            for step in range(3):
                before = len(seen)
                with placement.timed(step, warmup):
                    torch.ones(3).sum()
                counts.append(len(seen) - before)
            assert [c > 0 for c in counts] == audited, (warmup, counts)
    finally:
        spy.__exit__(None, None, None)
    for loop in (pipeline_runs.measure, trainer.train, model_parallel.assembly_line):
        assert "placement.timed(" in inspect.getsource(loop), loop.__qualname__
