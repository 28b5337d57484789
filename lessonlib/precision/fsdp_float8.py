"""FSDP's FP8 all-gather: a unit's Float8Linear weights travel as e4m3 bytes, half of BF16's.

What it teaches: a ``Float8Linear`` casts its weight to e4m3 before its forward GEMM anyway,
so FSDP can cast each *shard* before the all-gather and move 1 byte per element instead of 2
(bf16) or 4. The cast must be the same on every rank, or the gathered rows would carry
different scales: each rank takes the amax of its shard, one all-reduce (MAX) per unit
agrees on the tensor's amax, and every rank casts its rows with the same tensorwise scale
(as torchao's ``enable_fsdp_float8_all_gather``, tensorwise only, which all-reduces each
weight's amax on its own, or every weight's in one call after the optimizer step with
``precompute_float8_dynamic_scale_for_fsdp``). The gathered bytes *are* the weight the
layer's GEMMs use: they reach the layer attached to the gathered weight (``weight.float8``),
so nothing is cast twice. The weight the module holds during compute
is the dequantized e4m3 weight in the compute dtype, the tensor autograd hands the weight's
gradient back through, to be reduce-scattered in the compute dtype as before. The rest of a
unit (LayerNorms, biases, the head) is gathered as before, in a second all-gather.

``Float8AllGatherFSDP`` is ``FullyShardedDataParallel`` with one seam overridden, its
``_launch_gather``: the same units, prefetch, frees and reduce-scatters. ZeRO-3
(``reshard_after_forward=True``): backward's re-gather moves the same bytes again, and the
layer's backward uses the e4m3 copy its forward kept (1 byte per element held until then).

Laptop:  ``python -c "import lessonlib as L; from lessonlib.precision import fsdp_float8 as f;
         print(L.launch(f.gather_bytes, 2)[0])"``
GPU box: the same under NCCL (the bytes travel as uint8 there too).
"""
from __future__ import annotations

import copy
import dataclasses

import torch
import torch.distributed as dist

from lessonlib import comm
from lessonlib.data import corpus_tokens, lm_batch, shard
from lessonlib.data_parallel.fsdp import FullyShardedDataParallel
from lessonlib.data_parallel.fsdp_units import Unit, post_gather
from lessonlib.models import TINY, GPTConfig, TinyGPT, lm_loss
from lessonlib.precision.fp8 import E4M3, Scaled, amax_to_scale, cast
from lessonlib.precision.linear import Float8Linear, convert_to_float8


def _is_float8_weight(slot) -> bool:
    return all(isinstance(m, Float8Linear) and attr == "weight"
               and m.recipe.granularity == "tensor" for m, attr in slot.places)


def _repacked(name: str, slots) -> Unit:
    """A unit of ``slots`` alone, their offsets renumbered into its own flat shard."""
    out, offset = Unit(name), 0
    for s in slots:
        out.slots.append(dataclasses.replace(s, offset=offset))
        offset += s.shard_numel
    return out


class Float8AllGatherFSDP(FullyShardedDataParallel):
    """``FullyShardedDataParallel`` over a model with tensorwise ``Float8Linear`` layers,
    whose weights it all-gathers as e4m3 bytes with a scale agreed over the group."""

    def __init__(self, module, **kwargs):
        layers = [m for m in module.modules() if isinstance(m, Float8Linear)]
        if not layers or any(m.recipe.granularity != "tensor" for m in layers):
            raise ValueError("Float8AllGatherFSDP gathers tensorwise Float8Linear weights: "
                             "convert the model with convert_to_float8(model, 'tensorwise')")
        super().__init__(module, **kwargs)
        self._split = {}                  # id(unit) -> (its FP8 weights, the rest), as units
        for unit in self._all_units():
            fp8 = [s for s in unit.slots if _is_float8_weight(s)]
            if fp8:
                rest = [s for s in unit.slots if not _is_float8_weight(s)]
                self._split[id(unit)] = (_repacked(unit.name, fp8), _repacked(unit.name, rest))

    @torch.no_grad()
    def _launch_gather(self, unit: Unit, dtype: torch.dtype | None = None):
        if id(unit) not in self._split or dtype is not None:      # no FP8 weight, or a
            return super()._launch_gather(unit, dtype)            # state dict's full copy
        fp8, rest = self._split[id(unit)]
        scales = self._agreed_scales(fp8)                                          # (n,)
        finish_bytes = self._gather_e4m3(fp8, scales)
        finish_rest = super()._launch_gather(rest) if rest.slots else list

        def finish() -> list[torch.Tensor]:
            weights = dict(zip((id(s.shard) for s in fp8.slots), finish_bytes()))
            weights.update(zip((id(s.shard) for s in rest.slots), finish_rest()))
            return [weights[id(s.shard)] for s in unit.slots]
        return finish

    def _agreed_scales(self, fp8: Unit) -> torch.Tensor:
        """One tensorwise scale per weight, from the amax over every rank's shard."""
        amax = torch.stack([s.shard.detach().abs().max().float() for s in fp8.slots])  # (n,)
        if self.world_size > 1:
            comm.all_reduce(amax, op=dist.ReduceOp.MAX, group=self.group)
        return amax_to_scale(amax, E4M3)

    def _gather_e4m3(self, fp8: Unit, scales: torch.Tensor):
        """Cast this rank's shards with the agreed scales and all-gather the bytes (gloo has
        no float8 type: they travel as uint8); returns what waits and rebuilds the weights."""
        mine = torch.cat([cast(s.shard.reshape(1, -1), scale.view(1, 1), E4M3,
                               (1, s.shard_numel)).view(torch.uint8).reshape(-1)
                          for s, scale in zip(fp8.slots, scales)])                     # (S,)
        rows, work = post_gather(mine, self.group, self.world_size)                 # (d, S)

        def finish() -> list[torch.Tensor]:
            if work is not None:
                work.wait()
            out = []
            for s, scale in zip(fp8.slots, scales):
                q = s.full_from(rows.view(E4M3)).contiguous()                      # (N, K)
                weight = Scaled(q, scale.view(1, 1), tuple(q.shape))
                full = weight.dequantize(self.compute_dtype)
                full.float8 = weight          # the layer's GEMMs use these bytes as they are
                out.append(full)
            return out
        return finish


# ---------------------------------------------------------------- what the ranks measure
def _gathers(book) -> dict:
    """The all-gathers of one ledger by dtype: {"torch.uint8": bytes, ...}."""
    out: dict[str, int] = {}
    for e in book.events:
        if e.op == "all_gather":
            out[e.dtype] = out.get(e.dtype, 0) + e.bytes
    return out


def _step(model, idx, targets, lr: float = 0.1) -> None:
    """One SGD step (the wrapped model's shards, or a whole model)."""
    loss = lm_loss(model(idx), targets)
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= lr * p.grad
            p.grad = None


@dataclasses.dataclass
class GatherBytes:
    """One rank's ``gather_bytes``: the all-gathers' bytes by dtype (``{"torch.bfloat16":
    n, ...}``) and the amax all-reduces, with bf16 gathers and with FP8 gathers; the
    elements of this rank's FP8 weight shards; after one SGD step, the largest weight step
    and the largest difference from one process."""
    rank: int
    bf16_gathers: dict
    bf16_amax_all_reduces: int
    fp8_gathers: dict
    fp8_amax_all_reduces: int
    fp8_shard_elements: int
    max_weight_step: float
    max_weight_diff_vs_one_process: float


def gather_bytes(cfg: GPTConfig = TINY, batch: int = 8, seed: int = 0) -> GatherBytes:
    """On each rank: the tiny GPT's tensorwise FP8 model under ZeRO-2 with bf16 compute,
    all-gathering its Float8Linear weights in bf16 and as e4m3 (one step each, ledgers by
    dtype: ``bf16_gathers``, ``fp8_gathers``; a rank's payload, its shard), the elements of
    this rank's shards of those weights (``fp8_shard_elements``: 2 bytes each in bf16, 1 in
    e4m3), and, in float32, the largest weight
    difference after one SGD step between FP8-gathering FSDP and the same FP8 model in one
    process on the same two halves of the batch (``max_weight_diff_vs_one_process``)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    tokens, _ = corpus_tokens()
    idx, targets = lm_batch(tokens, batch, cfg.seq, 0, seed)
    mine = shard(idx, rank, n), shard(targets, rank, n)
    model = convert_to_float8(TinyGPT(cfg, seed), "tensorwise")
    out = {}
    for key, cls in (("bf16_gathers", FullyShardedDataParallel),
                     ("fp8_gathers", Float8AllGatherFSDP)):
        fsdp = cls(copy.deepcopy(model), reshard_after_forward=False,
                   compute_dtype=torch.bfloat16, group=None)
        with comm.ledger() as book:
            lm_loss(fsdp(mine[0]).float(), mine[1]).backward()
        out[key] = _gathers(book)
        out[key.replace("gathers", "amax_all_reduces")] = book.count("all_reduce")
        if cls is Float8AllGatherFSDP:
            out["fp8_shard_elements"] = sum(s.shard_numel for f, _ in fsdp._split.values()
                                            for s in f.slots)
    fsdp = Float8AllGatherFSDP(copy.deepcopy(model), reshard_after_forward=False)
    _step(fsdp, *mine)
    got = fsdp.full_state_dict()
    alone = copy.deepcopy(model)                 # one process: both halves, gradients averaged
    for r in range(n):
        (lm_loss(alone(shard(idx, r, n)), shard(targets, r, n)) / n).backward()
    with torch.no_grad():
        for p in alone.parameters():
            p -= 0.1 * p.grad
    want, start = alone.state_dict(), model.state_dict()
    return GatherBytes(rank, **out,
                       max_weight_step=max((got[k] - start[k]).abs().max().item() for k in got),
                       max_weight_diff_vs_one_process=max((got[k] - want[k]).abs().max().item()
                                                          for k in got))
