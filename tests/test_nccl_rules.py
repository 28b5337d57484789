"""NCCL's rules, checked on CPU: ``nccl_rules.nccl_hazards`` flags hand-written traces that would
hang on GPUs and passes ones that would not; then it replays the recorded traces of every
scheme at its CPU world sizes: the rings and the pipeline as they were are flagged, the
code as it is passes. Also: a pipeline run's tensors live on ``current_device()``, and
SLURM's variables bind each task to the right GPU (pure, environment patched)."""
import pytest

import lessonlib
import nccl_workers as W
from lessonlib import device
from lessonlib.instruments.ledger import Event, TimedWork
from lessonlib.instruments.nccl_rules import MODES, nccl_hazards


def trace(*calls, waited_at_end: bool = True) -> list:
    """One rank's calls, in order: (op, peer) or (op, peer, {field: value}). Every call is
    waited on after the last one is posted (as ``exchange`` did), unless a field says when."""
    events = []
    for i, (op, peer, *extra) in enumerate(calls):
        fields = {"dtype": "torch.float32", "waited": len(calls) if waited_at_end else None,
                  **(extra[0] if extra else {})}
        events.append(Event(op, 2, fields.pop("bytes", 16), peer=peer, order=i, **fields))
    return events


def ring(n: int, first: str, batched: bool = False) -> list[list]:
    """Every rank of an n-rank ring receives from its left and sends to its right."""
    b = {"batch": 0} if batched else {}
    calls = {"recv": lambda r: ("recv", (r - 1) % n, b), "send": lambda r: ("send", (r + 1) % n, b)}
    second = "send" if first == "recv" else "recv"
    return [trace(calls[first](r), calls[second](r)) for r in range(n)]


# ---------------------------------------------------------------- hand-written traces
@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("first", ["recv", "send"])
def test_an_unbatched_ring_hangs_whichever_call_comes_first(n, first):
    hazards = nccl_hazards(ring(n, first))
    assert hazards and all(h.startswith("hang:") for h in hazards), hazards
    # 2 ranks share one communicator: the receive waits on its stream; 3+ ranks block creating
    assert ("stream" if n == 2 else "creating") in hazards[0], hazards[0]


@pytest.mark.parametrize("n", [2, 3, 4])
def test_a_batched_ring_does_not_hang(n):
    assert nccl_hazards(ring(n, "recv", batched=True)) == []


def test_two_ranks_in_matching_order_do_not_hang():
    assert nccl_hazards([trace(("send", 1), ("recv", 1)), trace(("recv", 0), ("send", 0))]) == []


def test_a_send_and_its_receive_must_agree_on_size_and_dtype():
    sizes = nccl_hazards([trace(("send", 1, {"bytes": 16})), trace(("recv", 0, {"bytes": 8}))])
    dtypes = nccl_hazards([trace(("send", 1)), trace(("recv", 0, {"dtype": "torch.bfloat16"}))])
    assert len(sizes) == 1 and "16 bytes" in sizes[0] and "8 bytes" in sizes[0]
    assert len(dtypes) == 1 and "torch.bfloat16" in dtypes[0] and dtypes[0].startswith("mismatch")


def test_a_send_nobody_receives_is_a_hang():
    hazards = nccl_hazards([trace(("send", 1), ("send", 1)), trace(("recv", 0))])
    assert hazards and "sends 2 message(s)" in hazards[0]


def test_collectives_reached_in_different_orders_are_flagged():
    same = [trace(("all_reduce", None), ("broadcast", None)) for _ in range(3)]
    swapped = same[:2] + [trace(("broadcast", None), ("all_reduce", None))]
    assert nccl_hazards(same) == []
    hazards = nccl_hazards(swapped)
    assert len(hazards) == 1 and hazards[0].startswith("order:") and "rank 2: broadcast" in hazards[0]


def test_a_rank_that_skips_a_group_collective_is_flagged():
    group = {"ranks": (0, 1)}
    hazards = nccl_hazards([trace(("all_reduce", None, group)), trace(), trace()])
    assert hazards and "rank 1" in hazards[0]


def test_a_call_posted_after_a_wait_starts_after_it():
    # Each rank waits on its receive before it posts its send (both batched, so one stream):
    # nothing is ever sent. The same calls with the waits after both posts are fine.
    def rank(peer, waited):
        return [Event("recv", 2, 16, peer=peer, dtype="torch.float32", order=0, batch=0,
                      waited=waited),
                Event("send", 2, 16, peer=peer, dtype="torch.float32", order=1, batch=1,
                      waited=2)]
    assert nccl_hazards([rank(1, 1), rank(0, 1)])
    assert nccl_hazards([rank(1, 2), rank(0, 2)])          # one stream, recv first: still bad


# ---------------------------------------------------------------- what is left in flight
def _pair_all_reduces(waited_at_end: bool) -> list[list]:
    """Groups (0, 1), (1, 2), (2, 0), each given an asynchronous all-reduce; every rank
    waits on both at the end, or (not waited_at_end) on each before posting the next."""
    groups = {"01": (0, 1), "12": (1, 2), "20": (0, 2)}
    mine = {0: ("01", "20"), 1: ("01", "12"), 2: ("12", "20")}
    made = [("new_group", None, {"ranks": m, "group": n, "bytes": 0, "waited": i + 1})
            for i, (n, m) in enumerate(groups.items())]
    return [trace(*made, *[("all_reduce", None, {"group": g, "ranks": groups[g],
                                                 "waited": 5 if waited_at_end else 4 + i})
                           for i, g in enumerate(mine[r])]) for r in range(3)]


def test_a_cycle_of_asynchronous_all_reduces_over_three_pairs_is_flagged():
    hazards = nccl_hazards(_pair_all_reduces(waited_at_end=True))
    assert len(hazards) == 3 and all(h.startswith("hang:") for h in hazards), hazards
    assert "two communicators at once" in hazards[0] and "nccl issue 783" in hazards[0], hazards
    assert nccl_hazards(_pair_all_reduces(waited_at_end=False)) == []


def test_a_receive_never_waited_on_is_flagged():
    hazards = nccl_hazards([trace(("send", 1, {"batch": 0, "waited": 1})),
                            trace(("recv", 0, {"batch": 0, "waited": None}))])
    assert len(hazards) == 1 and hazards[0].startswith("race: rank 1") and "never waited" in hazards[0]


@pytest.mark.parametrize("fields", [{"waited": None}, {"waited": 1, "written": True}])
def test_a_send_whose_buffer_may_be_written_in_flight_is_flagged(fields):
    hazards = nccl_hazards([trace(("send", 1, {"batch": 0, **fields})),
                            trace(("recv", 0, {"batch": 0, "waited": 1}))])
    assert len(hazards) == 1 and hazards[0].startswith("race: rank 0's batched send"), hazards


def test_comm_marks_a_send_whose_tensor_is_written_before_its_wait():
    import torch

    class Done:
        def wait(self, timeout=None):
            return True

    for write in (False, True):
        buf, event = torch.zeros(4), Event("send", 2, 16, order=0)
        work = TimedWork(Done(), event, sends=[(event, buf.detach())])
        if write:
            buf.add_(1)
        work.wait()
        assert event.written is write
    # a slice of a larger buffer shares its version counter: writes beside it are not its
    buf, event = torch.zeros(8), Event("send", 2, 16, order=0)
    work = TimedWork(Done(), event, sends=[(event, buf[:4])])
    buf[4:].add_(1)
    work.wait()
    assert event.written is False


# ---------------------------------------------------------------- recorded traces
def _hazards(per_rank: list[dict]) -> dict:
    """Each scheme's hazards in lazy mode (the course's), and in eager mode (``device_id``
    given to ``init_process_group``) for the code as it is, under "<name> (eager)"."""
    assert all(r[name] for r in per_rank for name in r), "a rank recorded no call"
    out = {}
    for name in per_rank[0]:
        for mode in ("lazy",) if name.startswith("old") else MODES:
            out[name + (" (eager)" if mode == "eager" else "")] = nccl_hazards(
                [r[name] for r in per_rank], mode=mode)
    return out


def _old_and_new(per_rank: list[dict]) -> tuple[dict, dict]:
    hazards = _hazards(per_rank)
    return ({k: v for k, v in hazards.items() if k.startswith("old")},
            {k: v for k, v in hazards.items() if not k.startswith("old")})


@pytest.mark.timeout(300)
@pytest.mark.parametrize("n", [2, 3, 4])
def test_the_rings_as_they_were_are_flagged_and_as_they_are_pass(n):
    old, new = _old_and_new(lessonlib.launch(W.rings, n, timeout=240))
    assert len(old) == 2 and all(old.values()), old
    names = {"exercise", "ring", "naive_ring", "parameter_server", "ring_sliced"}
    assert set(new) == names | {f"{name} (eager)" for name in names}
    assert not any(new.values()), new


@pytest.mark.timeout(300)
@pytest.mark.parametrize("p", [2, 3, 4])
def test_every_pipeline_schedule_passes_in_both_modes(p):
    """The executor posts batches on the pipeline's group: one communicator in either mode
    (the unbatched executor's interleaved warm-up hung in eager mode at p >= 3, and at
    p >= 3 every schedule left receives in flight on two links' communicators)."""
    hazards = _hazards(lessonlib.launch(W.pipelines, p, timeout=240))
    assert len(hazards) == 14 and not any(hazards.values()), hazards


@pytest.mark.timeout(300)
@pytest.mark.parametrize("n", [2, 4])
def test_data_tensor_and_model_parallel_pass(n):
    hazards = _hazards(lessonlib.launch(W.others, n, timeout=180))
    assert not any(hazards.values()), hazards


@pytest.mark.timeout(300)
def test_hybrid_layouts_pass():
    hazards = _hazards(lessonlib.launch(W.hybrids, 4, [(1, 2, 2), (2, 2, 1)], timeout=240))
    assert len(hazards) == 4 and not any(hazards.values()), hazards


# ---------------------------------------------------------------- where tensors live
@pytest.mark.timeout(120)
@pytest.mark.parametrize("p", [1, 2])
def test_a_pipeline_run_keeps_every_tensor_on_the_current_device(p):
    for stage in lessonlib.launch(W.where_pipeline_tensors_live, p, timeout=60):
        assert stage["inputs"] and stage["params"]
        assert set(stage["inputs"] + stage["params"] + stage["grads"]) == {stage["current"]}


# ---------------------------------------------------------------- SLURM binding
def test_local_rank_falls_back_to_slurm_localid():
    assert device.local_rank({"SLURM_LOCALID": "3", "SLURM_PROCID": "11"}) == 3
    assert device.local_rank({"LOCAL_RANK": "1", "SLURM_LOCALID": "3"}) == 1
    assert device.local_rank({}) == 0


def test_one_gpu_bound_per_task_is_enough():
    srun = {"SLURM_PROCID": "5", "SLURM_LOCALID": "5"}
    assert device.ranks_per_gpu_set(8, {**srun, "SLURM_GPUS_PER_TASK": "1"}) == 1
    assert device.ranks_per_gpu_set(8, {**srun, "SLURM_GPU_BIND": "single:1"}) == 1
    assert device.ranks_per_gpu_set(8, srun) == 8                 # tasks share the node's GPUs
    assert device.ranks_per_gpu_set(8, {"SLURM_GPUS_PER_TASK": "1"}) == 8   # not an srun task


def test_a_task_that_sees_one_gpu_uses_it_whatever_the_variables_say(monkeypatch):
    monkeypatch.setattr(device, "gpu_count", lambda: 1)
    task = {"SLURM_PROCID": "5", "SLURM_LOCALID": "5"}        # cgroups bind it: no variable
    assert device.ranks_per_gpu_set(8, task) == 1
    assert device.resolve_backend("auto", device.ranks_per_gpu_set(8, task)) == "nccl"
    assert device.resolve_backend("nccl", device.ranks_per_gpu_set(8, task)) == "nccl"
    assert device.ranks_per_gpu_set(8, {}) == 8              # torchrun ranks sharing one GPU


def test_auto_takes_nccl_with_one_bound_gpu_per_task(monkeypatch):
    monkeypatch.setattr(device, "gpu_count", lambda: 1)
    env = {"SLURM_PROCID": "3", "SLURM_LOCALID": "3", "SLURM_GPUS_PER_TASK": "1"}
    assert device.resolve_backend("auto", device.ranks_per_gpu_set(4, env)) == "nccl"
    assert device.resolve_backend("auto", device.ranks_per_gpu_set(4, {})) == "gloo"


@pytest.mark.timeout(120)
def test_pipeline_stages_that_disagree_on_the_dtype_both_refuse():
    errors = lessonlib.launch(W.link_disagreement, 2, timeout=60)
    assert all(e and "disagree" in e and "torch.float64" in e for e in errors), errors


def test_the_sbatch_templates_pass_cpus_per_task_on_to_srun():
    from pathlib import Path

    for name in ("srun", "torchrun"):
        text = (Path(__file__).parent.parent / "labs" / "slurm" / f"{name}.sbatch").read_text()
        exported = text.index("export SRUN_CPUS_PER_TASK=")
        assert "$SLURM_CPUS_PER_TASK" in text[exported:exported + 80]
        assert exported < text.index("\nsrun "), name


def test_the_placement_audit_names_compute_off_the_ranks_gpu(tmp_path, monkeypatch):
    import torch
    import torch.nn.functional as F

    from lessonlib.instruments import placement

    monkeypatch.setattr(placement, "current_device", lambda: torch.device("cuda", 0))
    monkeypatch.setattr(placement.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(placement.sys, "argv", ["labs/pp.py"])
    with placement._OffDevice(tmp_path):
        torch.ones(2, 2) + 1                      # not compute: not watched
        F.linear(torch.ones(2, 3), torch.ones(4, 3))   # making data, not the model's compute
        assert placement.findings(tmp_path) == []
        F.linear(torch.ones(2, 3), torch.ones(4, 3, requires_grad=True))
    found = placement.findings(tmp_path, "pp")
    assert len(found) == 1 and "linear got a tensor on cpu, not cuda:0" in found[0]
