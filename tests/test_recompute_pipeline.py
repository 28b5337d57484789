"""Recomputation in pipeline stages: a TinyGPT whose blocks recompute ("selective" or "full",
set with ``models.set_recompute`` before the model is cut into stages) trains through the
1F1B executor on 2 ranks exactly as the one-process model without recompute does (first-step
gradients of each stage, float32 to 1e-6 of the largest gradient)."""
import pytest
import torch
import torch.distributed as dist

import lessonlib
from lessonlib.baseline import corpus_batches, flat
from lessonlib.models import PARITY_CONFIG, TinyGPT, lm_loss, set_recompute
from lessonlib.pipeline import runs
from lessonlib.pipeline.stages import stage_parameters


def recompute_worker(modes=("selective", "full"), m: int = 2, micro: int = 2) -> dict:
    p, stage, cfg = dist.get_world_size(), dist.get_rank(), PARITY_CONFIG
    ref_model, first_grads, _ = runs.reference(m, steps=1, micro=micro)
    want = flat(first_grads[q] for q in stage_parameters(ref_model, p, 1, stage))
    out = {}
    for mode in modes:
        model = set_recompute(TinyGPT(cfg, 0), mode)
        chunks, runner = runs.make_runner("lessonlib", "1f1b", model, p, m, 1, stage, lm_loss,
                                          (micro, cfg.seq, cfg.hidden))
        x, y = corpus_batches(cfg, micro * m, 0)(0)
        runner.step(x, y)
        got = flat(q.grad for c in chunks for q in c.parameters())
        out[mode] = ((got - want).abs().max() / want.abs().max()).item()
        out[mode + " blocks"] = sorted({b.recompute for c in chunks for b in c.modules()
                                        if hasattr(b, "recompute")})
    return out


@pytest.mark.timeout(120)
def test_recomputing_stages_equal_one_process():
    for r in lessonlib.launch(recompute_worker, 2, timeout=100):
        for mode in ("selective", "full"):
            assert r[mode] < 1e-6, r
            assert r[mode + " blocks"] == [mode], r
    assert torch.get_default_dtype() == torch.float32
