"""Does a GPU run really compute on the GPU? An audit of where torch's compute happens.

What it teaches: a run can "work" on a GPU machine while part of it silently computes on
the CPU (a stage never moved, a batch left behind); nothing fails, it is only slow, and the
record still says GPU. With ``LESSONLIB_DEVICE_AUDIT=<folder>`` in the environment, every
rank that computes on a GPU (NCCL) watches torch's compute functions (``F.linear``,
``matmul``, ``embedding``, losses, ...) and, the first time one of them gets a tensor that
is not on the rank's ``current_device()``, writes one line naming the function and the
device into ``<folder>/<script>-rank<r>-<pid>.txt`` (``<script>``: the lab, e.g. ``pp``).
No file for a run means every compute call saw only the rank's own GPU.
``labs/gpu_check.py`` runs every lab this way.

The same question asked on CPU ranks (``stand_in()``, what tests/test_placement.py runs):
``current_device()`` becomes ``device.STAND_IN`` (``cpu:0``, still the CPU, but a different
device object), every tensor made without it (a factory with no ``device``, ``.to("cpu")``)
is marked as left on the CPU, marks follow through every op, ``.to(current_device())``
clears them, and the first compute call or collective that gets a marked tensor raises
``LeftOnCpu`` naming it: on GPUs it would have computed on the CPU, failed with a device
mismatch, or handed NCCL a CPU tensor.

Laptop:  nothing to see (CPU ranks compute on the CPU, their own device); the stand-in:
         ``LESSONLIB_STAND_IN_GPU=1 python labs/pp.py --world-size 2`` fails at the first
         tensor left behind
GPU box: ``LESSONLIB_DEVICE_AUDIT=/tmp/audit python labs/pp.py --world-size 1``, then
         ``ls /tmp/audit`` (empty: all on the GPU)
"""
from __future__ import annotations

import contextlib
import functools
import os
import sys
import weakref
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch import nn
from torch.overrides import TorchFunctionMode

from lessonlib import device
from lessonlib.device import current_device

AUDIT_ENV = "LESSONLIB_DEVICE_AUDIT"
STAND_IN_ENV = "LESSONLIB_STAND_IN_GPU"
COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor",
               "reduce_scatter_tensor", "all_to_all_single", "all_to_all", "send", "recv",
               "isend", "irecv", "batch_isend_irecv")
COMPUTE = {"linear", "embedding", "layer_norm", "matmul", "mm", "bmm", "addmm", "conv1d",
           "conv2d", "scaled_dot_product_attention", "cross_entropy", "mse_loss", "gelu",
           "softmax", "__matmul__"}
_started: list = []


def astray(tensors, off) -> torch.Tensor | None:
    """The first tensor of a compute call that is ``off`` the rank's device where it matters:
    next to one on the device (a device mismatch on a GPU), or in the model's own compute
    (some input needs a gradient). Making data on the CPU (``data.regression_batch``: the
    same numbers on every device) is not the model's compute and is not reported."""
    tensors = [t for t in tensors if isinstance(t, torch.Tensor) and t.dim() > 0]
    left = [t for t in tensors if off(t)]
    if left and (len(left) < len(tensors) or any(t.requires_grad for t in tensors)):
        return left[0]
    return None


class _OffDevice(TorchFunctionMode):
    def __init__(self, folder: Path):
        super().__init__()
        self.folder, self.reported = folder, False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.reported and getattr(func, "__name__", "") in COMPUTE and dist.is_initialized():
            here = current_device()
            if here.type == "cuda":
                t = astray([*args, *kwargs.values()], lambda t: t.device != here)
                if t is not None:
                    self.report(f"{func.__name__} got a tensor on {t.device}, not {here}")
        return func(*args, **kwargs)

    def report(self, line: str) -> None:
        self.reported = True         # once per process: the first one says enough
        self.folder.mkdir(parents=True, exist_ok=True)
        script = Path(sys.argv[0]).stem or "python"     # spawned ranks keep the parent's argv
        name = f"{script}-rank{os.environ.get('RANK', '?')}-{os.getpid()}.txt"
        (self.folder / name).write_text(line + "\n")


def start_if_asked() -> bool:
    """Start the audit in this process when ``LESSONLIB_DEVICE_AUDIT`` names a folder, or
    its CPU stand-in when ``LESSONLIB_STAND_IN_GPU`` is set (on CPU ranks)."""
    folder = os.environ.get(AUDIT_ENV)
    if not _started and os.environ.get(STAND_IN_ENV) and current_device().type == "cpu":
        stand_in()
    elif folder and not _started:
        mode = _OffDevice(Path(folder))
        mode.__enter__()             # for the rest of the process: it ends with the rank
        _started.append(mode)
    return bool(_started)


@contextlib.contextmanager
def paused():
    """The GPU audit off for the block, back on after: a timed step pays no check on every
    torch call (several microseconds each); the untimed steps before it are the audited
    pass. The CPU stand-in is never paused (it checks correctness, not speed)."""
    mode = next((m for m in _started if isinstance(m, _OffDevice)), None)
    if mode is None:
        yield
        return
    mode.__exit__(None, None, None)      # the audit's mode is the only one a rank pushes
    try:
        yield
    finally:
        mode.__enter__()


def timed(step: int, warmup: int):
    """The context of step ``step`` of a timed loop: the audit paused from the first timed
    step on, but step 0 is always the audited pass (a loop with no warm-up times its first
    step with the audit on; every other step pays nothing)."""
    return paused() if step >= max(warmup, 1) else contextlib.nullcontext()


def auditing() -> bool:
    """Whether this process runs the GPU audit (``LESSONLIB_DEVICE_AUDIT``)."""
    return any(isinstance(m, _OffDevice) for m in _started)


_DATA = next(c.__dict__["data"] for c in torch.Tensor.__mro__ if "data" in c.__dict__)


class LeftOnCpu(RuntimeError):
    """A tensor that would have stayed on the CPU of a GPU rank."""


class _StandIn(TorchFunctionMode):
    """Marks every tensor made off ``STAND_IN`` and follows the marks through each op."""

    def __init__(self):
        super().__init__()
        self.cpu = _Marks()

    def check(self, where: str, tensors) -> None:
        t = (next((t for t in tensors if t in self.cpu), None) if where in COLLECTIVES else
             astray(tensors, lambda t: t in self.cpu))
        if t is not None:
            raise LeftOnCpu(f"{where} got a {t.dtype} tensor of shape {tuple(t.shape)} that "
                            f"stayed on the CPU: on a GPU rank it would not be on its GPU")

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        tensors = [t for t in _flat([args, kwargs]) if isinstance(t, torch.Tensor)]
        if name in COMPUTE:
            self.check(name, tensors)
        out = func(*args, **kwargs)
        if name == "__set__" and getattr(func, "__self__", None) is _DATA:   # t.data = u
            (self.cpu.add if args[1] in self.cpu else self.cpu.discard)(args[0])
        if name.endswith("_") or name.startswith("__set"):
            return out                        # in place: the tensor stays where it was
        target = _target(name, args, kwargs, self.cpu)
        left = (target != device.STAND_IN if target is not None else
                all(t in self.cpu for t in tensors) if tensors else True)
        for t in _flat([out]):
            if isinstance(t, torch.Tensor):
                (self.cpu.add if left else self.cpu.discard)(t)
        return out


class _Marks:
    """A set of tensors by identity (a WeakSet would compare them with ``==``)."""

    def __init__(self):
        self.refs = {}

    def __contains__(self, t) -> bool:
        ref = self.refs.get(id(t))
        return ref is not None and ref() is t

    def add(self, t) -> None:
        self.refs[id(t)] = weakref.ref(t, lambda _, key=id(t): self.refs.pop(key, None))

    def discard(self, t) -> None:
        self.refs.pop(id(t), None)


def _flat(x):
    if isinstance(x, (list, tuple)):
        for y in x:
            yield from _flat(y)
    elif isinstance(x, dict):
        for y in x.values():
            yield from _flat(y)
    else:
        yield x


def _target(name: str, args, kwargs, cpu) -> torch.device | None:
    """Where an op puts its result when it says so (``device=``, ``.to``, ``.cpu``)."""
    if name == "cpu":
        return device._CPU
    if name == "cuda":
        return device.STAND_IN
    where = kwargs.get("device")
    if where is None and name == "to":
        for a in args[1:]:
            if isinstance(a, torch.Tensor):
                return device._CPU if a in cpu else device.STAND_IN
            if isinstance(a, (str, torch.device, int)) and not isinstance(a, bool):
                where = a
                break
    if where is None:
        return None
    if isinstance(where, int):
        return device.STAND_IN                          # a GPU index
    if isinstance(where, str):                          # "cpu" written out: the CPU
        return device._CPU if torch.device(where) == device._CPU else device.STAND_IN
    # a torch.device object is most often another tensor's ``.device``, and a tensor on the
    # stand-in says "cpu": it follows that tensor (a false negative for torch.device("cpu"))
    return device.STAND_IN


def stand_in() -> _StandIn:
    """Run the rest of this CPU process as if ``cpu:0`` were its GPU (see the docstring)."""
    mode = _StandIn()
    device._stand_in[:] = [device.STAND_IN]
    made = nn.Parameter.__new__

    def parameter(cls, data=None, requires_grad=True):
        p = made(cls, data, requires_grad)
        if data is None or data in mode.cpu:
            mode.cpu.add(p)
        return p

    nn.Parameter.__new__ = parameter
    for name in COLLECTIVES:     # in both namespaces: P2POp checks ``op is isend`` there
        checked = _checked(getattr(c10d, name), name, mode)
        setattr(c10d, name, checked)
        setattr(dist, name, checked)
    mode.__enter__()
    _started.append(mode)
    return mode


def _checked(fn, name: str, mode: _StandIn):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        # The caller's tensors, once: not again when torch hands the same call back through
        # its __torch_function__, nor the CPU copies ``gloo_cuda``'s detour passes inward
        if not _inside:
            mode.check(name, [t for t in _flat([args, kwargs]) if isinstance(t, torch.Tensor)]
                       + [op.tensor for op in (args[0] if name == "batch_isend_irecv" else [])])
        _inside.append(name)
        try:
            return fn(*args, **kwargs)
        finally:
            _inside.pop()
    return call


_inside: list = []     # the checked collectives this rank is inside (one thread per rank)


def findings(folder: Path, script: str = "*") -> list[str]:
    """What the ranks of ``script``'s runs reported into ``folder`` (empty: all on-device)."""
    return sorted(f"{p.stem}: {p.read_text().strip()}"
                  for p in Path(folder).glob(f"{script}-rank*.txt"))
