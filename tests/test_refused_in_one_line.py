"""Settings that used to end in a traceback are refused in one line, naming the setting, the
value and what would work, before any process starts: the context-parallel lab's one-process
reference too large for the machine, a report folder that cannot be one, a grid file that is
not one, an interpreter or a launcher that is not there, a published sweep's count that is
no count, an FP8 block that is no block, a planner's micro-batch sizes that are no sizes."""
import pytest
import torch
from labrun import run

from lessonlib import precision
from lessonlib.costmodel import CLUSTERS, MODELS, planner


def _one_line(done, *parts):
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    line = done.stderr.strip().splitlines()[-1]
    assert len(done.stderr.strip().splitlines()) == 1 or line.startswith("labs/"), done.stderr
    for part in parts:
        assert part in line, line
    return line


def test_cp_lab_bounds_its_one_process_references_s_by_s_mask():
    _one_line(run("cp", "--world-size", "2", "--seq", "262144"),
              "--seq 262144: the one-process reference's attention scores under its s x s mask",
              "give a smaller --seq")


@pytest.mark.parametrize("where, says", [("a_file", "is a file, not a folder; give a folder"),
                                         ("/proc/x", "on the kernel's proc file system")])
def test_gpu_check_refuses_a_report_folder_it_could_not_write(tmp_path, where, says):
    (tmp_path / "a_file").write_text("mine")
    out = where if where.startswith("/") else str(tmp_path / where)
    _one_line(run("gpu_check", "--allow-cpu", "--out", out), f"--out {out}",
              says)
    assert (tmp_path / "a_file").read_text() == "mine"


GRIDS = {
    "no section": ("steps = 1,2\n", "line 1 ('steps = 1,2') comes before any [lab] section; "
                                    "start with a section, e.g. [ddp]"),
    "an option twice": ("[ddp]\nsteps = 1\nsteps = 2\n",
                        "line 3: steps is given twice in [ddp]; give it once"),
    "a section twice": ("[ddp]\nsteps = 1\n[ddp]\nsteps = 2\n",
                        "line 3: [ddp] is there twice; name a second grid of the same lab "
                        "apart, e.g. [ddp small]"),
    "a key without =": ("[ddp]\nsteps\n", "line 2 ('steps') has no '='"),
    "not text": (b"\xff\xfe[", "is not UTF-8 text"),
}


@pytest.mark.parametrize("case", GRIDS)
def test_sweep_refuses_a_malformed_grid_file(tmp_path, case):
    text, says = GRIDS[case]
    grid = tmp_path / "grid.ini"
    grid.write_bytes(text if isinstance(text, bytes) else text.encode())
    _one_line(run("sweep", "--grid-file", str(grid), "--dry-run"), f"--grid-file {grid}", says)


def test_sweep_refuses_an_interpreter_that_is_not_there():
    _one_line(run("sweep", "--lab", "ddp", "--set", "steps=1", "--python", "/nonexistent/python"),
              "--python /nonexistent/python: no such program can be run here; give a Python")


def test_sweep_refuses_srun_outside_slurm(monkeypatch, tmp_path):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    _one_line(run("sweep", "--lab", "ddp", "--set", "steps=1", "--launcher", "srun",
                  "--out", str(tmp_path / "s")),
              "--launcher srun runs inside a SLURM allocation", "use --launcher local")
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("value", ["0", "nan", "-1", "2.5"])
def test_published_sweep_refuses_a_count_that_is_no_count(tmp_path, value):
    _one_line(run("sweep", "--published", "Llama 3 Table 4, 128K", "--grid", f"c={value}",
                  "--out", str(tmp_path / "p")),
              f"--grid/--set c={value}: c takes whole numbers of at least 1, e.g. c=")


@pytest.mark.parametrize("block", [(0, 16), (-16, 16), (16,), (16.0, 16)])
def test_quantize_refuses_a_block_that_is_no_block(block):
    with pytest.raises(ValueError, match=r"give two positive whole numbers \(rows, columns\) "
                                         r"that divide the tensor's shape \(32, 32\)"):
        precision.quantize(torch.ones(32, 32), precision.E4M3, block)


@pytest.mark.parametrize("sizes", [(0,), (), (-2, 4), (1.5,)])
def test_planner_refuses_micro_batch_sizes_that_are_no_sizes(sizes):
    model, cluster = next(iter(MODELS.values())), next(iter(CLUSTERS.values()))
    with pytest.raises(ValueError, match=r"microbatches=.*: give one or more positive whole "
                                         r"numbers \(the micro-batch sizes b to try\)"):
        planner.plan(model, cluster, 8, 64, microbatches=sizes)
