"""Every rung of the data-parallel ladder, and PyTorch's DDP, trains exactly like one process
on the full batch; the ledger shows one all-reduce per bucket per step; bad input fails
clearly on every rank.

Ranks start from *different* random weights (so a passing test proves the broadcast), train
5 SGD steps on their own shards, and are compared with one process trained on the full
batch (in float64, so the only differences are summation order, ~1e-15). One launch per
world size runs every case; the reference runs here in the test process."""
from contextlib import nullcontext

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import TensorDataset

import lessonlib
from lessonlib import comm
from lessonlib.data_parallel import ladder_runs as dp_runs
from lessonlib.data import corpus_tokens, lm_batch, shard
from lessonlib.data_parallel import DataParallel, plan_buckets, sharded_loader
from lessonlib.data_parallel.ladder import replicate, trainable_parameters
from lessonlib.models import GPTConfig, TinyGPT, lm_loss, mlp_stack

CFG = GPTConfig(vocab=27, seq=8, hidden=16, heads=2, layers=2)
STEPS, BATCH, MICRO, LR = 5, 12, 3, 0.5
EXAMPLES, PER_RANK, EPOCHS = 48, 4, 2


def _model(seed, tie=False, freeze=False):
    model = TinyGPT(CFG, seed).double()
    if tie:
        model.head.out.weight = model.embed.tok.weight      # one parameter, used twice
    if freeze:
        model.embed.pos.weight.requires_grad_(False)
    return model


def _batch(step, size):
    tokens, _ = corpus_tokens()
    return lm_batch(tokens, size, CFG.seq, step, seed=1)


def _optimizer(model):
    return torch.optim.SGD(trainable_parameters(model), lr=LR, momentum=0.9)


def _weights(model):
    return nn.utils.parameters_to_vector(model.parameters()).detach().clone()


def caps_for(model):
    """bucket_cap_mb values giving 1 bucket, exactly 2, 3 or more, and one per parameter."""
    params = trainable_parameters(model)
    total = sum(p.numel() * p.element_size() for p in params) / 2 ** 20
    two = next(total * f for f in (0.5, 0.6, 0.7, 0.8, 0.9)
               if len(plan_buckets(params, int(total * f * 2 ** 20))) == 2)
    return {"one": total * 1.01, "two": two, "several": total / 4, "per_parameter": 1e-6}


# ---------------------------------------------------------------- the reference: one process
def reference(tie=False, freeze=False, accumulate=1):
    model = _model(100, tie, freeze)
    opt = _optimizer(model)
    for step in range(STEPS):
        x, y = _batch(step, BATCH * accumulate)
        opt.zero_grad()
        lm_loss(model(x), y).backward()
        opt.step()
    return _weights(model)


def reference_sampler(n):
    x, y = _batch(999, EXAMPLES)
    model = _model(100)
    opt = _optimizer(model)
    for epoch in range(EPOCHS):
        order = torch.randperm(EXAMPLES, generator=torch.Generator().manual_seed(3 + epoch))
        for idx in order.split(PER_RANK * n):              # the global batch of n ranks
            opt.zero_grad()
            lm_loss(model(x[idx]), y[idx]).backward()
            opt.step()
    return _weights(model)


# ---------------------------------------------------------------- the ranks
def _replica(rung, cap=25.0, tie=False, freeze=False, accumulate=1):
    rank, n = dist.get_rank(), dist.get_world_size()
    model = _model(100 + rank, tie, freeze)
    start = _weights(model)
    ddp, after_backward = dp_runs.wrap(rung, model, bucket_cap_mb=cap)
    opt = _optimizer(model)
    per_step = []
    for step in range(STEPS):
        x, y = (shard(t, rank, n) for t in _batch(step, BATCH * accumulate))
        opt.zero_grad()
        with comm.ledger() as book:
            for i, (xm, ym) in enumerate(zip(x.chunk(accumulate), y.chunk(accumulate))):
                with ddp.no_sync() if i < accumulate - 1 else nullcontext():
                    (lm_loss(ddp(xm), ym) / accumulate).backward()
                if i == accumulate - 2:
                    quiet = book.count()                   # messages while accumulating
            after_backward()
        opt.step()
        per_step.append({"all_reduces": book.count("all_reduce"), "messages": book.count(),
                         "bytes": book.total_bytes("all_reduce"),
                         "quiet": quiet if accumulate > 1 else 0})
    out = {"weights": _weights(model), "start": start, "per_step": per_step}
    if isinstance(ddp, DataParallel):
        line = ddp.timeline
        out["buckets"] = len(ddp.buckets)
        out["first_bucket_holds_last_parameter"] = ddp.buckets[0].params[0] is \
            trainable_parameters(model)[-1]
        out["first_launch_before_backward_done"] = \
            line["buckets"][0]["launched_at"] < line["backward_computed_at"]
    return out


def _sampler_replica():
    x, y = _batch(999, EXAMPLES)
    model = _model(100 + dist.get_rank())
    ddp = DataParallel(model, bucket_cap_mb=0.01)
    opt = _optimizer(model)
    loader = sharded_loader(TensorDataset(x, y), PER_RANK, shuffle=True, seed=3)
    for epoch in range(EPOCHS):
        loader.sampler.set_epoch(epoch)
        for xb, yb in loader:
            opt.zero_grad()
            lm_loss(ddp(xb), yb).backward()
            opt.step()
    return _weights(model)


def _frozen_bias_on_rank_1():
    model = mlp_stack(8, 2)
    model[0].bias.requires_grad_(dist.get_rank() != 1)
    return model


def _error(fn):
    try:
        fn()
    except ValueError as exc:
        return str(exc)
    return None


def parity_suite():
    rank = dist.get_rank()
    out = {rung: _replica(rung) for rung in ("naive", "flat", "async", "torch")}
    for name, cap in caps_for(_model(0)).items():
        out[f"bucketed/{name}"] = _replica("bucketed", cap)
    out["bucketed/tied"] = _replica("bucketed", 0.004, tie=True)
    out["bucketed/frozen"] = _replica("bucketed", 0.004, freeze=True)
    for rung in ("bucketed", "torch"):
        out[f"{rung}/no_sync"] = _replica(rung, 0.004, accumulate=MICRO)
    out["sampler"] = {"weights": _sampler_replica()}
    out["errors"] = {
        "width": _error(lambda: DataParallel(mlp_stack(8 if rank == 0 else 12, 2))),
        "depth": _error(lambda: replicate(mlp_stack(8, 2 + (rank == 1)))),
        "cap": _error(lambda: DataParallel(mlp_stack(8, 2), bucket_cap_mb=0)),
        "frozen": _error(lambda: DataParallel(_frozen_bias_on_rank_1())),
    }
    out["errors"]["after"] = DataParallel(mlp_stack(8, 2)).world_size  # the group still works
    return out


_RUNS = {}


def results(n):
    if n not in _RUNS:
        _RUNS[n] = lessonlib.launch(parity_suite, n, timeout=240)
    return _RUNS[n]


def _close(a, b):
    return (a - b).abs().max().item() < 1e-10


CASES = ["naive", "flat", "async", "torch", "bucketed/one", "bucketed/two",
         "bucketed/several", "bucketed/per_parameter"]


@pytest.mark.timeout(260)
@pytest.mark.parametrize("n", [2, 3])
def test_every_rung_matches_one_process(n):
    ref = reference()
    for case in CASES:
        for rank, res in enumerate(results(n)):
            assert _close(res[case]["weights"], ref), f"{case}, rank {rank}"
            if rank:
                assert not _close(res[case]["start"], results(n)[0][case]["start"])


@pytest.mark.timeout(260)
@pytest.mark.parametrize("n", [2, 3])
def test_one_all_reduce_per_bucket_per_step(n):
    grad_bytes = sum(p.numel() * 8 for p in _model(0).parameters())
    res = results(n)[0]
    assert [res[f"bucketed/{c}"]["buckets"] for c in ("one", "two")] == [1, 2]
    assert res["bucketed/several"]["buckets"] >= 3
    assert res["bucketed/per_parameter"]["buckets"] == len(list(_model(0).parameters()))
    for case in CASES[4:]:
        assert res[case]["first_bucket_holds_last_parameter"]
        for step in res[case]["per_step"]:
            assert step["all_reduces"] == step["messages"] == res[case]["buckets"]
            assert step["bytes"] == grad_bytes
    assert res["bucketed/several"]["first_launch_before_backward_done"]   # overlap
    params = len(list(_model(0).parameters()))
    assert [s["all_reduces"] for s in res["naive"]["per_step"]] == [params] * STEPS
    assert [s["all_reduces"] for s in res["async"]["per_step"]] == [params] * STEPS
    assert [s["all_reduces"] for s in res["flat"]["per_step"]] == [1] * STEPS


@pytest.mark.timeout(260)
@pytest.mark.parametrize("n", [2, 3])
def test_tied_and_frozen_parameters(n):
    tied_ref, frozen_ref = reference(tie=True), reference(freeze=True)
    tied_bytes = sum(p.numel() * 8 for p in _model(0, tie=True).parameters())
    frozen_bytes = sum(p.numel() * 8 for p in trainable_parameters(_model(0, freeze=True)))
    for res in results(n):
        assert _close(res["bucketed/tied"]["weights"], tied_ref)
        assert _close(res["bucketed/frozen"]["weights"], frozen_ref)
        assert res["bucketed/tied"]["per_step"][0]["bytes"] == tied_bytes
        assert res["bucketed/frozen"]["per_step"][0]["bytes"] == frozen_bytes


@pytest.mark.timeout(260)
@pytest.mark.parametrize("n", [2, 3])
def test_no_sync_accumulation_equals_one_large_batch(n):
    ref = reference(accumulate=MICRO)
    for rung in ("bucketed", "torch"):
        for res in results(n):
            assert _close(res[f"{rung}/no_sync"]["weights"], ref), rung
    for step in results(n)[0]["bucketed/no_sync"]["per_step"]:
        assert step["quiet"] == 0                                # nothing sent inside no_sync
        assert step["all_reduces"] == results(n)[0]["bucketed/no_sync"]["buckets"]


@pytest.mark.timeout(260)
@pytest.mark.parametrize("n", [2, 3])
def test_distributed_sampler_path_matches_global_batches(n):
    ref = reference_sampler(n)
    for res in results(n):
        assert _close(res["sampler"]["weights"], ref)


@pytest.mark.timeout(260)
@pytest.mark.parametrize("n", [2, 3])
def test_mismatched_replicas_fail_clearly_on_every_rank(n):
    res = results(n)
    for key in ("width", "depth", "cap", "frozen"):
        assert len({r["errors"][key] for r in res}) == 1, key
    errors = res[0]["errors"]
    assert "parameter #0 (0.weight) differs: rank 0: (8, 8) float32, rank 1: (12, 12) " \
        "float32" in errors["width"]
    assert "parameter #4 differs: rank 0: missing, rank 1: (8, 8) float32" in errors["depth"]
    assert "parameter #1 (0.bias) differs: rank 0: (8,) float32, rank 1: (8,) float32, " \
        "frozen" in errors["frozen"]
    assert "parameter counts rank 0: 4, rank 1: 6" in errors["depth"]
    assert "bucket_cap_mb must be a positive number" in errors["cap"]
    assert errors["after"] == n


# ---------------------------------------------------------------- without processes
def test_plan_buckets_reverse_order_cap_and_dtype():
    params = [torch.zeros(10), torch.zeros(10), torch.zeros(30),
              torch.zeros(5, dtype=torch.float64)]
    assert plan_buckets(params, 80) == [[3], [2], [1, 0]]
    assert plan_buckets(params, 10 ** 6) == [[3], [2, 1, 0]]
    assert plan_buckets(params[:3], 1) == [[2], [1], [0]]
    assert plan_buckets([], 100) == []
    small = [torch.zeros(10), torch.zeros(10), torch.zeros(30)]
    assert plan_buckets(small, 10 ** 6) == [[2, 1, 0]]
    assert plan_buckets(small, 10 ** 6, first_cap_bytes=100) == [[2], [1, 0]]   # PyTorch: 1 MiB


@pytest.mark.parametrize("cap", [0, -1, float("nan"), float("inf"), "25", True, None])
def test_bad_bucket_cap_is_rejected_before_any_communication(cap):
    with pytest.raises(ValueError, match="bucket_cap_mb must be a positive number"):
        DataParallel(mlp_stack(4, 1), bucket_cap_mb=cap)
    with pytest.raises(ValueError, match="first_bucket_mb must be a positive number"):
        DataParallel(mlp_stack(4, 1), first_bucket_mb=cap)


def test_unknown_rung_is_rejected():
    with pytest.raises(ValueError, match="must be a non-empty list drawn from"):
        dp_runs.check_rungs(["fast"])
