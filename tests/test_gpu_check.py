"""labs/gpu_check.py on this machine: its dry run lists the GPU plan (every lab at one rank
on NCCL and at 2-4 ranks sharing one GPU over gloo, the five-axis layouts, each point's
parity check and whether it needs a GPU); its CPU mode runs the multi-rank points on CPU
ranks with tiny settings, times small matrix products and writes the report; a lab that is
not there is reported as skipped, not as a failure.

The script itself runs as a user runs it, with one lab (which the sweep starts as its own
command line). Every lab's CPU-mode run is also the same command line run in this
interpreter (tests/labrun.py), so that nine fresh interpreters do not each import torch
twice; what the report shows of each lab is checked from its record."""
import importlib
import json
import subprocess
import sys
from pathlib import Path

import labrun
import pytest

LABS = Path(__file__).resolve().parent.parent / "labs"
sys.path.append(str(LABS))         # after site-packages: labs/ holds scripts, not a package

import gpu_check  # noqa: E402  (labs/ is not a package)
import gpu_check_plan  # noqa: E402
import sweep_points  # noqa: E402

from lessonlib import device  # noqa: E402
from lessonlib.instruments import placement
from lessonlib.lab import results
from lessonlib.launcher import starter  # noqa: E402

FROM_THE_COMMAND_LINE = ("allreduce",)
# the shared-GPU plan's points run on the CPU stand-in: a p = 3 pipeline (point-to-point
# through gloo_cuda's detour, a middle stage both ways) and a five-axis layout
ON_THE_STAND_IN = ("pp x3", "hybrid x4 five-axis c2 sp fsdp")


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
    assert list(rows) == ["versions", "launch", "gemm", "memory", "allreduce x4"]
    row = rows["allreduce x4"]           # on CPU ranks, the multi-rank points only
    assert row["status"] == "ok" and row["seconds"] > 0 and row["mode"] == "cpu", row
    assert (tmp_path / row["log"]).exists() and row["parity"] < 1e-5     # vs the exact sum
    gemm = rows["gemm"]["gemm"]
    assert [g["n"] for g in gemm] and all(g["tflops"] > 0 for g in gemm)
    text = (tmp_path / "report.md").read_text()
    assert "| point | ranks | where | status |" in text and "Matrix products" in text
    assert "| allreduce x4 | 4 | CPU ranks (gloo) | ok |" in text and "ring busbw GB/s" in text
    assert "need a GPU" in text
    memory = rows["memory"]           # the DDP lab's step: measured on a GPU, else predicted
    assert memory["status"] == "ok" and memory["measured"] == (device.gpu_count() > 0)
    assert all(r["predicted_gib"] > 0 for r in memory["memory"])
    if device.gpu_count() == 0:
        assert "no GPU: peak memory not measured" in text
        assert report["machine"]["backend"] == "gloo"
        assert "No GPU visible" in out.stderr


@pytest.mark.timeout(300)
def test_cpu_mode_settings_run_every_lab(tmp_path, monkeypatch):
    """Every lab in labs/ is planned, and each runs with the CPU mode's settings to a record
    that holds every column its report line shows; its ranks run on the placement audit's
    stand-in GPU (tests/test_placement.py), so a tensor a lab leaves on the CPU fails it."""
    monkeypatch.setenv(placement.STAND_IN_ENV, "1")
    # The labs' rooms imported before the first launch, so the warm fork server starts once
    # with all of them, not once with ddp's and again when pp's lab imports another room
    for room in starter.ROOMS:
        importlib.import_module(room)
    points = gpu_check.plan(gpu_check.sweep.available_labs(), 0, quick=True)
    present = set(gpu_check.sweep.available_labs())
    assert {p.lab for p in points if p.ranks} == present, "a lab in labs/ would not be run"
    for p in points:
        assert p.ranks or ("not there yet" in p.note and p.lab not in present)
    plain = {p.lab: p for p in points if p.ranks and p.mode == "cpu" and " five-axis" not in p.name}
    for lab, p in plain.items():
        assert p.job()["backend"] == "gloo" and 2 <= p.ranks <= 4
        # at 2 ranks, as cheap as it gets: the 3- and 4-rank points run on the stand-in below
        point, out = {**p.job(), "world_size": "2"}, tmp_path / f"{lab}.json"
        done = labrun.run(lab, *sweep_points.lab_argv(point, "local"), "--json", str(out))
        assert done.returncode == 0, f"{lab}: " + done.stderr[-3000:]
        row = {"lab": lab, "status": "ok", **results.flatten(json.loads(out.read_text()))}
        shown = gpu_check.LABS.get(lab, gpu_check.GENERIC).metrics
        assert set(shown.values()) <= set(row), (lab, set(shown.values()) - set(row))
        assert gpu_check.lab_summary(row)
        if gpu_check.LABS.get(lab, gpu_check.GENERIC).parity:
            assert gpu_check.parity_of(row) is not None, f"{lab}: no parity in its record"


def test_the_dry_run_lists_every_lab_at_one_and_at_two_to_four_ranks(capsys, monkeypatch):
    monkeypatch.setattr(gpu_check.device, "gpu_count", lambda: 0)       # as on this machine
    assert gpu_check.main(["--budget-s", "420", "--dry-run"]) == 0
    out = capsys.readouterr()
    rows = [line.split(" | ") for line in out.out.splitlines() if line.startswith("| ")]
    points = {r[1]: r for r in rows[2:]}
    for lab in gpu_check.sweep.available_labs():
        one = points.get(f"{lab} nccl") or points.get("train+resume" if lab == "train" else "")
        many = [r for name, r in points.items() if name.split(" ")[0] == lab
                and r[3] == "gloo" and r[2] in ("2", "3", "4")]
        assert many and all("share cuda:0" in r[4] and r[-1].startswith("yes") for r in many), lab
        assert one or points.get(f"{lab} nccl (not run)"), lab
        assert one is None or (one[2] == "1" and one[3] == "nccl"), one
        assert all(r[5].strip() for r in [*many, *([one] if one else [])]), f"{lab}: no parity"
    five = [r for name, r in points.items() if "five-axis" in name]
    assert len(five) == 2 and all("max_weight_diff_vs_one_process" in r[5] for r in five)
    assert "fit --budget-s 420" in out.out and "Need a GPU (" in out.out
    assert "not run" in out.out         # allreduce at one rank, with its reason


@pytest.mark.timeout(120)
def test_the_shared_gpu_points_run_on_the_stand_in_with_parity(tmp_path, monkeypatch):
    """The same plan's shared-GPU points, on CPU ranks: the mode asked for as on a GPU (its
    point-to-point detour runs), the stand-in as the GPU, parity read from the records."""
    monkeypatch.setenv(placement.STAND_IN_ENV, "1")
    monkeypatch.setenv(device.SHARED_GPU_ENV, "1")
    points = {p.name: p for p in gpu_check.plan(gpu_check.sweep.available_labs(), 1, True)}
    for name in ON_THE_STAND_IN:
        p = points[name]
        assert p.mode == "shared" and p.backend == "gloo"
        out = tmp_path / f"{p.lab}.json"
        done = labrun.run(p.lab, *sweep_points.lab_argv(p.job(), "local"), "--json", str(out))
        assert done.returncode == 0, f"{name}: " + done.stderr[-3000:]
        row = {"lab": p.lab, **results.flatten(json.loads(out.read_text()))}
        assert row["world_size"] == p.ranks
        parity = gpu_check.parity_of(row)
        assert parity is None if not gpu_check.LABS[p.lab].parity else parity < 1e-6, (name, parity)


@pytest.mark.skipif(device.gpu_count() > 0, reason="this machine has a GPU")
def test_without_a_gpu_it_says_so_and_stops(tmp_path):
    out = run_check("--out", str(tmp_path), timeout=60)
    assert out.returncode == 1 and "No GPU is visible" in out.stderr
    assert not (tmp_path / "report.json").exists()


def test_missing_labs_are_skipped_and_one_gpu_sizes():
    points = gpu_check.plan(["ddp", "tp"], 1, quick=False)
    ran = [p for p in points if p.ranks]
    assert {p.lab for p in ran} == {"ddp", "tp"}
    assert [p.name for p in ran] == ["ddp x2", "tp x4", "ddp nccl", "tp nccl"]   # multi-rank first
    assert all(p.ranks == 1 and p.backend == "nccl" for p in ran if p.mode == "nccl")
    assert {p.lab for p in points if not p.ranks} == set(gpu_check.LABS) - {"ddp", "tp"}
    sizes = {p.name: p.ranks for p in gpu_check.plan(["ddp", "tp"], 6, quick=False)}
    assert sizes["ddp nccl"] == 6 and sizes["tp nccl"] == 4


def test_the_budget_cuts_the_tail_and_says_so():
    points = gpu_check.plan(gpu_check.sweep.available_labs(), 1, quick=False)
    fits, cut = gpu_check_plan.within(points, 420)
    assert fits and fits == [p for p in points if p.ranks][:len(fits)]
    assert sum(p.estimate_s for p in fits) <= 420
    fits, cut = gpu_check_plan.within(points, 100)
    assert cut and "cut: past --budget-s" in gpu_check_plan.listing(points, 100, 1)
    assert fits[0].name.startswith("hybrid x4 five-axis")


def test_the_calibration_refits_the_gemm_ceiling_and_the_prediction_moves():
    rates = [{"n": 1024, "dtype": "bfloat16", "seconds": 1.0, "samples": 5, "tflops": 400.0},
             {"n": 8192, "dtype": "bfloat16", "seconds": 1.0, "samples": 5, "tflops": 700.0}]
    calib = gpu_check.calibrate(rates, "NVIDIA H200")
    assert calib["preset"] == "H200" and calib["assumed_mamf_tflops"] == pytest.approx(794.5)
    assert calib["measured_matmul_efficiency"] == pytest.approx(700 / 989)
    [small, large] = calib["gemm_curve"]
    assert large["predicted_tflops_refit"] < large["predicted_tflops_preset"] <= 794.5
    p = calib["prediction_145.6B"]        # a slower GEMM: a slower step, not a cached one
    assert p["tflops_per_gpu_refit"] < 0.95 * p["tflops_per_gpu_preset"]
    assert gpu_check.calibrate(rates, "cpu")["preset"] is None


def test_the_calibration_fits_the_links_alpha_and_beta_to_the_all_reduce_curve():
    from lessonlib.costmodel.comm import ring_allreduce_time_s
    rates = [{"n": 8192, "tflops": 700.0}]
    curve = [(8, size, ring_allreduce_time_s(8, size, 200e9, 8e-6))
             for size in (2**16, 2**20, 2**24, 2**28)]
    calib = gpu_check.calibrate(rates, "NVIDIA H100 80GB HBM3", curve)
    fit = calib["allreduce_fit"]
    assert fit["alpha_s"] == pytest.approx(8e-6) and fit["bandwidth_Bps"] == pytest.approx(200e9)
    slower = calib["prediction_145.6B"]["tflops_per_gpu_refit"]
    assert slower < gpu_check.calibrate(rates, "NVIDIA H100")["prediction_145.6B"][
        "tflops_per_gpu_refit"]          # 200 GB/s of bus bandwidth: below the preset's 360
    machine = {"device": "NVIDIA H100", "gpus": 8, "settings": "short", "budget_s": 420}
    text = gpu_check.markdown(machine, [], {"calibration": calib})
    assert "All-reduce over 8 GPUs: alpha 8 us per ring step, bus bandwidth 200 GB/s" in text


@pytest.mark.timeout(120)
def test_the_all_reduce_curve_reads_back_the_labs_points(tmp_path):
    # the GPU path times NCCL over every GPU; here two gloo ranks at two sizes
    curve = gpu_check.allreduce_curve(2, tmp_path, 100, backend="gloo", sizes_kb=(4, 64))
    assert [(n, size) for n, size, _ in curve["allreduce"]] == [(2, 4096), (2, 65536)]
    assert all(seconds > 0 for _, _, seconds in curve["allreduce"])


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
    text = (tmp_path / "report.md").read_text()
    assert "ZeroDivisionError" in rows[1]["error"] and "| ddp |" in text
    assert "Cut by --budget-s (1): ddp" in text


@pytest.mark.parametrize("budget", ["1", "20"])
def test_a_budget_too_short_for_the_first_checks_is_one_line_naming_what_would_work(
        capsys, monkeypatch, tmp_path, budget):
    """Not "1 s left, under the 1 s this point needs" for each point, nothing run."""
    monkeypatch.setattr(gpu_check.device, "gpu_count", lambda: 0)
    with pytest.raises(SystemExit) as stop:
        gpu_check.main(["--budget-s", budget, "--allow-cpu", "--out", str(tmp_path / "out")])
    assert stop.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()[-1:]
    assert f"--budget-s {budget} is shorter than the 21 s" in line and "use --budget-s 21" in line
    assert not (tmp_path / "out").exists()
