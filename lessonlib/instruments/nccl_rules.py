"""NCCL's rules, checked on recorded traces: would this run hang on GPUs?

What it teaches: a program that runs on CPU ranks (gloo) can still hang on its first GPU
run, because NCCL plays by stricter rules. ``nccl_hazards(ledgers)`` takes one
``ledger.Ledger`` per rank (or a list of its events) and replays the calls under the rules
below, as NCCL and PyTorch document them; it returns, in plain words, every place where a
rank would wait forever, and every call whose partners do not fit. It never raises: a trace
it cannot read gets a sentence starting "trace:". An empty list means none of the modelled
hazards is present (not a proof that nothing else can go wrong).

Only what goes through ``lessonlib.comm`` is in a trace: PyTorch's own DDP, FSDP2,
pipelining and DeviceMesh (the course's references) talk to the process group around it.

A communicator is known by its creation, not its members: every ``new_group`` makes a new
one, even with the world's members (torch numbers groups "0" for the world, then "1", "2",
... in creation order; ``comm`` records the name and ``comm.new_group`` the creation).

The rules modelled (PyTorch's and NCCL's, cited; "assumed" where the checker's author chose):

0. Every rank creates every group, members or not, in the same order (torch.distributed
   docs, ``new_group``: "groups should be created in the same order in all processes").
1. Two modes, as ``init_process_group`` is called (its docs, ``device_id``). *Lazy* (no
   ``device_id``): a communicator is created on first use, and creating one blocks the host
   until every member has arrived (NCCL API, ``ncclCommInitRank``: it "implicitly
   synchronizes with other ranks"). A collective or a ``batch_isend_irecv`` uses the
   group's communicator (torch docs, ``batch_isend_irecv``: if it is the first call on the
   group, all ranks of the group must take part); an unbatched ``isend``/``irecv``/``send``/
   ``recv`` to a new peer creates a two-rank communicator for that pair. *Eager*
   (``device_id`` given): the world's communicator is made at once and each ``new_group``
   splits it (``ncclCommSplit``, a call every rank of the world makes, in order with its
   other collectives there); point-to-point, batched or not, uses the group's communicator.
2. Each communicator has one CUDA stream per rank, and work on a stream runs in order
   (NCCL user guide, "CUDA Stream Semantics"). A receive holds its stream until its send
   arrives; a send may hold it until its receive is posted, since NCCL promises no
   buffering (assumed never to buffer, as MPI's definition of a "safe" program does). Two
   ranks that each queue ``irecv`` before ``isend`` to each other therefore wait on each
   other (NVIDIA/nccl issues 479 and 783; pytorch/pytorch issue 109401).
3. Calls fused in one group (``batch_isend_irecv``) progress independently and never block
   each other (NCCL user guide, "Point-to-point communication"; "Group Calls").
4. A send meets the receive posted in the same order at the other end, and both must have
   the same count and datatype (NCCL user guide, "Point-to-point communication").
5. Every member of a group calls the same collectives in the same order, with the same
   count, datatype and root (NCCL user guide, "Creating a Communicator"; ``ncclBroadcast``'s
   root is the same on all ranks); all-to-all's splits and the object collectives' pickled
   sizes may differ between ranks. Barriers are collectives (ProcessGroupNCCL runs one as
   an all-reduce of one element); ``gather_object``, ``all_gather_object`` and
   ``broadcast_object_list`` are one collective each here (torch runs two).
6. Across groups, collectives run in one order on every rank (torch docs, ``new_group``:
   "the user must ensure a globally consistent execution order of collectives across
   ranks"): two ranks that share two groups reach their calls there in the same order.
7. ``work.wait()`` makes the current stream wait for that call, so a call posted after the
   wait starts only when the waited call is done (torch.distributed docs, ``Work.wait``).

8-10. What a rank leaves in flight (``lessonlib.instruments.nccl_inflight``): work outstanding on one
   communicator at a time (NCCL user guide, "Using multiple NCCL communicators
   concurrently"; NVIDIA/nccl issue 783), every receive waited on before it is read, every
   send waited on before its buffer is written.

Each entry point's mode (``ENTRY_POINTS``; a test reads the sources): every one is lazy, as
the process groups are made (``launcher.rank``, ``launcher.torchrun``). The pipeline posts
its transfers as batches on its group's communicator, which is the same in both modes
(tests/test_nccl_rules.py replays every scheme's trace in both).

Laptop:  ``python -m lessonlib.instruments.nccl_rules`` (two rings of 3 ranks: irecv-first, batched)
GPU box: nothing to run: the point is to find such hangs before a GPU is at hand.
"""
from __future__ import annotations

from lessonlib.instruments.nccl_inflight import in_flight
from lessonlib.instruments.nccl_replay import creation, matching, streams, to_ops
from lessonlib.instruments.nccl_trace import created_in_order, malformed, normalized

# where init_process_group is called, and the mode it gets (rule 1)
ENTRY_POINTS = {"lessonlib/launcher/rank.py": "lazy", "lessonlib/launcher/torchrun.py": "lazy",
                "labs/minimal_ddp.py": "lazy"}
MODES = ("lazy", "eager")


def nccl_hazards(ledgers, mode: str | None = None) -> list[str]:
    """Every hazard NCCL would turn into a hang (or a garbled message) in these traces.

    ``ledgers``: one per rank, in rank order (``ledger.Ledger`` or a list of ``ledger.Event``);
    events need ``op``, ``peer`` (global), ``bytes``, ``dtype``, ``ranks``, ``order``,
    ``batch`` and ``waited`` as ``comm`` records them (``group`` and ``root`` where known).
    ``mode``: "lazy" or "eager" (rule 1); by default the ledgers' own (lazy for lists).
    Returns plain sentences starting with "hang:", "mismatch:", "order:", "race:" (a
    buffer read or written while NCCL may still use it) or "trace:"; an empty list when
    none is found."""
    try:
        ledgers = list(ledgers)
    except TypeError:
        return [f"trace: expected one ledger per rank, got {type(ledgers).__name__}"]
    if mode is None:
        mode = next((getattr(x, "mode") for x in ledgers if getattr(x, "mode", None) in MODES),
                    "lazy")
    if mode not in MODES:
        return [f"trace: mode={mode!r} is not one of {MODES}"]
    calls, problems = normalized(ledgers)
    problems = problems or malformed(calls)
    if problems:
        return problems
    hazards = created_in_order(calls)
    if hazards:
        return hazards
    ops = to_ops(calls, mode)
    hazards = creation(ops, mode)
    if hazards:
        return hazards
    partner, index, hazards = matching(ops)
    return hazards or streams(ops, partner, index) or in_flight(ops)


if __name__ == "__main__":
    from types import SimpleNamespace as Call

    def ring(n: int, batched: bool) -> list[list]:
        def call(r, i, op, peer):
            return Call(op=op, peer=peer, bytes=16, dtype="torch.float32", ranks=(),
                        order=i, batch=0 if batched else None, waited=2)
        return [[call(r, 0, "recv", (r - 1) % n), call(r, 1, "send", (r + 1) % n)]
                for r in range(n)]

    for batched in (False, True):
        print("batched:" if batched else "irecv, then isend:")
        print("\n".join(nccl_hazards(ring(3, batched))) or "no hazard")
