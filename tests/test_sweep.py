"""The lab kit's plumbing: labs/sweep.py (a grid of lab runs into one table, failures kept
as rows), lessonlib.lab.results (any results file as flat rows), and the SLURM templates, run
on this machine through labs/slurm/dry_run.sh's stand-in srun and scontrol."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lessonlib.lab import results

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT / "labs"))   # after site-packages: labs/ holds scripts, not a package

import sweep  # noqa: E402  (labs/ is not a package)


@pytest.mark.timeout(180)
def test_a_grid_becomes_one_table_with_failures_as_rows(tmp_path):
    out = subprocess.run(
        [sys.executable, str(ROOT / "labs" / "sweep.py"), "--lab", "launch_overhead",
         "--grid", "repeats=1,0", "--set", "world_size=1", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=170)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "2/2" in out.stderr and "1 of 2 points ok" in out.stdout
    rows = results.load(tmp_path)
    assert [(r["point"], r["repeats"], r["status"]) for r in rows] == [(0, 1, "ok"), (1, 0, "failed")]
    assert rows[0]["results.lessonlib.total_s"] > 0 and rows[0]["backend"] == "gloo"
    assert "--repeats" in rows[1]["error"] and (tmp_path / rows[1]["log"]).exists()
    from_csv = results.load(tmp_path / "table.csv")
    for key in ("point", "status", "repeats", "world_size", "results.lessonlib.total_s", "error"):
        assert [r.get(key) for r in from_csv] == [r.get(key) for r in rows], key
    assert results.points(rows, "repeats", "results.lessonlib.total_s") == (
        [1], [rows[0]["results.lessonlib.total_s"]])


def test_bad_grids_are_rejected_before_any_run(capsys):
    with pytest.raises(SystemExit):
        sweep.main(["--lab", "ddp", "--grid", "bucket_mb=1,25"])
    assert "labs/ddp.py has no --bucket-mb" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        sweep.main(["--lab", "nope"])
    assert "lab='nope' is not in labs/" in capsys.readouterr().err
    with pytest.raises(ValueError, match="1 part.*2 key"):
        sweep.parse_axis("world_size:layouts=4:t2p2d1,8")
    with pytest.raises(ValueError, match="no '='"):
        sweep.parse_axis("world_size")


def test_launchers_and_tied_axes():
    keys, values = sweep.parse_axis("world_size:layouts=4:t2p2d1,8:t2p2d2")
    points = sweep.expand([(keys, values), sweep.parse_axis("m=2,4")])
    assert len(points) == 4 and points[0] == {"world_size": "4", "layouts": "t2p2d1", "m": "2"}
    assert sweep.parse_axis('layouts="t2p2d1,t1p2d4"')[1] == [("t2p2d1,t1p2d4",)]
    point = {"world_size": "4", "microbatches": "4 8", "pin": "true", "sweep": "false"}
    opts = type("Opts", (), {"launcher": "torchrun", "python": "py", "nproc_per_node": 1})
    cmd = sweep.command("pp", point, Path("p.json"), opts)
    assert cmd[:6] == ["py", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4"]
    assert cmd[7:] == ["--microbatches", "4", "8", "--pin", "--json", "p.json"]
    opts.launcher, opts.nproc_per_node = "srun", 2
    cmd = sweep.command("pp", point, Path("p.json"), opts)
    assert cmd[:4] == ["srun", "--kill-on-bad-exit=1", "--ntasks=4", "--ntasks-per-node=2"]
    assert cmd[4:6] == ["bash", str(ROOT / "labs" / "slurm" / "rank_env.sh")]


def test_grid_file(tmp_path):
    path = tmp_path / "class.ini"
    path.write_text("[ddp]\nworld_size = 1, 2\nmodel = tiny\n"
                    "[hybrid]\nworld_size:layouts = 4:t2p2d1, 8:t2p2d2\n"
                    '[hybrid both]\nlayouts = "t2p2d1,t1p2d2"\n')
    jobs = sweep.read_grid_file(path)
    assert [(lab, len(points)) for lab, points in jobs] == [("ddp", 2), ("hybrid", 2), ("hybrid", 1)]
    assert jobs[1][1][1] == {"world_size": "8", "layouts": "t2p2d2"}
    assert jobs[2][1] == [{"layouts": "t2p2d1,t1p2d2"}]


def test_results_reads_bundles_and_series(tmp_path):
    record = {"lab": "allreduce", "world_size": 4, "results": {
        "ring": {"points": [{"world_size": 2, "time_s": 1.0}, {"world_size": 4, "time_s": 2.0}]},
        "torch": {"by_world_size": {"1": {"step_time_s": 0.5}, "2": {"step_time_s": 0.3}}}}}
    (tmp_path / "bundle.json").write_text(json.dumps({"about": "text", "a": record, "b": record}))
    rows = results.load(tmp_path / "bundle.json")
    assert [r["name"] for r in rows] == ["a", "b"]
    ring = results.explode(results.where(rows, name="a"), "results.ring.points")
    assert [(r["world_size"], r["time_s"]) for r in ring] == [(2, 1.0), (4, 2.0)]
    by_n = results.explode(rows[:1], "results.torch.by_world_size", "n")
    assert results.points(by_n, "n", "step_time_s") == ([1, 2], [0.5, 0.3])
    with pytest.raises(ValueError, match="no results at"):
        results.load(tmp_path / "missing.json")


@pytest.mark.timeout(180)
@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("template", ["srun", "torchrun"])
def test_slurm_template_runs_a_lab_on_stand_in_slurm(template, tmp_path):
    # the all-reduce lab: the cheapest 2-rank lab to start (a training lab's ranks also
    # import torch._dynamo, for their optimizer), and the template is the same for any lab
    record = tmp_path / "allreduce.json"
    out = subprocess.run(
        ["bash", str(ROOT / "labs" / "slurm" / "dry_run.sh"), template, "2", "allreduce",
         "--size-mb", "0.01", "--budget-s", "0.01", "--json", str(record)],
        capture_output=True, text=True, timeout=170, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    data = json.loads(record.read_text())
    assert data["world_size"] == 2 and data["backend"] == "gloo"


def test_a_results_folder_that_is_a_file_is_refused_before_any_point(tmp_path, capsys):
    (tmp_path / "taken").write_text("")
    with pytest.raises(SystemExit):
        sweep.main(["--lab", "launch_overhead", "--grid", "repeats=1,2",
                    "--out", str(tmp_path / "taken")])
    assert "is a file, not a folder" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        sweep.main(["--collect", str(tmp_path)])
    assert "no slurm.json there" in capsys.readouterr().err
