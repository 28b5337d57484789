"""A claim prints its sentence when it holds and fails the cell when it does not. Pure."""
import pytest

from lessonlib.instruments.claims import ClaimFailed, claim, within
from lessonlib.viz.source import lab, show


def test_a_true_claim_is_printed(capsys):
    claim("the ring beats the server", 3.0 < 9.0, numbers="3.0 ms vs 9.0 ms")
    assert "the ring beats the server (3.0 ms vs 9.0 ms)" in capsys.readouterr().out


def test_a_false_claim_fails_naming_the_sentence(capsys):
    with pytest.raises(ClaimFailed, match="the ring beats the server"):
        claim("the ring beats the server", False)
    with pytest.raises(ClaimFailed, match=r"\+50.0%"):
        within("the step time", 1.5, 1.0, 0.15)
    assert within("the step time", 1.1, 1.0, 0.15) is None
    assert "+10.0%" in capsys.readouterr().out


def test_show_gives_the_source_and_where_it_lives():
    src = show(claim)
    assert src.where.startswith("lessonlib/instruments/claims.py, line ")
    assert "def claim(" in repr(src) and "<span" in src._repr_html_()


def test_a_lab_is_shown_from_its_own_file_without_running_it():
    src = show(lab("minimal_ddp").main)
    assert src.where.startswith("labs/minimal_ddp.py, line ")
    assert "DistributedSampler" in repr(src)
    with pytest.raises(ValueError, match=r"no labs/nope\.py; the labs are: .*minimal_ddp"):
        lab("nope")


def test_a_bound_claim_writes_its_sentence_from_its_bound(capsys):
    from lessonlib.instruments.claims import at_least, at_most, every
    at_least("the last rank's CPU time over the first's", 1.83, 1.5)
    at_most("the exposed share", 0.04, 0.1, unit="")
    every("ring attention equals SDPA", {"c = 1": 0.0, "c = 2": 1e-13}, lambda d: d < 1e-12)
    out = capsys.readouterr().out
    assert "the last rank's CPU time over the first's is at least 1.5 (measured 1.83)" in out
    assert "the exposed share is at most 0.1 (measured 0.04)" in out
    assert "ring attention equals SDPA, for every one of c = 1, c = 2" in out
    with pytest.raises(ClaimFailed, match="is at least 2., but it is false here: measured 1.83"):
        at_least("the ratio", 1.83, 2)
    with pytest.raises(ClaimFailed, match="false for c = 2"):
        every("exact", {"c = 1": 0.0, "c = 2": 1.0}, lambda d: d == 0)


def test_a_claim_no_measurement_could_fail_is_refused():
    from lessonlib.instruments.claims import ClaimCannotFail, at_least, every
    for measured in (float("inf"), float("nan")):          # a ratio over a zero time
        with pytest.raises(ClaimCannotFail, match="no bound can fail"):
            at_least("weight time over backward time", measured, 0.2)
    with pytest.raises(ClaimCannotFail, match="no case"):
        every("exact", {}, lambda d: d == 0)
