"""What the data-parallel lesson measures of a step, kept out of ``DataParallel``: its recorder.

What it teaches: the bucketed rung's core (``ddp.DataParallel``) only launches and waits on
all-reduces; it tells the recorder it is handed when a gradient arrives (``poll``), scopes
each bucket's launch (``launching``) and the end of backward (``finishing``), and records
nothing when it is handed none. ``BucketRecorder`` is the one that measures: ``device.mark``
stamps of when backward finished computing and, per bucket, when its all-reduce was launched
and first seen finished; ``ladder_runs.step_timeline`` turns them into the lesson's bars.

Laptop:  ``python -c "import lessonlib as L; print(L.launch(L.data_parallel.ladder_runs.demo, 2))"``
GPU box: the same; the stamps are CUDA events, read with one synchronize.
"""
from __future__ import annotations

from contextlib import contextmanager, nullcontext

from lessonlib import device


class _NoRecord:
    """The recorder that records nothing: ``DataParallel``'s default."""

    def poll(self, buckets) -> None:
        pass

    def launching(self, i: int, bucket):
        return nullcontext()

    def finishing(self, buckets):
        return nullcontext()

    def read(self) -> dict:
        return {}


no_record = _NoRecord()


class _Stamped:
    """An all-reduce's handle that tells the timeline when it is waited on."""

    def __init__(self, handle, done):
        self.handle, self.done = handle, done

    def is_completed(self) -> bool:
        return self.handle.is_completed()

    def wait(self):
        self.handle.wait()
        self.done()


class BucketRecorder:
    """The lesson's instrument, handed to ``DataParallel``: when backward finished computing
    and, per bucket, when its all-reduce was launched and when it was first seen finished
    (at the next gradient hook, or when waited on at the end of backward). ``device.mark``
    stamps: seconds on CPU, CUDA events on a GPU (turned into seconds, one synchronize, by
    ``read``)."""

    def __init__(self):
        self.last: dict = {}
        self._start()

    def _start(self) -> None:
        self.computed_at, self.launched_at, self.done_at = None, {}, {}

    @contextmanager
    def launching(self, i: int, bucket):
        self.launched_at[i] = device.mark()
        yield
        bucket.handle = _Stamped(bucket.handle, lambda: self._done(i))

    def poll(self, buckets) -> None:
        """Stamp buckets seen finished (they finish in launch order: check the oldest)."""
        i = len(self.done_at)
        while i < len(self.launched_at) and buckets[i].handle.is_completed():
            self.done_at[i] = device.mark()
            i += 1

    def _done(self, i: int) -> None:
        if i not in self.done_at:
            self.done_at[i] = device.mark()

    @contextmanager
    def finishing(self, buckets):
        """The end of backward: stamped on entry; on exit this backward's timeline is kept
        as ``last`` and the next one starts afresh."""
        self.computed_at = device.mark()
        yield
        self.last = {"backward_computed_at": self.computed_at, "buckets": [
            {"bucket": i, "bytes": b.nbytes, "params": len(b.params),
             "launched_at": self.launched_at.get(i), "done_at": self.done_at.get(i)}
            for i, b in enumerate(buckets)]}
        self._start()

    def read(self) -> dict:
        """The last synced backward's timeline, in ``time.perf_counter`` seconds."""
        line = self.last
        if line and not isinstance(line["backward_computed_at"], float):   # CUDA events
            buckets = line["buckets"]
            marks = device.on_clock([line["backward_computed_at"]] + [
                m for b in buckets for m in (b["launched_at"], b["done_at"])])
            line = self.last = {"backward_computed_at": marks[0], "buckets": [
                {**b, "launched_at": a, "done_at": d}
                for b, a, d in zip(buckets, marks[1::2], marks[2::2])]}
        return line
