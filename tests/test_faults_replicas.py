"""torchft: a replica killed mid-run (SIGKILL) and survived; restarted, it recovers live from
a peer; the survivors equal one process replaying the same membership; the Lighthouse and
the managers on 127.0.0.1; nothing left listening or running. 3 replicas of one rank each:
the slowest test of the faults (tens of seconds on a loaded 2-core machine)."""
import psutil
import pytest
import torch

from lessonlib.faults import replicas

pytestmark = pytest.mark.timeout(240)


def test_bad_settings_are_refused_before_anything_starts():
    with pytest.raises(ValueError, match="need replicas >= 3"):
        replicas.run(replicas=2)
    with pytest.raises(ValueError, match="0 < kill_at < steps"):
        replicas.run(kill_at=9, steps=6)


def test_the_replicas_stop_by_one_rule_that_a_gap_or_a_smaller_quorum_does_not_meet():
    def lived(*updates):
        return [replicas.Step(0, k, n, True, 0.0, 0.0) for k, n in updates]
    assert replicas.finished(lived((5, 3), (6, 3)), replicas=3, steps=6)
    assert not replicas.finished(lived((6, 3)), replicas=3, steps=6)
    assert not replicas.finished(lived((4, 3), (6, 3)), replicas=3, steps=6)   # a gap
    assert not replicas.finished(lived((5, 2), (6, 3)), replicas=3, steps=6)
    assert not replicas.finished(lived((4, 3), (5, 3)), replicas=3, steps=6)


def test_a_killed_replica_is_survived_recovered_live_and_equals_the_replay(no_children_left):
    run = replicas.run(replicas=3, steps=6, kill=2, kill_at=2)
    assert "killed by signal SIGKILL" in run.first_life[2], run.first_life
    assert run.first_life[0] == run.first_life[1] == "finished"
    survivors = [s.participants for s in run.results[0].lived]
    assert survivors[:2] == [3, 3] and 2 in survivors and survivors[-2:] == [3, 3], survivors
    # the restarted replica joined at a later step: it took the state from a peer
    assert run.results[2].lived[0].step > 3
    reference = replicas.replay(run)
    for r, result in run.results.items():
        torch.testing.assert_close(result.state, reference, rtol=0, atol=1e-10,
                                   msg=lambda m, r=r: f"replica {r}: {m}")
    # what listened while it ran: the Lighthouse and every manager on loopback; only the
    # replica groups' TCPStores on every interface (torch's TCPStore has no bind address)
    assert run.lighthouse[0] == "127.0.0.1"
    for result in run.results.values():
        wide = {port for ip, port in result.listening if ip != "127.0.0.1"}
        assert wide == {result.store_port}, result.listening
    # nothing listens on those ports now, and no process is left (no_children_left)
    ports = {run.lighthouse[1]} | {p for r in run.results.values() for _, p in r.listening}
    left = [c for c in psutil.net_connections("inet")
            if c.status == psutil.CONN_LISTEN and c.laddr.port in ports]
    assert not left, left
