"""lessonlib.launcher.checks.cores: the cores a process may use, a container's CPU quota
counted (cgroup v2's cpu.max, v1's cfs quota over period), read from a fake cgroup folder."""
import os

import pytest

from lessonlib.launcher import checks


def _affinity() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def test_cgroup_v2_quota_of_two_cpus_gives_two(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    (tmp_path / "cpu.max").write_text("200000 100000\n")
    assert checks.cpu_quota(tmp_path) == 2.0 and checks.cores(tmp_path) == 2
    (tmp_path / "cpu.max").write_text("150000 100000\n")     # 1.5 CPUs: 1 whole core
    assert checks.cores(tmp_path) == 1
    (tmp_path / "cpu.max").write_text("50000 100000\n")      # half a CPU: still 1
    assert checks.cores(tmp_path) == 1
    (tmp_path / "cpu.max").write_text("max 100000\n")        # no quota: the affinity mask
    assert checks.cpu_quota(tmp_path) is None and checks.cores(tmp_path) == 16


def test_cgroup_v1_quota_over_period(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    folder = tmp_path / "cpu,cpuacct"
    folder.mkdir()
    (folder / "cpu.cfs_quota_us").write_text("200000\n")
    (folder / "cpu.cfs_period_us").write_text("100000\n")
    assert checks.cores(tmp_path) == 2
    (folder / "cpu.cfs_quota_us").write_text("-1\n")
    assert checks.cores(tmp_path) == 16


def test_a_quota_above_the_affinity_mask_changes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    (tmp_path / "cpu.max").write_text("800000 100000\n")
    assert checks.cores(tmp_path) == 2


def test_no_cgroup_or_an_unreadable_one_means_no_quota(tmp_path):
    assert checks.cores(tmp_path / "absent") == _affinity()
    (tmp_path / "cpu.max").write_text("garbage\n")
    assert checks.cpu_quota(tmp_path) is None and checks.cores(tmp_path) == _affinity()


def test_the_launcher_refuses_by_the_quota(tmp_path, monkeypatch):
    """A 2-CPU container on a 16-core host: at most 8 ranks per core it may use."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    (tmp_path / "cpu.max").write_text("200000 100000\n")
    monkeypatch.setattr(checks, "CGROUP", tmp_path)
    with pytest.raises(ValueError, match="on 2 CPU core"):
        checks.check_launch(17, 60, "gloo", oversubscribe=False)
    assert checks.check_launch(16, 60, "gloo", oversubscribe=False) == (16, 60.0)
