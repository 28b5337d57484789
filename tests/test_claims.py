"""A claim prints its sentence when it holds and fails the cell when it does not. Pure."""
import pytest

from lessonlib.claims import ClaimFailed, claim, within
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
    assert src.where.startswith("lessonlib/claims.py, line ")
    assert "def claim(" in repr(src) and "<span" in src._repr_html_()


def test_a_lab_is_shown_from_its_own_file_without_running_it():
    src = show(lab("minimal_ddp").main)
    assert src.where.startswith("labs/minimal_ddp.py, line ")
    assert "DistributedSampler" in repr(src)
    with pytest.raises(ValueError, match=r"no labs/nope\.py; the labs are: .*minimal_ddp"):
        lab("nope")
