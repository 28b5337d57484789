"""The hybrid design widget's grid and figures (pure: no processes, Agg backend)."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from lessonlib import costmodel as cm  # noqa: E402
from lessonlib.viz import hybrid, hybrid_design  # noqa: E402


def test_fixed_gpus_and_batch_give_d_and_m():
    grid = hybrid_design.design_grid("gpt-161B", "dgx-a100", n_gpus=64, global_batch=128,
                                     ts=(1, 2, 8), ps=(1, 4, 128))
    cell = grid[2, 4]
    assert (cell.d, cell.m) == (8, 16)  # d = 64/(2*4), m = 128/(1*8)
    assert cell.estimate.layout.n_gpus == 64 and cell.estimate.layout.global_batch == 128
    assert (grid[8, 1].d, grid[8, 1].m) == (8, 16)
    assert grid[8, 128].estimate is None and grid[8, 128].d is None  # t*p > n
    assert grid[1, 128].reason == "t*p > n"


def test_invalid_cells_are_marked():
    batch = hybrid_design.design_cell("gpt-161B", "dgx-a100", 1, 1, n_gpus=64, global_batch=96,
                                      b=4)
    assert batch.estimate is None and batch.d == 64 and "not whole" in batch.reason
    heads = hybrid_design.design_cell("gpt3-175B", "dgx-a100", 64, 1, n_gpus=64,
                                      global_batch=64)
    assert heads.estimate is None and "divide" in heads.reason  # 96 heads
    big = hybrid_design.design_cell("gpt-161B", "dgx-a100", 1, 1, n_gpus=64, global_batch=64)
    assert big.estimate is not None and not big.fits and big.reason.endswith("GB")


def test_best_cell_for_161b_matches_tp_sweep():
    grid = hybrid_design.design_grid("gpt-161B", "dgx-a100", n_gpus=64, global_batch=64)
    best = hybrid_design.best_cell(grid)
    sweep = cm.tp_sweep(cm.MODELS["gpt-161B"], cm.CLUSTERS["dgx-a100"], 64, 64)
    top = max((e.tflops_per_gpu, t) for t, _, e in sweep if e and e.fits)
    # the model puts t = 4 (p = 16) a few percent ahead of Fig. 13's t = 8 at this batch
    assert best.t == top[1] == 4 and (best.p, best.d, best.m) == (16, 1, 64)


def test_lessons_1t_layout_needs_zero_1():
    plain = hybrid_design.design_cell("megatron-1T", "dgx-a100", 8, 16, n_gpus=1024,
                                      global_batch=2048)
    sharded = hybrid_design.design_cell("megatron-1T", "dgx-a100", 8, 16, n_gpus=1024,
                                        global_batch=2048, zero_stage=1)
    assert (plain.d, plain.m) == (8, 256)
    assert not plain.fits and sharded.fits


def test_options_reach_the_layout():
    cell = hybrid_design.design_cell("gpt-161B", "dgx-a100", 8, 8, n_gpus=64, global_batch=64,
                                     b=2, recompute="selective", zero_stage=2, v=2)
    lay = cell.estimate.layout
    assert (lay.b, lay.m, lay.recompute, lay.zero_stage, lay.v) == (2, 32, "selective", 2, 2)


def test_grid_needs_one_mode():
    with pytest.raises(ValueError, match="give n_gpus and global_batch"):
        hybrid_design.design_grid("gpt-161B", n_gpus=64, global_batch=64, d=1, m=4)


@pytest.mark.parametrize("model", list(cm.MODELS))
def test_panel_draws_for_every_model(model):
    fig = hybrid_design.design_panel(model, n_gpus=64, global_batch=64, t=8, p=8)
    assert len(fig.axes) >= 4  # two maps (+ colorbars), or the reason a cell cannot run
    plt.close(fig)


def test_panel_with_fixed_d_and_m():
    fig = hybrid_design.design_panel("gpt-161B", n_gpus=None, global_batch=None, d=1, m=64)
    assert fig.axes
    plt.close(fig)


def test_widget_draws_once_headless():
    pytest.importorskip("ipywidgets")
    box = hybrid.hybrid_widget()
    assert "widget-interact" in box._dom_classes
    controls = {c.description: c for c in box.children[0].children}
    assert "megatron-1T" in controls["model"].options
    assert "gpt3-175B" in controls["model"].options
    assert len(box.children[1].outputs) == 1
    controls["model"].value = "megatron-1T"
    controls["GPUs n"].value = 1024
    assert len(box.children[1].outputs) == 1
    assert controls["d"].disabled and not controls["GPUs n"].disabled
    controls["mode"].value = hybrid.FIXED_DM
    assert controls["GPUs n"].disabled and not controls["d"].disabled
