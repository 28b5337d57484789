"""Beyond three axes: the tiny GPT (or its MoE variant) on TP, CP, PP, DP/ZeRO-1 and EP at once.

What it teaches: the layouts trained since 2021 add axes to lesson 05's three, and each new
axis is one room's idea applied in one place. The builder applies them in one documented
order, as torchtitan's ``parallelize_llama`` does (TP, then CP, then PP, then FSDP/DP):

1. **tensor** (tp group): every block's attention and MLP split over t ranks
   (``tensor_parallel.parallelize_block``); in an MoE block the attention is split and the
   MoE layer becomes **expert-parallel** over the ep group (``expert_parallel``), its E/e
   experts replicated over the t ranks, which hold the same activations;
2. **context** (cp group): every sequence cut into c shards (zig-zag); attention becomes
   ``ring_attention`` over the cp group and the embedding reads each token's place in the
   whole sequence (``context_parallel.layout.positions_of``); nothing else sees the cut;
3. **pipeline** (pp group): the model cut into p stages of whole layers
   (``hybrid.stage_counts``), run with 1F1B on (b, s/c, h) activations;
4. **data** (the dp_cp group: the d*c ranks holding the same weights): the gradients of the
   dense weights averaged over them, one flat all-reduce, or with ``shard="zero1"`` a
   reduce-scatter, each rank stepping its 1/(d c) of the weights, and an all-gather
   (``data_parallel.zero.ShardedOptimizer``); an expert's gradients are summed over the d/e
   ranks holding a copy (the edp group) and divided by d (``expert_parallel.groups``).

The ranks are laid out in Megatron-Core's order (``grid.MEGATRON_ORDER``: tp innermost,
then cp, then dp, pp outermost). Every rank builds its shard from the same full model, so
the run equals one process training the model on the whole batch, in float64: ``train``
compares each rank's shard of the first step's gradients and of the final weights, and
``hybrid.parity_summary`` the losses. The MoE runs use a capacity factor E/k (no token is
ever dropped, so routing does not depend on how the batch is cut) and no auxiliary loss.

Laptop:  ``python -c "from lessonlib import hybrid_axes as H; print(H.parity(H.run(2, 2, 2)))"``
GPU box: ``torchrun --nproc-per-node 8 labs/hybrid.py --cp 2 --layouts t2p2d1`` (NCCL).
"""
from __future__ import annotations

import copy
import statistics
import time
from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch import nn

from lessonlib import comm, device
from lessonlib.baseline import corpus_batches, grads_as_model, max_abs_diff, train_one_process
from lessonlib.context_parallel.layout import check_divisible, positions_of, shard_sequence
from lessonlib.context_parallel.ring import ring_attention
from lessonlib.data import shard
from lessonlib.data_parallel.zero import ShardedOptimizer
from lessonlib.expert_parallel.groups import expert_parameters
from lessonlib.expert_parallel.layer import check_split, expert_parallel
from lessonlib.grid import MEGATRON_ORDER, ParallelContext, check_grid
from lessonlib.hybrid import check_layout, largest, stage_counts, step_losses
from lessonlib.launcher import launch
from lessonlib.models import HYBRID_CONFIG, Block, Embed, GPTConfig, TinyGPT, lm_loss, moe_gpt
from lessonlib.moe import MoELayer
from lessonlib.pipeline.executor import PipelineExecutor
from lessonlib.pipeline.schedules import make
from lessonlib.pipeline.stages import split_layers
from lessonlib.tensor_parallel.layers import TensorParallelSelfAttention
from lessonlib.tensor_parallel.parallelize import parallelize_block

SHARDS = ("none", "zero1")
N_EXPERTS, TOP_K = 4, 2
LAYOUT = "zigzag"


# ---------------------------------------------------------------- checks (pure, before any process)
def check_axes(cfg: GPTConfig, tp: int = 1, cp: int = 1, pp: int = 1, dp: int = 1, ep: int = 1,
               shard_on: str = "none", global_batch: int = 8, m: int = 2,
               world_size: int | None = None) -> int:
    """One line naming the setting that cannot train ``cfg``; returns the micro-batch size."""
    b = check_layout(cfg, dp, pp, tp, global_batch, m)
    check_grid(world_size or dp * pp * cp * tp, dp, pp, tp, None, cp, ep, MEGATRON_ORDER)
    if cp > 1:
        check_divisible(cfg.seq, cp, LAYOUT)
    if shard_on not in SHARDS:
        raise ValueError(f"shard={shard_on!r} is not a sharding of the dp axis; use one of {SHARDS}")
    if ep > 1:
        check_split(N_EXPERTS, ep, TOP_K)
        if cp > 1 or shard_on != "none":
            raise ValueError(f"ep={ep} with cp={cp}, shard={shard_on!r}: expert parallelism "
                             f"is combined here with tp, pp and plain dp only; use cp=1, "
                             f"shard='none'")
    return b


def make_model(cfg: GPTConfig, moe: bool, seed: int = 0) -> TinyGPT:
    """The full model, float64: the dense tiny GPT, or its MoE variant with capacity E/k."""
    model = (moe_gpt(cfg, N_EXPERTS, TOP_K, capacity_factor=N_EXPERTS / TOP_K, seed=seed)
             if moe else TinyGPT(cfg, seed))
    return model.double()


# ---------------------------------------------------------------- the rooms, in order
def tensor_parallel_block(block: Block, ctx: ParallelContext) -> nn.Module:
    """Step 1: TP inside the block; an MoE layer becomes expert-parallel instead."""
    if not isinstance(block.mlp, MoELayer):
        return parallelize_block(block, ctx.tp_group) if ctx.tp > 1 else block
    twin = block                                   # already this stage's copy
    if ctx.tp > 1:
        twin.attn = TensorParallelSelfAttention.from_attention(block.attn, ctx.tp_group)
    if ctx.ep > 1:
        twin.mlp = expert_parallel(block.mlp, ctx.ep_group)
    return twin


class RingSelfAttention(nn.Module):
    """Step 2 on attention: the same projections (dense or TP), ring attention over cp."""

    def __init__(self, attn: nn.Module, group):
        super().__init__()
        self.attn, self.group = attn, group

    def forward(self, x):                                              # (b, s/c, h)
        attn, (b, n, _) = self.attn, x.shape
        if hasattr(attn, "qkv"):                                       # tensor-parallel
            q, k, v = (attn.split_heads(z) for z in attn.qkv(x).chunk(3, dim=-1))
        else:
            q, k, v = (attn.split_heads(f(x)) for f in (attn.q, attn.k, attn.v))
        y = ring_attention(q, k, v, self.group, causal=True, layout=LAYOUT)
        return attn.proj(y.transpose(1, 2).reshape(b, n, -1))         # (b, s/c, h)


class ShardPositionEmbed(nn.Module):
    """Step 2 on the embedding: tokens plus the positions of this rank's shard."""

    def __init__(self, embed: nn.Module, group):
        super().__init__()
        self.embed, self.group = embed, group

    def forward(self, idx):                                            # (b, s/c)
        c = dist.get_world_size(self.group)
        positions = positions_of(dist.get_rank(self.group), c, idx.shape[1] * c, LAYOUT)
        return self.embed.tok(idx) + self.embed.pos(positions.to(idx.device))


def build_stage(model: TinyGPT, ctx: ParallelContext) -> nn.Sequential:
    """This rank's shard: TP/EP in every block, then CP, on the layers of its pipeline stage.
    Copies; sends nothing (so the same call cuts a dense model of gradients for the check).
    The stage's layers are copied out first, because a layer holding a process group cannot
    be deep-copied; applying the rooms to those copies gives the same modules."""
    cut = split_layers(model, ctx.pp, stage_counts(model.cfg.layers, ctx.pp))[ctx.pp_rank]
    parts = []
    for part in cut:
        if isinstance(part, Block):
            part = tensor_parallel_block(part, ctx)
            if ctx.cp > 1:
                part.attn = RingSelfAttention(part.attn, ctx.cp_group)
        elif isinstance(part, Embed) and ctx.cp > 1:
            part = ShardPositionEmbed(part, ctx.cp_group)
        parts.append(part)
    return nn.Sequential(*parts)


def _average(params, group, divisor: float) -> None:
    """Sum the gradients over ``group`` (one flat all-reduce) and divide by ``divisor``."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    if dist.get_world_size(group) > 1:
        comm.all_reduce(flat, group=group)
    flat /= divisor
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def sync_gradients(stage: nn.Module, ctx: ParallelContext) -> None:
    """Step 4: dense weights averaged over the d*c ranks that hold them; an expert's summed
    over the d/e ranks holding a copy and divided by d."""
    experts = {id(p) for p in expert_parameters(stage)}
    _average([p for p in stage.parameters() if id(p) not in experts], ctx.dp_cp_group,
             ctx.dp * ctx.cp)
    if experts:
        _average([p for p in stage.parameters() if id(p) in experts], ctx.edp_group, ctx.dp)


class AxesTrainer:
    """One rank of a (tp, cp, pp, dp, ep) run: its shard, a 1F1B executor on its pipeline,
    SGD on the shard, plain or ZeRO-1 (``shard_on="zero1"``) on the dp_cp group."""

    def __init__(self, model: TinyGPT, ctx: ParallelContext, m: int, global_batch: int,
                 lr: float = 0.1, shard_on: str = "none"):
        cfg = model.cfg
        self.b = check_axes(cfg, ctx.tp, ctx.cp, ctx.pp, ctx.dp, ctx.ep, shard_on, global_batch,
                            m, dist.get_world_size())
        self.ctx, self.shard_on = ctx, shard_on
        self.stage = build_stage(model, ctx).to(device.current_device())
        self.params = list(self.stage.parameters())
        self.executor = PipelineExecutor(
            make("1f1b", ctx.pp, m), ctx.pp_rank, [self.stage], lm_loss,
            (self.b, cfg.seq // ctx.cp, cfg.hidden), stage_ranks=ctx.pp_ranks,
            group=ctx.pp_group, dtype=torch.float64)
        self.opt = (ShardedOptimizer(self.params, torch.optim.SGD, group=ctx.dp_cp_group, lr=lr)
                    if shard_on == "zero1" else torch.optim.SGD(self.params, lr=lr))

    def my_tokens(self, t: torch.Tensor) -> torch.Tensor:
        """This rank's rows (dp) and sequence shard (cp) of a global (B, s) batch."""
        t = shard(t, self.ctx.dp_rank, self.ctx.dp)
        return shard_sequence(t, self.ctx.cp_group, LAYOUT) if self.ctx.cp > 1 else t

    def step(self, x, y, keep_grads: bool = False) -> dict:
        """Pipeline forward/backward on this rank's tokens, the dp_cp sync, one SGD step.
        ``keep_grads``: also return the averaged gradients (under ZeRO-1 an extra all-reduce
        of a copy, made for the check only)."""
        ctx, dev = self.ctx, device.current_device()
        x, y = self.my_tokens(x).to(dev), self.my_tokens(y).to(dev)
        self.opt.zero_grad(set_to_none=False)
        with comm.ledger() as pipe_book:
            result = self.executor.step(x if ctx.is_first_stage else None,
                                        y if ctx.is_last_stage else None,
                                        align=False, timeline=False)
        grads = None
        with comm.ledger() as dp_book:
            if self.shard_on == "zero1":
                if keep_grads:                       # for the check: a copy, all-reduced
                    copies = [SimpleNamespace(grad=p.grad.clone()) for p in self.params]
                    _average(copies, ctx.dp_cp_group, ctx.dp * ctx.cp)
                    grads = [c.grad for c in copies]
                self.opt.reduce_scatter_gradients()
            else:
                sync_gradients(self.stage, ctx)
        if keep_grads and grads is None:
            grads = [p.grad.detach().clone() for p in self.params]
        self.opt.step()
        return {"losses": result.losses, "grads": grads,
                "pipe": pipe_book.summary(), "dp": dp_book.summary()}


# ---------------------------------------------------------------- the run and its proof
def reference(cfg: GPTConfig, moe: bool, global_batch: int = 8, steps: int = 3,
              lr: float = 0.1, seed: int = 0, dev=None):
    """One process, whole batch, float64: (model after the steps, first grads, losses)."""
    model = make_model(cfg, moe, seed).to(dev)
    batch_of = corpus_batches(cfg, global_batch, seed)
    run = train_one_process(model, lambda step: tuple(t.to(dev) for t in batch_of(step)),
                            steps, lr=lr)
    return model, grads_as_model(model, run["first_grads"]), run["losses"]


def train(tp: int = 1, cp: int = 1, pp: int = 1, dp: int = 1, ep: int = 1,
          shard_on: str = "none", moe: bool = False, cfg: GPTConfig = HYBRID_CONFIG,
          m: int = 2, global_batch: int = 8, steps: int = 3, lr: float = 0.1,
          seed: int = 0) -> dict:
    """Rank side: ``steps`` SGD steps on the grid, then this rank's shard of one process's
    first-step gradients and final weights against its own; ``events``: every message of
    the run, groups' creation included, for ``comm.nccl_hazards``."""
    with comm.ledger() as book:
        result = _train(tp, cp, pp, dp, ep, shard_on, moe, cfg, m, global_batch, steps, lr, seed)
    return {**result, "events": book.events}


def _train(tp, cp, pp, dp, ep, shard_on, moe, cfg, m, global_batch, steps, lr, seed) -> dict:
    ctx = ParallelContext.build(dp, pp, tp, cp=cp, ep=ep, order=MEGATRON_ORDER)
    batch_of = corpus_batches(cfg, global_batch, seed)
    trainer = AxesTrainer(make_model(cfg, moe, seed), ctx, m, global_batch, lr, shard_on)
    losses, books, first_grads, seconds = [], [], None, []
    for step in range(steps):
        comm.barrier()                   # every rank starts the step together, so times compare
        start = time.perf_counter()
        out = trainer.step(*batch_of(step), keep_grads=step == 0)
        seconds.append(time.perf_counter() - start)
        first_grads = out["grads"] if step == 0 else first_grads
        losses.append(out["losses"])
        books.append({"pipe": out["pipe"], "dp": out["dp"]})
    dense, dense_grads, dense_losses = reference(cfg, moe, global_batch, steps, lr, seed,
                                                 device.current_device())
    result = {"rank": ctx.rank, "coords": ctx.coords, "coords4": ctx.coords4, "losses": losses,
              "cp_ranks": ctx.cp_ranks, "ep_ranks": ctx.ep_ranks,
              "traffic": books, "param_count": sum(p.numel() for p in trainer.params),
              "step_time_s": statistics.median(seconds[1:] or seconds),
              "max_grad_diff": max_abs_diff(first_grads, build_stage(dense_grads, ctx).parameters()),
              "max_weight_diff": max_abs_diff(trainer.params, build_stage(dense, ctx).parameters()),
              "dense_losses": dense_losses}
    ctx.destroy()
    return result


def run(tp: int = 1, cp: int = 1, pp: int = 1, dp: int = 1, ep: int = 1, shard_on: str = "none",
        moe: bool = False, cfg: GPTConfig = HYBRID_CONFIG, m: int = 2, global_batch: int = 8,
        timeout: float = 180, **settings) -> list[dict]:
    """Caller side: check the layout (one line), then launch ``train`` on t*c*p*d ranks."""
    check_axes(cfg, tp, cp, pp, dp, ep, shard_on, global_batch, m)
    if ep > 1 and not moe:
        raise ValueError(f"ep={ep} needs experts: pass moe=True (the MoE tiny GPT)")
    return launch(train, tp * cp * pp * dp, tp=tp, cp=cp, pp=pp, dp=dp, ep=ep,
                  shard_on=shard_on, moe=moe, cfg=cfg, m=m, global_batch=global_batch,
                  timeout=timeout, **settings)


def parity(per_rank: list[dict]) -> dict:
    """Caller side: the run's losses (the last stages' micro-batch means) against one
    process's, and the ranks' largest gradient and weight differences from their shard."""
    losses, dense = step_losses(per_rank), per_rank[0]["dense_losses"]
    return {"losses": losses, "dense_losses": dense,
            "max_loss_diff": max(abs(a - b) for a, b in zip(losses, dense)),
            "max_grad_diff": largest(per_rank, "max_grad_diff"),
            "max_weight_diff": largest(per_rank, "max_weight_diff")}
