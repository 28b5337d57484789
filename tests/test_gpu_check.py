"""labs/gpu_check.py on this machine: its CPU mode runs every lab that exists on 2 CPU
ranks with tiny settings, times small matrix products and writes the report; a lab that is
not there is reported as skipped, not as a failure.

The script itself runs as a user runs it, with one lab (which the sweep starts as its own
command line). Every lab's CPU-mode run is also the same command line run in this
interpreter (tests/labrun.py), so that nine fresh interpreters do not each import torch
twice; what the report shows of each lab is checked from its record."""
import json
import subprocess
import sys
from pathlib import Path

import labrun
import pytest

LABS = Path(__file__).resolve().parent.parent / "labs"
sys.path.append(str(LABS))         # after site-packages: labs/ holds scripts, not a package

import gpu_check  # noqa: E402  (labs/ is not a package)
import sweep_points  # noqa: E402

from lessonlib import device, placement, results  # noqa: E402

FROM_THE_COMMAND_LINE = ("allreduce",)


def run_check(*args, timeout=240):
    return subprocess.run([sys.executable, str(LABS / "gpu_check.py"), *args],
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.timeout(300)
def test_cpu_mode_runs_labs_and_writes_the_report(tmp_path):
    out = run_check("--allow-cpu", "--quick", "--labs", ",".join(FROM_THE_COMMAND_LINE),
                    "--out", str(tmp_path))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    rows = {r["point"]: r for r in report["points"]}
    # the most telling first: versions, a 1-rank launch, the products, then the labs
    assert list(rows) == ["versions", "launch", "gemm", *FROM_THE_COMMAND_LINE]
    for lab in FROM_THE_COMMAND_LINE:
        # with 2 ranks every lab runs (allreduce skips only at 1)
        assert rows[lab]["status"] == "ok" and rows[lab]["seconds"] > 0, rows[lab]
        assert (tmp_path / rows[lab]["log"]).exists()
    gemm = rows["gemm"]["gemm"]
    assert [g["n"] for g in gemm] and all(g["tflops"] > 0 for g in gemm)
    text = (tmp_path / "report.md").read_text()
    assert "| point | ranks | status |" in text and "Matrix products" in text
    assert "| allreduce | 2 | ok |" in text and "ring busbw GB/s" in text
    if device.gpu_count() == 0:
        assert report["machine"]["backend"] == "gloo"
        assert "No GPU visible" in out.stderr


@pytest.mark.timeout(300)
def test_cpu_mode_settings_run_every_lab(tmp_path, monkeypatch):
    """Every lab in labs/ is planned, and each runs with the CPU mode's settings to a record
    that holds every column its report line shows; its ranks run on the placement audit's
    stand-in GPU (tests/test_placement.py), so a tensor a lab leaves on the CPU fails it."""
    monkeypatch.setenv(placement.STAND_IN_ENV, "1")
    jobs, skipped = gpu_check.plan(2, gpu=False, quick=True)
    present = set(gpu_check.sweep.available_labs())
    assert {lab for lab, _ in jobs} == present, "a lab in labs/ would not be run"
    for row in skipped:
        assert row["lab"] not in present and "not there yet" in row["error"]
    for lab, [point] in jobs:
        assert point["world_size"] == "2" and point["backend"] == "gloo"
        out = tmp_path / f"{lab}.json"
        done = labrun.run(lab, *sweep_points.lab_argv(point, "local"), "--json", str(out))
        assert done.returncode == 0, f"{lab}: " + done.stderr[-3000:]
        row = {"lab": lab, "status": "ok", **results.flatten(json.loads(out.read_text()))}
        shown = gpu_check.LABS.get(lab, gpu_check.GENERIC).metrics
        assert set(shown.values()) <= set(row), (lab, set(shown.values()) - set(row))
        assert gpu_check.lab_summary(row)


@pytest.mark.skipif(device.gpu_count() > 0, reason="this machine has a GPU")
def test_without_a_gpu_it_says_so_and_stops(tmp_path):
    out = run_check("--out", str(tmp_path), timeout=60)
    assert out.returncode == 1 and "No GPU is visible" in out.stderr
    assert not (tmp_path / "report.json").exists()


def test_missing_labs_are_skipped_and_one_gpu_sizes(monkeypatch):
    monkeypatch.setattr(gpu_check.sweep, "available_labs", lambda: ["ddp", "tp"])
    jobs, skipped = gpu_check.plan(1, gpu=True, quick=False)
    assert [lab for lab, _ in jobs] == ["ddp", "tp"]
    assert all(points[0]["world_size"] == "1" and points[0]["backend"] == "nccl"
               for _, points in jobs)
    assert {s["lab"] for s in skipped} == set(gpu_check.LABS) - {"ddp", "tp"}
    jobs, skipped = gpu_check.plan(6, gpu=True, quick=False)
    assert dict((lab, p[0]["world_size"]) for lab, p in jobs) == {"ddp": "6", "tp": "4"}


def test_the_calibration_compares_with_the_preset_peak():
    rates = [{"n": 1024, "dtype": "bfloat16", "seconds": 1.0, "samples": 5, "tflops": 400.0},
             {"n": 8192, "dtype": "bfloat16", "seconds": 1.0, "samples": 5, "tflops": 700.0}]
    calib = gpu_check.calibrate(rates, "NVIDIA H200")
    assert calib["preset"] == "H200"
    assert calib["measured_matmul_efficiency"] == pytest.approx(550 / 989)
    assert gpu_check.calibrate(rates, "cpu")["preset"] is None
    assert gpu_check.throughput.MATMUL_EFFICIENCY == calib["assumed_matmul_efficiency"]


def test_mfu_is_six_n_flops_per_token_over_the_ranks_peak():
    row = {"settings.parameters": 10 ** 7, "world_size": "2", "results.lessonlib.tokens_per_s": 1e6}
    assert gpu_check.mfu(row, 1000.0) == pytest.approx(6e13 / 2e15)
    assert gpu_check.mfu(row, None) is None and gpu_check.mfu({}, 1000.0) is None


def test_each_point_is_written_as_it_goes_and_one_that_does_not_fit_is_skipped(tmp_path):
    machine = {"device": "cpu", "gpus": 0, "backend": "gloo", "settings": "tiny", "budget_s": 30}
    report = gpu_check.Report(tmp_path, machine, budget_s=30)
    report.run("versions", "versions", lambda t: gpu_check.versions())
    assert json.loads((tmp_path / "report.json").read_text())["points"][0]["status"] == "ok"
    report.run("broken", "lab", lambda t: 1 / 0)               # reported, not fatal
    report.deadline = 0                                         # the budget is spent
    row = report.run("ddp", "lab", lambda t: pytest.fail("a point past the budget ran"))
    assert row["status"] == "skipped" and "--budget-s" in row["error"]
    rows = json.loads((tmp_path / "report.json").read_text())["points"]
    assert [r["status"] for r in rows] == ["ok", "failed", "skipped"]
    assert "ZeroDivisionError" in rows[1]["error"] and "| ddp |" in (tmp_path / "report.md").read_text()
