"""Every message lessonlib sends goes through here, so it can be counted.

What it teaches: parallel training is computation plus communication, and the lesson's
claims about communication ("one all-reduce per MLP forward", "a ring moves 2(n-1)/n of
the data per rank") can be checked by counting. Inside ``with ledger() as book:``
(``lessonlib.instruments.ledger``) each call below appends an ``Event`` (operation, group size, payload
bytes, peer, seconds, and the seconds it held the rank: ``exposed``) to every ledger open on
this rank. Each call also leaves a breadcrumb (``breadcrumbs.progress``) and, inside a launch,
an entry in the flight recorder's ring (``flight_recorder``), so a hang names the collective.

The ledger is also a trace that NCCL's rules can be checked on without a GPU: each event
keeps its dtype, its group (by creation: torch numbers groups "0" for the world, then "1",
"2", ... in ``new_group`` order) and members, its *global* peer or root, its order among
this rank's calls, whether it was posted in one ``batch_isend_irecv`` and when it was
waited on (and whether a send's tensor was written before that); ``new_group`` itself is
recorded. ``nccl_rules.nccl_hazards(ledgers)`` (one ledger per rank) replays them.

The wrappers take the same arguments as ``torch.distributed`` and return the same things;
inside a ledger asynchronous ones return a handle whose ``wait()`` also closes the event's
timing. On a GPU the timing is a pair of CUDA events, read after one synchronize when the
ledger closes (or ``summary()`` is asked), so counting never stalls the queue; on a CPU,
wall clock. Outside a ledger a call costs a breadcrumb and the recorder's two small writes.

Laptop:  ``python -c "import lessonlib as L; print(L.launch(L.comm.demo_ledger, 2))"``
GPU box: the same; under NCCL the payload lives on each rank's GPU.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from lessonlib import device
from lessonlib.instruments import flight_recorder
from lessonlib.instruments.breadcrumbs import progress
from lessonlib.instruments.ledger import Event, TimedWork, batches, books, calls, close, hold, ledger

_groups: dict = {}           # process group -> (name, members): looked up once per group


def _nbytes(tensor_or_list) -> int:
    if isinstance(tensor_or_list, torch.Tensor):
        return tensor_or_list.numel() * tensor_or_list.element_size()
    return sum(_nbytes(t) for t in tensor_or_list)


def _dtype(tensor_or_list) -> str | None:
    if isinstance(tensor_or_list, torch.Tensor):
        return str(tensor_or_list.dtype)
    return _dtype(tensor_or_list[0]) if len(tensor_or_list) else None


def _group(group) -> tuple[str | None, tuple[int, ...]]:
    """(name, members) of a process group (None: the world), looked up once."""
    key = dist.group.WORLD if group is None else group
    if not isinstance(key, dist.ProcessGroup):    # a rank outside the group: torch refuses
        return None, ()
    if key not in _groups:
        _groups[key] = (getattr(key, "group_name", None), tuple(dist.get_process_group_ranks(key)))
    return _groups[key]


def _breadcrumb(name: str, nbytes: int, group, peer) -> None:
    progress(f"{name} of {nbytes} bytes in a group of {len(_group(group)[1])}"
             + (f" with rank {peer}" if peer is not None else ""))


def _event(name: str, payload, group, peer, batch=None, root=None) -> Event:
    nbytes = _nbytes(payload)
    _breadcrumb(name, nbytes, group, peer)
    gname, members = _group(group)
    event = Event(name, len(members), nbytes, peer=peer, dtype=_dtype(payload), ranks=members,
                  order=next(calls), batch=batch, group=gname, root=root)
    event.marks = (device.mark(), None)
    return event


def _shape(payload) -> tuple[int, ...]:
    return tuple(payload.shape) if isinstance(payload, torch.Tensor) else (_nbytes(payload),)


def _flown(name: str, payload, group, peer, async_op: bool, counted):
    """``counted()`` (the call, counted by every open ledger), posted to the flight recorder."""
    ring = flight_recorder.recorder()
    if ring is None:
        return counted()
    entry = ring.post(name, *_group(group), _nbytes(payload), _shape(payload), _dtype(payload), peer)
    return ring.done(entry, counted(), async_op)


def _call(name: str, payload, group, peer, async_op: bool, thunk, root=None):
    return _flown(name, payload, group, peer, async_op,
                  lambda: _counted(name, payload, group, peer, async_op, thunk, root))


def _counted(name: str, payload, group, peer, async_op: bool, thunk, root=None):
    if not books:                     # nothing records: the call and its breadcrumb only
        _breadcrumb(name, _nbytes(payload), group, peer)
        return thunk()
    event = _event(name, payload, group, peer, root=root)
    work = thunk()
    for book in books:
        book.events.append(event)
    if async_op:
        sends = [(event, payload)] if name == "send" else []
        return TimedWork(work, event, sends=sends) if work is not None else None
    _close_blocking([event])
    return work


def _close_blocking(events) -> None:
    """A blocking call (one or several events) held this rank from start to end: once."""
    for event in events:
        close(event)
    if events[0].span is not None:
        hold(events[0], *events[0].span)


def batch_isend_irecv(ops: list) -> list:
    """``dist.batch_isend_irecv``: post a list of ``dist.P2POp`` sends and receives as one
    group (one NCCL group call), so none waits behind another; every op is counted, and
    the handles returned (one per op on gloo, one for the whole group on NCCL) close their
    events' timing when waited on: wait on all of them.

    This is how paired sends and receives must be posted under NCCL (NCCL's user guide,
    "Point-to-point communication": calls that must progress concurrently go in one group).
    ``lessonlib.instruments.nccl_rules`` explains why separate ``irecv`` + ``isend`` can hang."""
    if not ops:
        return []
    ring = flight_recorder.recorder()
    entries = [ring.post(_kind(op), *_group(op.group), _nbytes(op.tensor), _shape(op.tensor),
                         _dtype(op.tensor), op.peer) for op in ops] if ring else []
    works = _batch_counted(ops)
    handles = works if len(works) == len(entries) else works[:1] * len(entries)
    for entry, work in zip(entries, handles):  # gloo: a handle per op; NCCL: one for the group
        ring.done(entry, work, True)
    return works


def _batch_counted(ops: list) -> list:
    if not books:                     # one breadcrumb (the last op's) for the batch
        _breadcrumb(_kind(ops[-1]), _nbytes(ops[-1].tensor), ops[-1].group, ops[-1].peer)
        return dist.batch_isend_irecv(list(ops))
    batch = next(batches)
    events = [_event(_kind(op), op.tensor, op.group, op.peer, batch) for op in ops]
    works = dist.batch_isend_irecv(list(ops))
    for book in books:
        book.events.extend(events)
    sends = [(e, op.tensor) for e, op in zip(events, ops) if e.op == "send"]
    if len(works) == len(events):          # gloo: one handle per op
        return [TimedWork(w, e, sends=[s for s in sends if s[0] is e])
                for w, e in zip(works, events)]
    return [TimedWork(w, *events, sends=sends) for w in works]   # NCCL: one for the group


def _kind(op) -> str:
    return "send" if op.op in (dist.isend, dist.send) else "recv"


# ---------------------------------------------------------------- groups
def new_group(ranks=None, **kwargs):
    """``dist.new_group``, recorded: every rank must create every group, in the same order
    (torch.distributed docs, ``new_group``), and the checker holds them to it."""
    group = dist.new_group(ranks, **kwargs)
    members = tuple(sorted(ranks)) if ranks is not None else tuple(range(dist.get_world_size()))
    if books:
        event = Event("new_group", len(members), 0, ranks=members, order=next(calls),
                      group=getattr(group, "group_name", None))
        event.waited = event.order + 1
        for book in books:
            book.events.append(event)
    return group


# ---------------------------------------------------------------- collectives
def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
    return _call("all_reduce", tensor, group, None, async_op,
                 lambda: dist.all_reduce(tensor, op=op, group=group, async_op=async_op))


def broadcast(tensor, src, group=None, async_op=False):
    return _call("broadcast", tensor, group, None, async_op,
                 lambda: dist.broadcast(tensor, src=src, group=group, async_op=async_op), root=src)


def all_gather(tensor_list, tensor, group=None, async_op=False):
    return _call("all_gather", tensor, group, None, async_op,
                 lambda: dist.all_gather(tensor_list, tensor, group=group, async_op=async_op))


def all_gather_into_tensor(output, tensor, group=None, async_op=False):
    return _call("all_gather", tensor, group, None, async_op,
                 lambda: dist.all_gather_into_tensor(output, tensor, group=group, async_op=async_op))


def reduce_scatter_tensor(output, tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
    return _call("reduce_scatter", tensor, group, None, async_op,
                 lambda: dist.reduce_scatter_tensor(output, tensor, op=op, group=group, async_op=async_op))


def all_to_all_single(output, tensor, output_split_sizes=None, input_split_sizes=None,
                      group=None, async_op=False):
    """``dist.all_to_all_single``: rows ``input_split_sizes[i]`` of ``tensor`` go to the
    group's i-th member, ``output_split_sizes[i]`` rows arrive from it (None: equal parts).
    NCCL runs it as one group of a send and a receive per member, and the ledger records it
    so: one batch of sends and receives, which lets the checker meet each send with its
    receive's size (the sends add up to the bytes this rank sent)."""
    def thunk():
        return dist.all_to_all_single(output, tensor, output_split_sizes, input_split_sizes,
                                      group=group, async_op=async_op)

    def counted():
        if not books:
            _breadcrumb("all_to_all", _nbytes(tensor), group, None)
            return thunk()
        members, batch = _group(group)[1], next(batches)
        events = [_event(kind, chunk, group, peer, batch)
                  for kind, rows, sizes in (("send", tensor, input_split_sizes),
                                            ("recv", output, output_split_sizes))
                  for peer, chunk in zip(members, rows.split(
                      list(sizes) if sizes else max(rows.shape[0] // len(members), 1)))]
        work = thunk()
        for book in books:
            book.events.extend(events)
        if async_op:
            return TimedWork(work, *events) if work is not None else None
        _close_blocking(events)
        return work

    return _flown("all_to_all", tensor, group, None, async_op, counted)


def all_to_all(output_tensor_list, input_tensor_list, group=None, async_op=False):
    return _call("all_to_all", input_tensor_list, group, None, async_op,
                 lambda: dist.all_to_all(output_tensor_list, input_tensor_list, group=group,
                                         async_op=async_op))


def barrier(group=None):
    """``dist.barrier``; under NCCL it names this rank's GPU (``device_ids``), so torch
    neither guesses the device nor warns, and the process group stays in lazy mode (giving
    ``init_process_group`` a ``device_id``, as the warning suggests, would switch NCCL to
    eager mode: ``lessonlib.instruments.nccl_rules``, rule 1)."""
    ids = device.barrier_device_ids()
    return _call("barrier", [], group, None, False,
                 lambda: dist.barrier(group=group, device_ids=ids))


# Python objects travel pickled inside torch: they count as calls of 0 bytes.
def gather_object(obj, object_gather_list=None, dst=0, group=None):
    return _call("gather_object", [], group, None, False,
                 lambda: dist.gather_object(obj, object_gather_list, dst=dst, group=group), root=dst)


def all_gather_object(object_list, obj, group=None):
    return _call("all_gather_object", [], group, None, False,
                 lambda: dist.all_gather_object(object_list, obj, group=group))


def broadcast_object_list(object_list, src=0, group=None):
    return _call("broadcast_object", [], group, None, False,
                 lambda: dist.broadcast_object_list(object_list, src=src, group=group), root=src)


# ---------------------------------------------------------------- point to point
def send(tensor, dst, group=None):
    return _call("send", tensor, group, dst, False,
                 lambda: dist.send(tensor, dst=dst, group=group))


def recv(tensor, src, group=None):
    return _call("recv", tensor, group, src, False,
                 lambda: dist.recv(tensor, src=src, group=group))


def isend(tensor, dst, group=None):
    return _call("send", tensor, group, dst, True,
                 lambda: dist.isend(tensor, dst=dst, group=group))


def irecv(tensor, src, group=None):
    return _call("recv", tensor, group, src, True,
                 lambda: dist.irecv(tensor, src=src, group=group))


def send_op(tensor, dst: int, group=None):
    """A send for ``batch_isend_irecv`` (``dst`` a global rank)."""
    return dist.P2POp(dist.isend, tensor, dst, group=group)


def recv_op(tensor, src: int, group=None):
    """A receive for ``batch_isend_irecv`` (``src`` a global rank)."""
    return dist.P2POp(dist.irecv, tensor, src, group=group)


def demo_ledger() -> dict:
    """One all-reduce of 1000 float32 values, recorded: 1 call, 4000 bytes."""
    x = torch.ones(1000, device=device.current_device())
    with ledger() as book:
        all_reduce(x)
    return {"sum": x[0].item(), **book.summary()}
