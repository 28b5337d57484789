"""Choosing t, p and d: try every layout, keep those that fit, rank them by predicted speed.

``plan(model, cluster, n_gpus, global_batch)`` enumerates every valid (t, p, d, b, v) with
t*p*d = n_gpus, estimates each one, and splits them into layouts that fit in memory (fastest
first) and layouts that do not (with how much they miss by). ``explain(plan)`` says in words
why the best layout wins, following Megatron-LM 2021's takeaways (Narayanan et al., §3):
tensor parallelism up to the GPUs of one server, pipeline parallelism across servers (#1);
model parallelism t*p just large enough to fit, data parallelism for the rest (#2).
Where t > 1 a layout assumes sequence parallelism and selective recompute, as Megatron does
(Korthikanti et al. 2022), unless ``recompute=`` or ``sequence_parallel=`` is given; every
explanation says which recompute it assumed.

``tp_sweep`` is the lesson's "sweet spot" experiment: one model on a fixed number of GPUs,
throughput against t.

Run ``python -m lessonlib.costmodel --plan --model megatron-1T --gpus 1024 --global-batch
2048 --gpu A100-80GB``.
"""
from dataclasses import dataclass, field

from lessonlib.argcheck import positive_int

from .memory import BYTES_PER_PARAM
from .model import divisors
from .throughput import Layout, estimate, memory_estimate, timed

GB = 1e9


# The planner estimates every layout; beyond this many GPUs that is no longer a quick answer.
MAX_PLAN_GPUS = 1 << 17

# Every pipeline schedule the cost model prices: 1F1B and the zero-bubble ZB-H1 and ZBV (Qi
# et al. 2024). ``plan`` tries only 1F1B unless given these (``schedules=PLAN_SCHEDULES``): the
# lesson's 1 T design question (notebook 05) is a 1F1B answer, while the command line's
# ``--plan`` and the five-axis ``search.plan_job`` try them all.
PLAN_SCHEDULES = ("1f1b", "zb-h1", "zbv")


def activation_options(t, options):
    """SP + selective recompute where t > 1 unless ``options`` choose either; t = 1 keeps
    ``Layout``'s default."""
    if t == 1 or "recompute" in options or "sequence_parallel" in options:
        return options
    return {"recompute": "selective", "sequence_parallel": True, **options}


def candidate_layouts(model, n_gpus, global_batch, microbatches=(1, 2, 4, 8),
                      interleave=(1, 2, 4), schedules=("1f1b",), **options):
    """Every Layout with t*p*d = n_gpus that ``model`` and the batch allow, for each
    pipeline schedule in ``schedules`` ("1f1b", "zb-h1", "zbv"; interleaving only 1F1B)."""
    microbatches = check_choices("microbatches", microbatches, "the micro-batch sizes b to try",
                                 (1, 2, 4, 8))
    interleave = check_choices("interleave", interleave, "the model chunks per stage v to try",
                               (1, 2, 4))
    out = []
    for t in divisors(n_gpus):
        if model.a % t or model.h % t:
            continue
        chosen = activation_options(t, options)
        for p in divisors(n_gpus // t):
            if p > model.L:
                continue
            d = n_gpus // (t * p)
            for b in microbatches:
                if global_batch % (b * d):
                    continue
                for v in interleave if p > 1 else (1,):
                    m = global_batch // (b * d)
                    if v > 1 and (model.L % p or (model.L // p) % v or m % p):
                        continue
                    for sched in (schedules if p > 1 and v == 1 else ("1f1b",)):
                        out.append(Layout(t=t, p=p, d=d, b=b, m=m, v=v, schedule=sched,
                                          **chosen))
    return out


@dataclass
class Plan:
    """Layouts for one model, cluster, GPU count and batch: ``ranked`` fit (fastest first),
    ``rejected`` do not fit (smallest shortfall first)."""

    model: object
    cluster: object
    n_gpus: int
    global_batch: int
    ranked: list = field(default_factory=list)
    rejected: list = field(default_factory=list)

    @property
    def best(self):
        return self.ranked[0] if self.ranked else None

    def find(self, **settings):
        """The best estimate whose layout has these settings: the fastest that fits, else
        the one that misses memory by the least; None if no layout has them."""
        for estimates in (self.ranked, self.rejected):  # both already in order
            for e in estimates:
                if all(getattr(e.layout, k) == v for k, v in settings.items()):
                    return e
        return None

    def explain(self):
        return explain(self)


def plan(model, cluster, n_gpus, global_batch, microbatches=(1, 2, 4, 8),
         interleave=(1, 2, 4), schedules=("1f1b",), **options):
    """Estimate every candidate layout; ``options`` go to ``Layout`` (e.g. recompute=).
    ``schedules``: the pipeline schedules considered, e.g. ("1f1b", "zb-h1", "zbv") (a
    ``schedule=`` option fixes one)."""
    check_plan_size(n_gpus, global_batch)
    schedules = (options.pop("schedule"),) if "schedule" in options else schedules
    layouts = candidate_layouts(model, n_gpus, global_batch, microbatches, interleave,
                                schedules, **options)
    if not layouts:
        raise ValueError(f"global_batch={global_batch} admits no layout on n_gpus={n_gpus}: "
                         f"use a multiple of {n_gpus}")
    return rank(model, cluster, n_gpus, global_batch, layouts)


def check_choices(name: str, values, what: str, example: tuple) -> tuple[int, ...]:
    """``values`` as a tuple of ints, or a ValueError naming ``name`` unless it is a
    non-empty collection of positive whole numbers."""
    try:
        values = tuple(values)
        checked = tuple(positive_int(name, value) for value in values)
        if not checked:
            raise ValueError
    except (TypeError, ValueError):
        raise ValueError(f"{name}={values!r}: give one or more positive whole numbers "
                         f"({what}), e.g. {name}={example}") from None
    return checked


def check_plan_size(n_gpus, global_batch):
    """Raise ValueError, naming it, if a GPU count or batch is not one a plan can take."""
    for name, value in (("n_gpus", n_gpus), ("global_batch", global_batch)):
        positive_int(name, value)
    if n_gpus > MAX_PLAN_GPUS:
        raise ValueError(f"n_gpus={n_gpus} is more than the planner enumerates; plan at most "
                         f"{MAX_PLAN_GPUS} GPUs, or estimate() one layout")


def rank(model, cluster, n_gpus, global_batch, layouts):
    """Estimate every layout: a ``Plan`` of those that fit (fastest first, each timed) and
    those that do not (smallest shortfall first: their memory alone, ``time`` empty)."""
    sized = [memory_estimate(model, lay, cluster) for lay in layouts]
    ranked = sorted((timed(e) for e in sized if e.fits), key=lambda e: e.step_time_s)
    rejected = sorted((e for e in sized if not e.fits),
                      key=lambda e: e.memory.total - e.memory_capacity_bytes)
    return Plan(model, cluster, n_gpus, global_batch, ranked, rejected)


def separating_terms(a, b):
    """[(term, seconds)]: each part of the step (compute, tp_comm, bubble, ...) of estimate
    ``a`` less that of ``b``, largest difference first; what separates two layouts."""
    terms = set(a.time) | set(b.time)
    return sorted(((k, a.time.get(k, 0.0) - b.time.get(k, 0.0)) for k in terms),
                  key=lambda kv: -abs(kv[1]))


def name_separating_term(a, b):
    """'bubble +0.27 s': the term that separates estimate ``a`` from ``b`` the most."""
    term, seconds = separating_terms(a, b)[0]
    return f"{term} {seconds:+.2f} s"


def _outcome(e, best=None):
    if e is None:
        return "is not a valid layout"
    if e.fits:
        return (f"runs at {e.tflops_per_gpu:.0f} TFLOP/s per GPU ({e.step_time_s:.1f} s per "
                f"step" + (f"; most of the difference: {name_separating_term(e, best)}"
                           if best is not None and e.time else "") + ")")
    return (f"needs {e.memory.total / GB:,.0f} GB per GPU, "
            f"{(e.memory.total - e.memory_capacity_bytes) / GB:,.0f} GB over the "
            f"{e.memory_capacity_bytes / GB:.0f} GB usable")


def explain(plan):
    """Why the best layout wins, in a few sentences with the numbers."""
    model, cluster, gpu = plan.model, plan.cluster, plan.cluster.gpu
    state = BYTES_PER_PARAM * model.params()
    lines = [f"{model.describe()} on {plan.n_gpus} x {gpu.name} "
             f"({cluster.gpus_per_node} per server), global batch {plan.global_batch}."]
    pure = plan.find(t=1, p=1)
    lines.append(
        f"Pure data parallelism (t=1, p=1, d={plan.n_gpus}) puts the whole model on every "
        f"GPU: {model.params() / 1e9:,.1f} B parameters x {BYTES_PER_PARAM} bytes = "
        f"{state / 1e12:,.2f} TB of weights, gradients and Adam state, against "
        f"{gpu.memory_bytes / 2**30:.0f} GiB of HBM ({state / gpu.memory_bytes:,.0f}x too much)"
        + (f"; with activations it {_outcome(pure)}." if pure and not pure.fits else
           f"; it {_outcome(pure)}." if pure else "."))
    best = plan.best
    if best is None:
        closest = plan.rejected[0]
        lines.append(f"No layout fits. The closest, {closest.layout.describe()}, "
                     f"{_outcome(closest)}: add GPUs, use ZeRO (zero_stage=1..3), selective "
                     f"or full recompute, or a smaller micro-batch.")
        return "\n".join(lines)
    lay, mem = best.layout, best.memory
    schedule = f" ({lay.schedule.upper()} schedule)" if lay.schedule != "1f1b" else ""
    peak_share = best.tflops_per_gpu * 1e12 / cluster.gpu.peak_flops
    lines.append(f"Best: {lay.describe()}{schedule}: {best.tflops_per_gpu:.0f} TFLOP/s per GPU "
                 f"counting the recomputation ({peak_share:.0%} of peak; {best.mfu:.0%} MFU, "
                 f"which counts only the model's own FLOPs), {best.step_time_s:.1f} s per step, "
                 f"{mem.total / GB:.1f} GB per GPU ({mem.model_state / GB:.1f} model state + "
                 f"{mem.activations / GB:.1f} activations, assuming {lay.recompute} recompute"
                 f"{' and sequence parallelism' if lay.sequence_parallel else ''}).")
    link = "inside one server, over NVLink" if lay.t <= cluster.gpus_per_node else \
        "across servers, over the network"
    wider, narrower = plan.find(t=lay.t * 2), plan.find(t=lay.t // 2) if lay.t > 1 else None
    # a group spanning two servers, where the job has two (one server: NVLink alone)
    across = "" if plan.n_gpus <= cluster.gpus_per_node else (
        f" vs {cluster.group_link(plan.n_gpus, 2 * cluster.gpus_per_node, 1)[0] / GB:.0f} "
        f"GB/s for a group spanning two servers")
    lines.append(f"Why t={lay.t}: the tensor-parallel all-reduces (several per layer per "
                 f"micro-batch) stay {link} "
                 f"({cluster.nvlink_bytes_per_s / GB:.0f} GB/s per GPU{across}). "
                 + (f"The best with t={lay.t * 2} {_outcome(wider, best)}. " if wider else "")
                 + (f"The best with t={lay.t // 2} {_outcome(narrower, best)}." if narrower
                    else ""))
    shallower = plan.find(t=lay.t, p=lay.p // 2) if lay.p > 1 else None
    lines.append(f"Why p={lay.p}: {model.L} layers in {lay.p} stages of "
                 f"{-(-model.L // lay.p)}; the pipeline costs a bubble of "
                 f"{best.bubble_fraction:.1%} of the step"
                 + (f". With p={lay.p // 2} the best layout {_outcome(shallower, best)}."
                    if shallower else "."))
    lines.append(f"Why d={lay.d}: the remaining GPUs hold replicas of the {lay.t * lay.p}-GPU "
                 f"model; their gradient all-reduce takes {best.time['dp_comm']:.2f} s per step.")
    others = len(plan.ranked) - 1
    lines.append(f"{others} other layouts fit (next: "
                 f"{plan.ranked[1].layout.describe() if others else 'none'}); "
                 f"{len(plan.rejected)} do not fit in memory.")
    return "\n".join(lines)


def tp_sweep(model, cluster, n_gpus, global_batch, b=1, d=1, **options):
    """[(t, p, Estimate or None)] for every t dividing n_gpus/d, with p = n_gpus/(t*d).

    None where the layout is invalid for the model (t must divide a and h, p <= L).
    """
    rows = []
    for t in divisors(n_gpus // d):
        p = n_gpus // (t * d)
        try:
            lay = Layout(t=t, p=p, d=d, b=b, global_batch=global_batch, **options)
            rows.append((t, p, estimate(model, lay, cluster)))
        except ValueError:
            rows.append((t, p, None))
    return rows
