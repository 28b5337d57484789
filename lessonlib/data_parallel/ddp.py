"""Rung (d) of the data-parallel ladder: bucketed gradient all-reduce overlapping backward.

What it teaches: how PyTorch's DistributedDataParallel (Li et al., VLDB 2020) is fast.
Gradients become final in roughly the reverse order of the parameters (the last layer's
first), so ``DataParallel`` packs the parameters, in reverse order, into buckets of about
``bucket_cap_mb`` MiB. When the last gradient of a bucket arrives, the bucket's single
asynchronous all-reduce starts while backward keeps computing earlier layers: few messages
(unlike rung (c)) and overlap with compute (unlike rungs (a) and (b), see
``lessonlib.data_parallel.ladder``). A callback at the end of backward waits for the buckets, so the
gradients are averaged by the time ``loss.backward()`` returns, as with PyTorch's DDP.
The lesson's timeline is stamped by a recorder the wrapper is handed
(``recorder.no_record`` by default; ``recorder.BucketRecorder`` stamps each bucket's launch
and finish).

Also as in PyTorch's DDP: rank 0's weights are copied to every rank at wrap time; frozen
parameters are skipped and a tied weight is reduced once; ``no_sync()`` lets gradients
accumulate locally over micro-batches and syncs on the first backward outside it; buckets
always launch in the same order on every rank. ``sharded_loader`` is the data side: a
``DistributedSampler`` gives each rank its own share of every epoch.

Laptop:  ``python labs/ddp.py --world-size 2``
GPU box: ``torchrun --nproc-per-node 8 labs/ddp.py`` (NCCL, one GPU per rank)
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

from lessonlib import bug_switches, comm
from lessonlib.argcheck import positive_int
from lessonlib.data_parallel.collectives import group_ranks
from lessonlib.data_parallel.ladder import queue_end_of_backward, replicate, trainable_parameters
from lessonlib.data_parallel.recorder import no_record

MiB = 2 ** 20


def plan_buckets(params, cap_bytes: int, first_cap_bytes: int | None = None) -> list[list[int]]:
    """Indices of ``params`` grouped into buckets, last parameter first.

    A bucket closes when the next parameter would take it past its cap, or has another
    dtype or device (a bucket is one flat buffer). A parameter bigger than the cap gets a
    bucket of its own. The first bucket's cap is ``first_cap_bytes`` when given (PyTorch's
    DDP uses 1 MiB, so that communication starts early in backward), never more than
    ``cap_bytes``. Pure: the tests and the notebook call it without processes."""
    first = min(cap_bytes, first_cap_bytes if first_cap_bytes is not None else cap_bytes)
    buckets: list[list[int]] = []
    size, kind = 0, None
    for i in reversed(range(len(params))):
        p = params[i]
        nbytes = p.numel() * p.element_size()
        cap = first if len(buckets) == 1 else cap_bytes
        if buckets and (size + nbytes <= cap and (p.dtype, p.device) == kind):
            buckets[-1].append(i)
            size += nbytes
        else:
            buckets.append([i])
            size, kind = nbytes, (p.dtype, p.device)
    return buckets


@dataclass
class Bucket:
    """One flat buffer holding several parameters' gradients, all-reduced as one message."""
    params: list[nn.Parameter]
    buffer: torch.Tensor
    views: list[torch.Tensor]                        # params[i]'s slice of the buffer
    arrived: set = field(default_factory=set)        # indices of the gradients copied in
    handle: object = None                            # the all-reduce once launched

    @classmethod
    def of(cls, params: list[nn.Parameter]) -> "Bucket":
        sizes = [p.numel() for p in params]
        buffer = torch.zeros(sum(sizes), dtype=params[0].dtype, device=params[0].device)
        return cls(params, buffer, [v.view(p.shape) for v, p in zip(buffer.split(sizes), params)])

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()

    @property
    def ready(self) -> bool:
        return len(self.arrived) == len(self.params)

    def put(self, i: int, grad: torch.Tensor | None) -> None:
        """Copy parameter i's gradient into the buffer (zeros if it has none)."""
        if grad is None:
            self.views[i].zero_()
        else:
            self.views[i].copy_(grad)
        self.arrived.add(i)

    def put_the_rest(self) -> None:
        """A parameter this backward did not reach sends what it holds, or zeros, so every
        rank sends the same bucket."""
        for i, p in enumerate(self.params):
            if i not in self.arrived:
                self.put(i, p.grad)

    def average_into_grads(self, world_size: int) -> None:
        """The all-reduced sum / n, written into each parameter's ``.grad`` in one pass."""
        for p, view in zip(self.params, self.views):
            if p.grad is None:
                p.grad = view / world_size
            else:
                torch.div(view, world_size, out=p.grad)

    def empty(self) -> None:
        self.arrived, self.handle = set(), None


def _check_cap(value, name: str = "bucket_cap_mb") -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not value > 0 or math.isinf(value):
        raise ValueError(f"{name} must be a positive number of MiB (PyTorch's DDP uses 25 "
                         f"for bucket_cap_mb and 1 for the first bucket; a tiny value such as "
                         f"0.01 gives one bucket per parameter); got {value!r}")


class DataParallel(nn.Module):
    """Wrap ``module`` so that ``loss.backward()`` leaves gradients averaged over ``group``.

    Buckets hold about ``bucket_cap_mb`` MiB, the first one ``first_bucket_mb`` (both as in
    PyTorch's DDP: 25 and 1), so the first all-reduce starts early in backward.

    ``buckets`` lists the buckets (reverse parameter order). ``recorder`` (``no_record`` by
    default; the lesson's ``BucketRecorder``) is told when a gradient arrives (``poll``), scopes
    each bucket's launch (``launching``) and the end of backward (``finishing``); after each
    synced backward ``timeline`` is what it read (``{}`` with none)."""

    def __init__(self, module: nn.Module, bucket_cap_mb: float = 25.0, group=None,
                 first_bucket_mb: float = 1.0, recorder=no_record):
        _check_cap(bucket_cap_mb)
        _check_cap(first_bucket_mb, "first_bucket_mb")
        super().__init__()
        self.module = replicate(module, group)
        self.group, self.world_size = group, dist.get_world_size(group)
        self.bucket_cap_mb = bucket_cap_mb
        params = trainable_parameters(module)
        caps = int(bucket_cap_mb * MiB), int(first_bucket_mb * MiB)
        self.buckets = [Bucket.of([params[i] for i in indices])
                        for indices in plan_buckets(params, *caps)]
        self._slot = {id(p): (b, i) for b in self.buckets for i, p in enumerate(b.params)}
        self._sync = True              # False inside no_sync(): gradients stay local
        self._finish_queued = False    # this backward's end-of-backward callback is queued
        self._launched = 0             # buckets launched so far in this backward, in order
        self.recorder = recorder
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad) for p in params]

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextmanager
    def no_sync(self):
        """Inside, backward only accumulates local gradients (no communication); the first
        backward after it averages everything accumulated so far."""
        before, self._sync = self._sync, False
        # Bug zoo: the two values swapped, so gradients sync inside no_sync and not after it
        if bug_switches.active("ddp_sync_on_wrong_microbatch"):
            before, self._sync = False, True
        try:
            yield
        finally:
            self._sync = before

    # ------------------------------------------------------------ during backward
    def _on_grad(self, p: torch.Tensor) -> None:
        """Runs once per parameter per backward, as soon as its gradient is final: copy it
        into its bucket and launch every bucket that is now full."""
        if not self._sync:
            return
        if not self._finish_queued:
            self._finish_queued = True
            queue_end_of_backward(self._finish)
        bucket, i = self._slot[id(p)]
        bucket.put(i, p.grad)
        self._launch_ready_buckets()
        self.recorder.poll(self.buckets)

    def _launch_ready_buckets(self) -> None:
        """Launch, in bucket order, every bucket whose gradients have all arrived: the same
        order on every rank, which collectives require."""
        while self._launched < len(self.buckets) and self.buckets[self._launched].ready:
            bucket = self.buckets[self._launched]
            with self.recorder.launching(self._launched, bucket):
                bucket.handle = comm.all_reduce(bucket.buffer, group=self.group, async_op=True)
            self._launched += 1

    # ------------------------------------------------------------ end of backward
    @torch.no_grad()
    def _finish(self) -> None:
        """Once backward has computed every gradient: send the buckets it did not fill,
        wait for every all-reduce, divide by n into ``.grad``, and start afresh."""
        with self.recorder.finishing(self.buckets):
            for bucket in self.buckets[self._launched:]:
                bucket.put_the_rest()
            self._launch_ready_buckets()
            for i, bucket in enumerate(self.buckets):
                self._wait(i, bucket)
                bucket.average_into_grads(self.world_size)
        for bucket in self.buckets:
            bucket.empty()
        self._finish_queued, self._launched = False, 0

    def _wait(self, i: int, bucket) -> None:
        """Wait for bucket ``i``'s all-reduce; a peer that never sent it is named as the
        pairing at fault, not left as a raw gloo or NCCL error."""
        try:
            bucket.handle.wait()
        except RuntimeError as exc:
            raise RuntimeError(
                f"DataParallel: the all-reduce of gradient bucket {i} ({bucket.nbytes} bytes) "
                f"failed on rank {dist.get_rank()}: every rank of the group must run "
                f"backward() on the same steps (the same micro-batches inside no_sync); a rank "
                f"that skipped a backward leaves the others waiting. The collective said: "
                f"{str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}"
            ) from exc

    @property
    def timeline(self) -> dict:
        """What the recorder read of the last synced backward (``{}`` with none)."""
        return self.recorder.read()

    def remove_hooks(self) -> nn.Module:
        """Detach from the module and return it (plain again)."""
        for handle in self._hooks:
            handle.remove()
        return self.module


def sharded_loader(dataset, batch_size: int, group=None, shuffle: bool = True, seed: int = 0,
                   drop_last: bool = True) -> DataLoader:
    """This rank's DataLoader: a ``DistributedSampler`` hands it every n-th example of a
    per-epoch permutation (call ``loader.sampler.set_epoch(epoch)`` each epoch), so the n
    ranks together see the epoch once, and batch i over all ranks is n x ``batch_size``
    examples, as in one process with the global batch."""
    positive_int("batch_size", batch_size, what="examples per rank")
    me, members = group_ranks(group)
    sampler = DistributedSampler(dataset, num_replicas=len(members), rank=me,
                                 shuffle=shuffle, seed=seed, drop_last=drop_last)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=drop_last)
