"""lessonlib: the real implementations behind the hands-on distributed training course.

Each module teaches one idea (see the README's map). The names most lessons need are here:

    import lessonlib as L
    L.launch(L.launcher.demo_rank_sum, 4)      # 4 ranks, gloo on CPU or NCCL on GPUs

Submodules are imported on first use, so ``python -m lessonlib.<module>`` runs cleanly and
the pure cost model (``lessonlib.costmodel``) never pulls in torch.
"""
import importlib

__version__ = "0.1.0"
_FROM_LAUNCHER = ("launch", "run", "RankError", "LaunchTimeout")


def __getattr__(name):
    if name in _FROM_LAUNCHER:
        return getattr(importlib.import_module("lessonlib.launcher"), name)
    if name == "progress":
        return importlib.import_module("lessonlib.instruments.breadcrumbs").progress
    try:
        return importlib.import_module(f"lessonlib.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"lessonlib.{name}":
            raise
        raise AttributeError(f"module 'lessonlib' has no attribute {name!r}") from None
