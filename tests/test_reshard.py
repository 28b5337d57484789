"""Resume on another layout: a checkpoint saved at one (t, p, d) loads on another with the
same weights and optimizer state (bit for bit), and the run continues the uninterrupted
loss curve to float rounding.

Why a tolerance for the losses after the resume: the new layout adds the same numbers in
another order (t partial sums in TP's all-reduce, d replicas' gradients in DP's), so a
float32 result may differ in its last bit (a relative 6e-8). Measured once (loaded 2-core
machine): resumed at t1p1d2 from t2p2d1 at step 3, the next 9 losses differed by at most
4e-8 relative; at t1p1d1 they were equal. The tolerance, 1e-6 relative, leaves a margin of
25 and is still far below a wrong resume (one that restarts AdamW's moments from zero
differs by 3e-4 relative at the second step after it, measured in one process). The
resharding itself is a copy, tested bit for bit."""
import shutil

import pytest
import torch

from lessonlib import long_run
from lessonlib.launcher import launch
from lessonlib.long_run import checkpoint, checkpoint_folder, reshard, shard_map
from lessonlib.long_run.shard_map import Layout
from lessonlib.models import GPTConfig, TinyGPT, lm_loss

import ckpt_workers

CFG = GPTConfig(**long_run.SMALL)
LOSS_TOLERANCE = {"rtol": 1e-6, "atol": 0.0}


def _full_state(seed=1):
    """A model after one AdamW step: its weights and its optimizer's moments, by name."""
    model = TinyGPT(CFG, seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, CFG.vocab, (2, CFG.seq))
    lm_loss(model(x), x).backward()
    opt.step()
    names = [name for name, _ in model.named_parameters()]
    return model, {"param": {n: q.detach() for n, q in model.named_parameters()},
                   **{key: {names[i]: state[key] for i, state in opt.state_dict()["state"].items()}
                      for key in ("exp_avg", "exp_avg_sq")}}, opt


def _save_as(folder, full, t, p, d, step=3):
    """Write ``full`` as a (t, p, d) run would have: one shard per rank, cut by placement."""
    for rank in range(t * p * d):
        dp, pp, tp = rank // (p * t), rank // t % p, rank % t
        pieces = shard_map.placement(CFG, t, p, pp, tp)
        model = {name: reshard.cut(full["param"], where) for name, where in pieces.items()}
        state = {i: {"step": torch.tensor(1.0),
                     **{key: reshard.cut(full[key], pieces[name]) for key in ("exp_avg", "exp_avg_sq")}}
                 for i, name in enumerate(model)}
        checkpoint.write_shard(folder, step, rank, {
            "model": model, "optimizer": {"state": state, "param_groups": []}, "step": step,
            "losses": [[2.0 + dp, 4.0 + dp], [1.0, 1.0], [0.5, 0.5]], "coords": [dp, pp, tp]})
    meta = {"layout": f"t{t}p{p}d{d}", "model": long_run.SMALL}
    checkpoint.commit(folder, step, t * p * d, meta)
    return checkpoint.latest(folder).manifest


@pytest.mark.parametrize("saved,loaded", [((2, 2, 1), (1, 1, 2)), ((2, 2, 1), (1, 1, 1)),
                                          ((1, 2, 2), (2, 1, 1)), ((1, 1, 1), (2, 2, 1))])
def test_resharding_gives_each_rank_exactly_its_piece_of_the_weights_and_moments(
        tmp_path, saved, loaded):
    model, full, _ = _full_state()
    found = _save_as(tmp_path, full, *saved)
    t, p, d = loaded
    for pp in range(p):
        for tp in range(t):
            pieces = shard_map.placement(CFG, t, p, pp, tp)
            names = list(pieces)
            got = reshard.load(found, CFG, Layout(t, 1, p, d), pp * t + tp, names, where="cpu")
            # the global mean per step: micro-batches, then the d replicas (3.0 and 4.0)
            assert got["step"] == 3 and got["losses"] == [[3.0 + (saved[2] - 1) / 2], [1.0], [0.5]]
            for i, name in enumerate(names):
                assert torch.equal(got["model"][name], reshard.cut(full["param"], pieces[name]))
                for key in ("exp_avg", "exp_avg_sq"):
                    want = reshard.cut(full[key], pieces[name])
                    assert torch.equal(got["optimizer"]["state"][i][key], want), (name, key)
                assert got["optimizer"]["state"][i]["step"].item() == 1.0


def test_every_layout_cuts_the_whole_model_once():
    _, full, _ = _full_state()
    for t, p in ((1, 1), (2, 1), (4, 2), (2, 2), (1, 2)):
        rebuilt = {n: torch.full_like(q, float("nan")) for n, q in full["param"].items()}
        for pp in range(p):
            for tp in range(t):
                for pieces in shard_map.placement(CFG, t, p, pp, tp).values():
                    at = 0
                    for name, dim, start, stop in pieces:   # each piece back where it came from
                        part = reshard.cut(full["param"], pieces).narrow(dim, at, stop - start)
                        rebuilt[name].narrow(dim, start, stop - start).copy_(part)
                        at += stop - start
        assert all(torch.equal(rebuilt[n], full["param"][n]) for n in rebuilt), (t, p)


@pytest.mark.timeout(120)
def test_placement_is_what_the_hybrid_trainer_builds(no_children_left):
    ranks = launch(ckpt_workers.stage_against_placement, 4, long_run.SMALL, 1, 2, 2,
                   timeout=100)
    assert all(r["same_names"] and r["equal"] for r in ranks), ranks


@pytest.mark.timeout(300)
def test_a_run_saved_on_4_ranks_resumes_on_2_and_on_1_to_the_same_curve(tmp_path,
                                                                         no_children_left):
    """Saved at t2p2d1 (4 ranks) after 3 of 6 steps; resumed at t1p1d2 (2 ranks) and at
    t1p1d1 (1 rank); both curves are the uninterrupted 4-rank run's."""
    def plan(world, layout, folder):
        return long_run.plan(world, layout, steps=6, checkpoint_dir=str(tmp_path / folder),
                             checkpoint_every=3)

    whole = long_run.run(plan(4, "t2p2d1", "whole"), timeout=200)
    for folder in ("on2", "on1"):
        shutil.copytree(tmp_path / "whole", tmp_path / folder)
        shutil.rmtree(checkpoint_folder.step_dir(tmp_path / folder, 6))
    for world, layout, folder in ((2, "t1p1d2", "on2"), (1, "t1p1d1", "on1")):
        resumed = long_run.run(plan(world, layout, folder), timeout=200)
        assert (resumed.resumed_from_step, resumed.resumed_from_layout) == (3, "t2p2d1")
        assert resumed.losses[:3] == whole.losses[:3]       # carried in the checkpoint
        torch.testing.assert_close(torch.tensor(resumed.losses[3:], dtype=torch.float64),
                                   torch.tensor(whole.losses[3:], dtype=torch.float64),
                                   **LOSS_TOLERANCE)
