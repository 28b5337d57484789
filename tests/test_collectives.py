"""The hand-written all-reduces equal dist.all_reduce, send the bytes the theory says, and
turn bad input into the same clear error on every rank (never a hang).

One launch per world size runs every check and returns them; the tests read the results."""
import pytest
import torch
import torch.distributed as dist

import lessonlib
from lessonlib import data_parallel as C
from lessonlib import comm
from lessonlib.costmodel import parameter_server_bytes, ring_allreduce_bytes_per_rank

LENGTHS = (0, 1, 2, 3, 5, 7, 13, 1000, 1001)
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
ALGOS = dict(C.ALGORITHMS, torch=C.torch_all_reduce)


def _values(length, dtype, rank):
    """Small integers, so every dtype sums them exactly whatever the order."""
    return ((torch.arange(length) * (rank + 3)) % 7 + rank).to(dtype)


def _error(fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except ValueError as exc:
        return str(exc)
    return None


def rank_checks():
    rank, n = dist.get_rank(), dist.get_world_size()
    wrong = []
    for name, fn in ALGOS.items():
        for dtype in DTYPES:
            for length in LENGTHS:
                x = _values(length, dtype, rank)
                expected = sum(_values(length, torch.float64, r) for r in range(n))
                fn(x)
                if not torch.equal(x.double(), expected):
                    wrong.append(f"{name} {dtype} length {length}")
        x = torch.randn(37, 5, generator=torch.Generator().manual_seed(rank)).t()  # strided
        ref = x.clone()
        dist.all_reduce(ref)
        fn(x, average=True)
        if not torch.allclose(x, ref / n, atol=1e-6) or x.shape != (5, 37):
            wrong.append(f"{name} average of a transposed tensor")
        ints = torch.arange(6) * (rank + 1)
        fn(ints)
        if not torch.equal(ints, torch.arange(6) * n * (n + 1) // 2):
            wrong.append(f"{name} int64 sum")
    # The ring's halves with chunks cut into slices (empty slices included), and a tensor
    # large enough for ring_all_reduce to slice its chunks itself.
    me, members = C.group_ranks()
    for pieces, length in ((2, 1001), (3, 7), (5, 3)):
        x = _values(length, torch.float64, rank)
        chunks = C.ring_chunks(x, n)
        if n > 1:
            C.ring_reduce_scatter(chunks, me, members, pieces=pieces)
            C.ring_all_gather(chunks, me, members, pieces=pieces)
        if not torch.equal(x, sum(_values(length, torch.float64, r) for r in range(n))):
            wrong.append(f"ring halves with {pieces} pieces, length {length}")
    big = _values(n * C.PIECE_MIN_BYTES // 4 + 5, torch.float32, rank)
    C.ring_all_reduce(big)
    if not torch.equal(big.double(), sum(_values(big.numel(), torch.float64, r) for r in range(n))):
        wrong.append("ring on a tensor whose chunks travel in slices")
    # Rings and the server sum each element once: bit-identical results on every rank.
    identical = {}
    for name in ("ring", "parameter_server"):
        x = torch.randn(1001, generator=torch.Generator().manual_seed(rank))
        ALGOS[name](x, average=True)
        rows = [torch.empty_like(x) for _ in range(n)]
        dist.all_gather(rows, x)
        identical[name] = all(torch.equal(r, rows[0]) for r in rows)
    size = 1200 * 4                           # float32 elements divisible by 1, 2, 3 and 4
    sent = {}
    for name in ALGOS:
        with comm.ledger() as book:
            ALGOS[name](torch.ones(1200), check=False)
        sent[name] = (book.total_bytes("send"), book.total_bytes("recv"), book.count())
    group_result = None
    if n >= 3:
        members = [0, n - 1]
        group = dist.new_group(members)
        if rank in members:
            x = torch.full((10,), float(rank))
            C.ring_all_reduce(x, group=group)
            y = torch.full((10,), float(rank))
            C.parameter_server_all_reduce(y, group=group, server=1)
            group_result = (x[0].item(), y[0].item())
    errors = {}
    if n >= 2:
        for name in ("ring", "parameter_server", "naive_ring"):
            errors[name, "length"] = _error(ALGOS[name], torch.ones(4 + rank))
            errors[name, "dtype"] = _error(ALGOS[name], torch.ones(4, dtype=torch.float64
                                                                   if rank else torch.float32))
        errors["int_average"] = _error(C.ring_all_reduce, torch.ones(4, dtype=torch.int64),
                                       average=True)
        errors["not_a_tensor"] = _error(C.ring_all_reduce, [1.0] if rank == 0 else torch.ones(1))
        errors["bool"] = _error(C.ring_all_reduce, torch.ones(3, dtype=torch.bool))
        errors["server"] = _error(C.parameter_server_all_reduce, torch.ones(3), server=n)
    after = torch.ones(3)
    C.ring_all_reduce(after)                  # the group still works after all those errors
    return {"wrong": wrong, "identical": identical, "sent": sent, "size": size,
            "group": group_result, "errors": errors, "after": after[0].item()}


_RUNS = {}


def results(n):
    if n not in _RUNS:
        _RUNS[n] = lessonlib.launch(rank_checks, n, timeout=180)
    return _RUNS[n]


@pytest.mark.timeout(200)
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_every_algorithm_equals_dist_all_reduce(n):
    for rank, res in enumerate(results(n)):
        assert not res["wrong"], f"rank {rank}: wrong results for {res['wrong']}"
        assert res["identical"] == {"ring": True, "parameter_server": True}
        assert res["after"] == n


@pytest.mark.timeout(200)
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_ledger_bytes_match_theory(n):
    size = results(n)[0]["size"]
    for rank, res in enumerate(results(n)):
        sent = res["sent"]
        assert sent["ring"][0] == ring_allreduce_bytes_per_rank(n, size)
        assert sent["ring"][:2] == (sent["ring"][0], sent["ring"][0])
        assert sent["naive_ring"][:2] == ((n - 1) * size, (n - 1) * size)
        assert sent["torch"] == (0, 0, 1)                    # one all_reduce, no p2p
        server_link = sent["parameter_server"][0] + sent["parameter_server"][1]
        if rank == 0:
            assert server_link == parameter_server_bytes(n, size)
        else:
            assert sent["parameter_server"][:2] == (size, size)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("n", [3, 4])
def test_subgroup_uses_global_ranks(n):
    expected = float(0 + n - 1)
    for rank, res in enumerate(results(n)):
        assert res["group"] == ((expected, expected) if rank in (0, n - 1) else None)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("n", [2, 3])
def test_bad_input_raises_the_same_clear_error_on_every_rank(n):
    res = results(n)
    for key in res[0]["errors"]:
        messages = {r["errors"][key] for r in res}
        assert len(messages) == 1 and None not in messages, (key, messages)
    errors = res[0]["errors"]
    assert "same number of elements" in errors["ring", "length"]
    assert "rank 1: 5" in errors["ring", "length"]
    assert "same dtype" in errors["parameter_server", "dtype"]
    assert "average=True needs a floating-point tensor" in errors["int_average"]
    assert "torch.int64" in errors["int_average"]
    assert "rank(s) [0]" in errors["not_a_tensor"]
    assert "torch.bool" in errors["bool"]
    assert f"server={n}" in errors["server"]


def test_chunks_cover_any_length():
    for length in (0, 1, 5, 12, 13):
        for n in (1, 2, 3, 4, 8):
            chunks = C.ring_chunks(torch.arange(length), n)
            sizes = [c.numel() for c in chunks]
            assert len(chunks) == n and sum(sizes) == length and max(sizes) - min(sizes) <= 1
            assert torch.equal(torch.cat(chunks), torch.arange(length))


def _reduce_scatter_off_by_one(chunks, rank, world_size, send_recv):
    for step in range(world_size - 1):
        send_i, recv_i = (rank - step) % world_size, (rank - step) % world_size
        incoming = torch.empty_like(chunks[recv_i])
        send_recv(chunks[send_i], incoming)
        chunks[recv_i] += incoming


@pytest.mark.timeout(120)
def test_exercise_checkers_say_what_is_wrong():
    from lessonlib.exercises import dp as ex
    verdict = ex.check_reduce_scatter(_reduce_scatter_off_by_one)
    assert not verdict.ok
    assert "rank 0: chunk 1 should hold 70 (chunk 1 summed over all 3 ranks) but holds 10 = " \
           "chunk 1 of rank(s) 0" in verdict
    assert str(verdict).startswith("❌ Not yet: rank 0: chunk 1")
    assert ex.check_reduce_scatter(ex.reference_reduce_scatter).ok


def _stub(chunks, rank, world_size, send_recv):
    raise NotImplementedError


@pytest.mark.timeout(120)
def test_an_untouched_multi_rank_stub_is_your_turn():
    from lessonlib.exercises import dp as ex
    verdict = ex.check_reduce_scatter(_stub)
    assert verdict.ok is None and str(verdict) == (
        "✏️ Your turn: _stub still raises NotImplementedError: write its body in place of that "
        "line and run the cell again.")


@pytest.mark.timeout(120)
def test_sharded_server_checker_knows_the_slips_and_the_ledger_agrees():
    from lessonlib.exercises import dp as ex
    # The theory at its two ends: one server is the parameter server, n servers the ring.
    for n in (2, 3, 4, 8):
        assert ex.reference_sharded_server(n, 1, 1200) == parameter_server_bytes(n, 1200) / 2
        assert ex.reference_sharded_server(n, n, 1200) == ring_allreduce_bytes_per_rank(n, 1200)
    # Real ranks: what the ledger counts is what the formula says, for servers and workers.
    sent = ex.measure_sharded_server(4, (1, 2, 4), 4800)
    for k, per_rank in sent.items():
        assert per_rank[:k] == [ex.reference_sharded_server(4, k, 4800)] * k
        assert per_rank[k:] == [4800] * (4 - k)                 # a worker sends S, in slices
    verdict = ex.check_sharded_server(ex.reference_sharded_server)
    assert verdict.ok and "14,400 at k = 1, 9,600 at k = 2, 7,200 at k = 4" in verdict
    own_slice = ex.check_sharded_server(lambda n, k, s: (n - 1) * s / k, measure=False)
    assert own_slice.ok is False and "only the slice it serves" in own_slice
    both_ways = ex.check_sharded_server(lambda n, k, s: 2 * ex.reference_sharded_server(n, k, s),
                                        measure=False)
    assert "both directions" in both_ways
    single = ex.check_sharded_server(lambda n, k, s: (n - 1) * s, measure=False)
    assert "returned 3600, but the answer is 2,400" in single and "single server" in single
    assert ex.check_sharded_server(None).ok is None
