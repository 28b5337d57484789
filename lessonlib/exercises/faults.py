"""Checker for the exercise of deep dive 17: find the stuck rank from a flight recorder dump.

The student reads every rank's last entries (``hang_analysis.describe``) and names the
rank(s) that never posted the collective the others wait in; the checker lines the dumps up
as ``hang_analysis.analyze`` does and says why, or which slip the answer looks like.

    from lessonlib.exercises import faults
    faults.check_stuck_rank(1, dumps)
"""
from __future__ import annotations

from lessonlib.exercises.verdict import Verdict, correct, not_yet, unanswered
from lessonlib.faults.hang_analysis import analyze


def check_stuck_rank(answer, dumps: dict) -> Verdict:
    """``answer``: the rank (or a list of ranks) missing from the stuck collective."""
    if answer is None:
        return unanswered("stuck")
    try:
        given = {int(r) for r in (answer if isinstance(answer, (list, tuple, set)) else [answer])}
    except (TypeError, ValueError):
        return not_yet(f"give a rank number (or a list of them); got {answer!r}.")
    f = analyze(dumps)
    where = f"{f.op} #{f.seq} on group {f.group}"
    if given == set(f.missing):
        return correct(f"ranks {list(f.posted)} posted {where} and wait in it; rank(s) "
                       f"{list(f.missing)} never did. {f.detail}")
    if given <= set(f.posted):
        return not_yet(f"rank(s) {sorted(given)} posted {where}: they are the ones waiting. "
                       f"Which member of group {f.group} has no entry #{f.seq} there?")
    return not_yet(f"line the ranks up by group and number: find the highest #k on a group "
                   f"that some members posted and another did not.")
