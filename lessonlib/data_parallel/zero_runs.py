"""The runs behind the sharding lesson: ZeRO stages 0-3 and PyTorch's own, on every rank.

What it teaches: sharding changes who holds what, never the numbers. ``train_stage`` trains
the tiny GPT with stage 0 (``DataParallel``), 1 (``ShardedOptimizer``), 2 or 3
(``FullyShardedDataParallel``), or with PyTorch's ``ZeroRedundancyOptimizer`` or FSDP2's
``fully_shard``, each rank starting from its own random weights and training on its shard of
every global batch; it returns the whole model's weights afterwards, what one step sent
(the ledger) and what the rank held. The tests compare every stage with one process on the
whole batch and with PyTorch's; ``labs/zero.py`` times them.

Laptop:  ``python -c "import lessonlib as L, lessonlib.data_parallel.zero_runs as z;
         print(L.launch(z.demo, 2))"``
GPU box: ``torchrun --nproc-per-node 8 labs/zero.py``
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer

from lessonlib import comm, device
from lessonlib.data import corpus_tokens, lm_batch, shard
from lessonlib.data_parallel.ddp import DataParallel
from lessonlib.data_parallel.fsdp import FullyShardedDataParallel
from lessonlib.data_parallel.fsdp_units import unit_modules
from lessonlib.data_parallel.ladder import replicate
from lessonlib.data_parallel.ladder_runs import replica_step
from lessonlib.data_parallel.sharded import padded_numel, tensor_bytes, zero_stage_bytes
from lessonlib.data_parallel.zero import ShardedOptimizer
from lessonlib.grid import new_groups
from lessonlib.instruments.breadcrumbs import progress
from lessonlib.models import SHARDING_CONFIG, GPTConfig, TinyGPT, lm_loss

# How each run shards: our stages 0-3, stage 1 after DDP-style all-reduce, and PyTorch's.
STAGES = {"0": "stage 0: DataParallel, everything replicated",
          "1": "stage 1: ShardedOptimizer after a reduce-scatter of the gradients",
          "1-ddp": "stage 1: DataParallel's all-reduce, then ShardedOptimizer",
          "2": "stage 2: FullyShardedDataParallel(reshard_after_forward=False)",
          "3": "stage 3: FullyShardedDataParallel(reshard_after_forward=True)",
          "3-noprefetch": "stage 3 without prefetching the next unit's gather",
          "torch-zero": "PyTorch: DDP + ZeroRedundancyOptimizer (stage 1)",
          "torch-fsdp2": "PyTorch: fully_shard on every unit and the root (stage 3)",
          "torch-fsdp2-2": "PyTorch: fully_shard(reshard_after_forward=False) (stage 2)"}
OPTIMIZERS = {"sgd": (torch.optim.SGD, {"lr": 0.05, "momentum": 0.9}),
              "adamw": (torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 0.1})}
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16}


ZERO_STAGE = {"0": 0, "1": 1, "1-ddp": 1, "2": 2, "3": 3, "3-noprefetch": 3, "torch-zero": 1,
              "torch-fsdp2": 3, "torch-fsdp2-2": 2}
STATE_BYTES = {"sgd": 4, "adamw": 8}              # fp32 momentum; AdamW's two moments


def check_choices(stage: str, optimizer: str) -> None:
    if stage not in STAGES:
        raise ValueError(f"stage={stage!r}: choose one of {list(STAGES)}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer={optimizer!r}: choose one of {list(OPTIMIZERS)}")


def build_model(cfg: GPTConfig, seed: int, dtype=torch.float32, tie=False,
                freeze=False) -> TinyGPT:
    """The tiny GPT, optionally with the output head tied to the token embedding and the
    position embedding frozen."""
    model = TinyGPT(cfg, seed).to(dtype)
    if tie:
        model.head.out.weight = model.embed.tok.weight       # one parameter, used twice
    if freeze:
        model.embed.pos.weight.requires_grad_(False)
    return model


def predicted(stage: str, cfg: GPTConfig, n: int, optimizer: str = "adamw",
              bf16: bool = False) -> dict:
    """ZeRO's per-stage bytes for this model (padding as each stage pads), and the bytes a
    step sends per rank on a ring."""
    params = list(build_model(cfg, 0).parameters())
    p = sum(t.numel() for t in params)
    padded = (sum(padded_numel(t.shape, n) for t in params) if stage != "1"
              else n * -(-p // n))
    # Gathered weights are in the compute dtype; shards, gradients and state stay fp32.
    width = 2 if bf16 and ZERO_STAGE[stage] >= 2 else 4
    held = zero_stage_bytes(ZERO_STAGE[stage], p, n, padded, width, 4, STATE_BYTES[optimizer])
    size = 4 * (padded if ZERO_STAGE[stage] else p)
    factor = 3 if ZERO_STAGE[stage] == 3 else 2
    return {"bytes_held": held, "bytes_sent_per_rank": factor * (n - 1) / n * size}


def _fully_shard(model: nn.Module, reshard: bool, compute_dtype) -> nn.Module:
    mesh = init_device_mesh(device.current_device().type, (dist.get_world_size(),))
    policy = MixedPrecisionPolicy(param_dtype=compute_dtype)
    for _, unit in unit_modules(model):
        fully_shard(unit, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)
    return fully_shard(model, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)


def setup(stage: str, model: nn.Module, optimizer: str, compute_dtype=None):
    """(the model to call, the optimizer, what to call between backward and step)."""
    check_choices(stage, optimizer)
    cls, kwargs = OPTIMIZERS[optimizer]
    nothing = lambda: None  # noqa: E731  (the other runs sync inside backward or step)
    if stage in ("0", "1-ddp"):
        ddp = DataParallel(model)
        trainable = [p for p in model.parameters() if p.requires_grad]
        opt = (cls(trainable, **kwargs) if stage == "0"
               else ShardedOptimizer(trainable, cls, **kwargs))
        return ddp, opt, nothing
    if stage == "1":
        replicate(model)
        opt = ShardedOptimizer(model.parameters(), cls, **kwargs)
        return model, opt, opt.reduce_scatter_gradients
    if stage in ("2", "3", "3-noprefetch"):
        fsdp = FullyShardedDataParallel(model, reshard_after_forward=stage != "2",
                                        compute_dtype=compute_dtype,
                                        prefetch=stage != "3-noprefetch")
        trainable = [p for p in fsdp.parameters() if p.requires_grad]
        return fsdp, cls(trainable, **kwargs), nothing
    if stage == "torch-zero":
        replicate(model)
        ids = [device.current_device()] if device.current_device().type == "cuda" else None
        ddp = nn.parallel.DistributedDataParallel(model, device_ids=ids)
        trainable = [p for p in model.parameters() if p.requires_grad]
        return ddp, ZeroRedundancyOptimizer(trainable, optimizer_class=cls, **kwargs), nothing
    replicate(model)
    model = _fully_shard(model, stage == "torch-fsdp2", compute_dtype)
    return model, cls([p for p in model.parameters() if p.requires_grad], **kwargs), nothing


def full_weights(stage: str, model: nn.Module, opt) -> dict[str, torch.Tensor]:
    """The whole model's weights on every rank, by name, in float64."""
    if stage in ("2", "3", "3-noprefetch"):
        state = model.full_state_dict()
    elif stage.startswith("torch-fsdp2"):
        state = {k: v.full_tensor() for k, v in model.state_dict().items()}
    else:
        inner = model.module if hasattr(model, "module") else model
        state = inner.state_dict()
    return {k: v.detach().double().cpu().clone() for k, v in state.items()}


def _local(t):
    """A DTensor's local shard (FSDP2 keeps parameters and their state as DTensors)."""
    return t.to_local() if hasattr(t, "to_local") else t


def held_bytes(stage: str, model: nn.Module, opt) -> dict[str, int]:
    """What this rank holds for the model's state after a step (before zero_grad)."""
    if stage in ("2", "3", "3-noprefetch"):
        return model.memory_bytes(opt)
    if stage in ("1", "1-ddp"):
        return opt.memory_bytes()
    params = [p for p in model.parameters() if p.requires_grad]
    inner = opt.optim if stage == "torch-zero" else opt
    state = [_local(v) for p in params for v in inner.state.get(p, {}).values()
             if torch.is_tensor(v) and v.shape == p.shape]
    held = {"weights": tensor_bytes(_local(p) for p in params),
            "gradients": tensor_bytes(_local(p.grad) for p in params if p.grad is not None),
            "optimizer": tensor_bytes(state)}
    return {**held, "total": sum(held.values())}


def train_step(model, opt, sync, tokens, cfg: GPTConfig, global_batch: int, step: int,
               seed: int = 0) -> dict:
    """One training step on this rank's shard of global batch ``step``: its ledger."""
    rank, n, dev = dist.get_rank(), dist.get_world_size(), device.current_device()
    x, y = lm_batch(tokens, global_batch, cfg.seq, step, seed)
    x, y = shard(x, rank, n).to(dev), shard(y, rank, n).to(dev)
    return replica_step(model, sync, opt, x, y)[1].summary()


def train_single(optimizer: str = "adamw", cfg: GPTConfig | None = None, steps: int = 3,
                 global_batch: int = 6, seed: int = 0, dtype: str = "float64", tie: bool = False,
                 freeze: bool = False) -> tuple[dict[str, torch.Tensor], TinyGPT]:
    """One process on the whole batch, the run every stage must reproduce: (its weights by
    name after ``steps`` steps, the model)."""
    cfg = cfg or SHARDING_CONFIG
    model = build_model(cfg, seed, DTYPES[dtype], tie, freeze)
    cls, kwargs = OPTIMIZERS[optimizer]
    opt = cls([p for p in model.parameters() if p.requires_grad], **kwargs)
    tokens, _ = corpus_tokens()
    for step in range(steps):
        x, y = lm_batch(tokens, global_batch, cfg.seq, step, seed)
        loss = lm_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, model


@dataclass(frozen=True)
class StageRun:
    """One rank's run of ``train_stage``: the whole model's weights after training (by
    state-dict name), each step's ledger summary, the bytes held after the last step (by
    part) and the padding of stage 1's flat shard."""
    rank: int
    weights: dict
    ledgers: list
    held: dict
    padding: int


def train_stage(stage: str = "3", optimizer: str = "adamw", cfg: GPTConfig | None = None,
                steps: int = 3, global_batch: int = 6, seed: int = 0, dtype: str = "float64",
                tie: bool = False, freeze: bool = False,
                compute_dtype: str | None = None) -> StageRun:
    """On each rank: train ``steps`` steps of ``stage`` from this rank's own random weights
    (the wrap must copy rank 0's) on its shard of each global batch. Returns a ``StageRun``:
    the whole model's weights after training, each step's ledger and what the rank held."""
    check_choices(stage, optimizer)
    cfg = cfg or SHARDING_CONFIG
    rank, dev = dist.get_rank(), device.current_device()
    model = build_model(cfg, seed + 7919 * rank, DTYPES[dtype], tie, freeze).to(dev)
    model, opt, sync = setup(stage, model, optimizer,
                             DTYPES[compute_dtype] if compute_dtype else None)
    tokens, _ = corpus_tokens()
    ledgers, held = [], {}
    for step in range(steps):
        ledgers.append(train_step(model, opt, sync, tokens, cfg, global_batch, step, seed))
        held = held_bytes(stage, model, opt)
        progress(f"stage {stage} step {step + 1} of {steps}")
    return StageRun(rank=rank, weights=full_weights(stage, model, opt), ledgers=ledgers,
                    held=held, padding=opt.padding() if stage in ("1", "1-ddp") else 0)


def demo() -> dict:
    """Two ZeRO-3 steps: this rank's bytes held and the collectives of one step."""
    out = train_stage("3", steps=2)
    return {"held": out.held, "ledger": out.ledgers[-1]}


def train_cases(cases: list[dict]) -> list[StageRun]:
    """``train_stage(**case)`` for every case, in one launch (spawning ranks is the slow part)."""
    return [train_stage(**case) for case in cases]


def refusals_outside_group() -> dict:
    """On a rank outside a group, both sharded pieces refuse before sending anything."""
    group = new_groups([[0]])[0]                # every rank must take part in creating it
    out = {}
    if dist.get_rank() != 0:
        model = nn.Linear(3, 2)
        for name, make in (("optimizer", lambda: ShardedOptimizer(model.parameters(),
                                                                  torch.optim.SGD, group, lr=1)),
                           ("fsdp", lambda: FullyShardedDataParallel(model, group=group))):
            with comm.ledger() as book:
                try:
                    make()
                except ValueError as exc:
                    out[name] = (str(exc), book.count())
    dist.barrier()
    return out
