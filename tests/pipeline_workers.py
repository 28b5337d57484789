"""Rank functions for tests/test_pipeline_zero_bubble.py: one launch per world size runs the
zero-bubble parity cases (3 SGD steps, float64) and records each schedule's communication trace."""
import nccl_workers
import torch

from lessonlib.pipeline import schedule_runs


def zero_bubble(p: int, steps: int = 3) -> dict:
    cases = schedule_runs.zero_bubble_cases(p, torch=p == 2)
    traces = {f"{s} m={m}": nccl_workers._pipeline(s, m, v)      # warm-up, steady, cool-down
              for engine, s, m, v in cases if engine == "lessonlib" and m == 2 * p + 1}
    return {"parity": schedule_runs.rank_parity(cases, steps=steps, dtype=torch.float64),
            "traces": traces}
