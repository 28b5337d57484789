"""The lab kit every lab shares (``lessonlib.lab.labkit``: ``parse``, ``on_ranks``, ``emit``):
shared flags and output paths are checked before any rank starts, a result that cannot be
written is still printed in full, ``--dtype`` is recorded, and a record's rows read back with
stable columns and plot."""
import json
import sys
from pathlib import Path

import labrun
import pytest

from lessonlib.lab import labkit, results
from lessonlib.viz import sweep as draw

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT / "labs"))   # after site-packages: labs/ holds scripts, not a package

import sweep_points  # noqa: E402  (labs/ is not a package)

TINY_TP = ["--world-size", "2", "--steps", "2", "--warmup", "1", "--batch", "2", "--seq", "8",
           "--hidden", "32", "--heads", "4"]


@pytest.mark.parametrize("lab,args,words", [
    ("tp", ["--timeout", "-1"], "--timeout must be a positive number of seconds"),
    ("pp", ["--timeout", "0"], "--timeout must be a positive number of seconds"),
    ("ddp", ["--timeout", "nan"], "--timeout must be a positive number of seconds"),
    ("tp", ["--json", "{tmp}"], "is a folder; give a file name"),
    ("mp", ["--json", "{tmp}/a_file/out.json"], "is a file, so nothing can be written below"),
    ("pp", ["--dtype", "bf16"], "--dtype bf16: labs/pp.py runs only --dtype fp32"),
    ("train", ["--checkpoint-dir", "{tmp}/a_file"], "--checkpoint-dir"),
])
def test_bad_shared_settings_stop_the_lab_before_any_rank(tmp_path, lab, args, words):
    (tmp_path / "a_file").write_text("not a folder")
    done = labrun.run(lab, *[a.format(tmp=tmp_path) for a in args])
    assert done.returncode == 2, done.stderr[-2000:]
    assert words in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()[-1]) < 300


@pytest.mark.parametrize("lab,args,words", [
    ("ddp", ["--timeout", "1e10"], "--timeout must be a positive number of seconds, at most"),
    ("ddp", ["--world-size", "1000"], "use --world-size <= "),
    ("ddp", ["--sweep", "--world-sizes", "1,1000"], "use --world-sizes <= "),
    ("train", ["--lr", "-1"], "--lr must be a finite positive number"),
    ("train", ["--lr", "nan"], "--lr must be a finite positive number"),
    ("hybrid", ["--lr", "-1"], "--lr must be a finite positive number"),
    ("ddp", ["--json", "x" * 300], "is longer than the 255 bytes"),
    ("ddp", ["--json", "/proc/x"], "/proc is on the kernel's proc file system"),
    ("tp", ["--steps", "0"], "--steps must be a positive integer"),
])
def test_every_setting_is_refused_in_one_line_without_the_usage(lab, args, words):
    done = labrun.run(lab, *args)
    assert done.returncode == 2 and words in done.stderr, done.stderr[-2000:]
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_the_usage_comes_with_an_unknown_flag():
    done = labrun.run("ddp", "--no-such-flag")
    assert done.returncode == 2 and done.stderr.startswith("usage: labs/ddp.py")


def test_a_result_that_cannot_be_written_is_printed_in_full(tmp_path, capsys):
    (tmp_path / "a_file").write_text("")
    record = {"lab": "tp", "world_size": 1, "results": {"lessonlib": {"step_time_s": 1.5}}}
    with pytest.raises(SystemExit) as stop:
        labkit.emit(record, tmp_path / "a_file" / "out.json")
    assert stop.value.code == 1
    out, err = capsys.readouterr()
    assert json.loads(out) == record
    assert f"could not write the result to --json {tmp_path / 'a_file' / 'out.json'}" in err


@pytest.mark.timeout(200)
def test_bf16_runs_under_autocast_and_is_recorded(tmp_path):
    record = labrun.run_lab("tp", *TINY_TP, "--dtype", "bf16", tmp_path=tmp_path)
    assert record["settings"]["dtype"] == "bf16"
    rows = results.load(tmp_path / "tp.json")
    assert {r["dtype"] for r in rows} == {"bf16"} and len(rows) == 4
    # bf16 keeps about 3 significant digits: the layers still match the dense one roughly
    assert all(r["output_max_abs_error"] < 0.1 for r in rows)
    assert {(r["implementation"], r["layer"]): r["all_reduces"] for r in rows} == {
        ("lessonlib", "mlp"): 2, ("lessonlib", "block"): 4, ("torch", "mlp"): 2,
        ("torch", "block"): 6}


@pytest.mark.parametrize("name", ["pp", "tp", "mp", "hybrid", "dp"])
def test_every_shipped_record_reads_as_rows_with_the_same_columns(name):
    path = ROOT / "data" / f"{name}_cpu_results.json"
    rows = results.load(path)
    for lab_name in {r.get("name") for r in rows}:
        mine = [r for r in rows if r.get("name") == lab_name]
        assert len({frozenset(r) for r in mine}) == 1, lab_name
        assert all(r["dtype"] == "fp32" for r in mine)
    flat = results.load(path, flat=True)                 # the nested detail is still there
    assert all(any(k.startswith("results.") for k in r) for r in flat)


def test_a_finished_sweep_folder_plots_measured_over_predicted(tmp_path):
    record = json.loads((ROOT / "data" / "pp_cpu_results.json").read_text())
    jobs = [("pp", [{"microbatches": "2 4 8", "world_size": "2"}])]
    row = sweep_points.point_row(0, "pp", jobs[0][1][0])
    table = sweep_points.table_rows(row, jobs[0][1][0], record)
    assert {r["m"] for r in table} == {2, 4, 8} and {r["point"] for r in table} == {0}
    sweep_points.write_table(tmp_path, table, sweep_points.table_meta(jobs, [record]))
    png = draw.plot_sweep(tmp_path)
    assert png == tmp_path / results.PLOT_PNG and png.stat().st_size > 10_000
    assert results.load(tmp_path / results.TABLE_CSV)[0]["bubble_predicted"] == pytest.approx(
        1 / 3)
