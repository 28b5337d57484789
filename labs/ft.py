"""When things go wrong at scale: a hang found, a straggler named, a replica lost and
recovered, DiLoCo against data parallelism.

One lab, four runs (``--what``), each the lesson's (notebook 17) at settings an instructor
picks, each writing the labs' one record:

- ``hangs``: each planted hang (``--plant``: a skipped collective, collectives in another
  order, a size that differs) run on ``--world-size`` CPU ranks until ``--timeout``; the
  launcher dumps every rank's flight record and ``hang_analysis.analyze`` names the stuck
  collective, its group and the ranks that never came (``lessonlib.faults.hangs``);
- ``straggler``: a data-parallel step on every rank, ``--slow-rank``'s device
  ``--slowdown`` times slower (1: an even run); each rank's compute and wait per step and
  the ranks NVIDIA's relative performance score names (``lessonlib.faults.stragglers``),
  beside the cost model's price of the straggler (``costmodel.resilience.straggler_step``);
- ``replica``: ``--world-size`` torchft replica groups of one rank each through a Lighthouse
  on 127.0.0.1; replica ``--kill`` is killed (SIGKILL) after update ``--kill-at``, the
  others go on, it is restarted and recovers live from a peer; every replica's weights
  against one process replaying the same membership (``lessonlib.faults.replicas``);
- ``diloco``: the course's (Streaming) DiLoCo, torchft's ``DiLoCo`` and data parallelism on
  ``--world-size`` replicas of the tiny GPT, float64: the course's against torchft's, bytes
  sent per token (the ledger's) against DDP's, and the held-out loss after the same tokens
  (``lessonlib.faults.diloco_runs``).

The ranks are CPU ranks over gloo (``straggler`` takes ``--backend``: its ranks may compute
on GPUs). torchft is imported only by ``replica`` and ``diloco``. The record's ``rows``: one
per hang, per rank, per replica, or per method.

Laptop:  python labs/ft.py --what hangs --json results/ft-hangs.json
         python labs/ft.py --what straggler --world-size 4 --slow-rank 2
         python labs/ft.py --what replica --world-size 3 --kill 2 --kill-at 2
         python labs/ft.py --what diloco --sync-every 4 --fragments 2
GPU box: python labs/ft.py --what straggler --world-size 8 --backend nccl
"""
import sys

import lessonlib
from lessonlib.costmodel.resilience import straggler_step
from lessonlib.faults import hangs, stragglers
from lessonlib.lab import labargs, labkit

WHAT = ("hangs", "straggler", "replica", "diloco")
# each run's own defaults (the lesson's): ranks, seconds before its ranks are stopped (for
# hangs: how long a hang is waited for before the dumps are read), steps
DEFAULTS = {"hangs": {"world_size": hangs.WORLD, "timeout": 3.0, "steps": 3},
            "straggler": {"world_size": 4, "timeout": 60.0, "steps": 6},
            "replica": {"world_size": 3, "timeout": 90.0, "steps": 6},
            "diloco": {"world_size": 2, "timeout": 90.0, "steps": 8}}
CPU_ONLY = "its ranks are CPU ranks over gloo; only --what straggler takes --backend nccl"


# ---------------------------------------------------------------- hangs
def run_hangs(args) -> tuple[dict, list[dict], dict]:
    plants = hangs.PLANTS if args.plant == "all" else (args.plant,)
    found = {}
    for plant in plants:
        d = hangs.diagnose(plant, timeout=args.timeout, world=args.world_size)
        f = d.finding
        found[plant] = {"hung": f is not None, "finding": str(f) if f else None,
                        "kind": f and f.kind, "op": f and f.op, "group": f and f.group,
                        "seq": f and f.seq, "posted": f and list(f.posted),
                        "missing": f and list(f.missing),
                        "last_steps": {str(r): s for r, s in d.last_steps.items()}}
        print(f"{plant}: {f or 'finished: no hang'}", file=sys.stderr, flush=True)
    rows = [{"plant": plant, "hung": x["hung"], "kind": x["kind"], "op": x["op"],
             "group": x["group"], "missing": x["missing"]} for plant, x in found.items()]
    return {"lessonlib": {"hangs": found}}, rows, labkit.headline("hung", x="plant", series=[])


# ---------------------------------------------------------------- straggler
def straggler_worker(settings: dict) -> dict:
    times = stragglers.rank_steps(settings["steps"], settings["slow_rank"],
                                  settings["slowdown"], settings["device_s"])
    return {**labkit.rank_info(), "compute": times.compute, "wait": times.wait}


def run_straggler(args, settings: dict) -> tuple[dict, list[dict], dict, dict]:
    ranks = labkit.on_ranks(straggler_worker, args, settings)
    found = stragglers.detect([stragglers.StepTimes(r, tuple(x["compute"]), tuple(x["wait"]))
                               for r, x in enumerate(ranks)])
    print(found, file=sys.stderr, flush=True)
    healthy = [t for r, t in found.compute.items() if r != settings["slow_rank"]]
    price = straggler_step(labkit.median(healthy), min(found.wait.values()), settings["slowdown"])
    results = {"lessonlib": {"named": list(found.named), "threshold": found.threshold,
                             "named_exactly_the_slowed": list(found.named) ==
                             ([settings["slow_rank"]] if settings["slowdown"] > 1 else []),
                             "measured_step_s": max(found.compute[r] + found.wait[r]
                                                    for r in found.compute),
                             "predicted_step_s": price.slowed_s,
                             "predicted_throughput_lost": price.throughput_lost}}
    rows = [{"rank": r, "slowed": r == settings["slow_rank"] and settings["slowdown"] > 1,
             "compute_s": found.compute[r], "wait_s": found.wait[r], "score": found.scores[r],
             "named": r in found.named} for r in sorted(found.scores)]
    return results, rows, labkit.headline("score", x="rank", series=[]), ranks[0]


# ---------------------------------------------------------------- replica (torchft)
def _max_diff(state: dict, reference: dict) -> float:
    return max(float((state[k] - reference[k]).abs().max()) for k in reference)


def run_replica(args, settings: dict) -> tuple[dict, list[dict], dict]:
    from lessonlib.faults import replicas       # torchft itself only inside its ranks

    run = replicas.run(args.world_size, args.steps, settings["kill"], args.kill_at, args.timeout)
    reference = replicas.replay(run)
    rows = [{"replica": r, "killed": r == run.killed,
             "first_life": run.first_life[r].splitlines()[0],
             "first_update": res.lived[0].step, "last_update": res.lived[-1].step,
             "participants": [s.participants for s in res.lived],
             "max_weight_diff_vs_replay": _max_diff(res.state, reference),
             "listening_off_loopback": sorted({p for ip, p in res.listening
                                               if ip != "127.0.0.1"})}
            for r, res in run.results.items()]
    results = {"lessonlib": {"lighthouse": list(run.lighthouse), "killed": run.killed,
                             "max_weight_diff_vs_replay":
                                 max(r["max_weight_diff_vs_replay"] for r in rows)}}
    return results, rows, labkit.headline("max_weight_diff_vs_replay", x="replica", series=[])


# ---------------------------------------------------------------- diloco (torchft)
def run_diloco(args) -> tuple[dict, list[dict], dict]:
    from lessonlib.faults import diloco_runs    # torchft itself only inside its ranks

    n, steps, H, F = args.world_size, args.steps, args.sync_every, args.fragments
    runs = {"ddp": diloco_runs.ddp(n, steps),
            "lessonlib_diloco": diloco_runs.diloco(n, steps, H, F),
            "torchft_diloco": diloco_runs.torchft_diloco(n, steps, H, F, timeout=args.timeout)}
    ddp_per_token = runs["ddp"][0].bytes_sent / runs["ddp"][0].tokens
    rows = []
    for name, trained in runs.items():
        per_token = (trained[0].bytes_sent / trained[0].tokens   # torchft's: not in our ledger
                     if name != "torchft_diloco" else None)
        rows.append({"method": name, "sync_every": 1 if name == "ddp" else H,
                     "fragments": 1 if name == "ddp" else F, "steps": steps,
                     "tokens_per_replica": trained[0].tokens, "bytes_per_token": per_token,
                     "bytes_per_token_over_ddp": per_token and per_token / ddp_per_token,
                     "held_out_loss": diloco_runs.held_out_loss(trained[0].state),
                     "last_train_loss": trained[0].losses[-1]})
    ours, theirs = runs["lessonlib_diloco"], runs["torchft_diloco"]
    results = {"lessonlib": {"max_weight_diff_vs_torchft": max(
        _max_diff(a.state, b.state) for a, b in zip(ours, theirs))}}
    return results, rows, labkit.headline("held_out_loss", x="method", series=[])


# ---------------------------------------------------------------- the command line
def check_settings(p, args) -> dict:
    """One line per bad setting, before any process starts."""
    if lessonlib.launcher.under_torchrun():
        p.error("labs/ft.py starts its own ranks and replicas: run it with python, not torchrun")
    labargs.check_positive(p, args, "steps")
    if args.what != "straggler" and args.backend == "nccl":
        p.error(f"--backend nccl: --what {args.what} runs on gloo ({CPU_ONLY})")
    if args.what != "straggler" and args.dtype != "fp32":
        p.error(f"--dtype {args.dtype}: --what {args.what} computes in "
                f"{'float64' if args.what in ('replica', 'diloco') else 'fp32'}; give --dtype fp32")
    least = {"hangs": 2, "straggler": 2, "replica": 3, "diloco": 2}[args.what]
    if args.world_size < least:
        why = {"replica": "two must survive a loss"}.get(args.what, "one rank cannot disagree "
                                                         "with another")
        p.error(f"--world-size {args.world_size}: --what {args.what} needs at least {least} "
                f"ranks ({why}); e.g. {DEFAULTS[args.what]['world_size']}")
    settings = {"what": args.what, "steps": args.steps, "timeout": args.timeout}
    if args.what == "hangs" and args.steps != DEFAULTS["hangs"]["steps"]:
        p.error(f"--steps {args.steps}: the planted hangs run 3 steps (the hang in the "
                f"last); leave --steps out")
    if args.what == "hangs":
        return settings | {"plant": args.plant}
    if args.what == "straggler":
        slow = args.world_size - 1 if args.slow_rank is None else args.slow_rank
        if not 0 <= slow < args.world_size:
            p.error(f"--slow-rank {slow} is not a rank of --world-size {args.world_size}; "
                    f"give 0..{args.world_size - 1}")
        if not 1 <= args.slowdown < float("inf"):
            p.error(f"--slowdown must be a finite number >= 1 (1: an even run), e.g. 3; "
                    f"got {args.slowdown}")
        labargs.check_number(p, args, "device-s", example="0.05")
        return settings | {"slow_rank": slow, "slowdown": args.slowdown,
                           "device_s": args.device_s}
    if args.what == "replica":
        kill = args.world_size - 1 if args.kill is None else args.kill
        if not 0 <= kill < args.world_size:
            p.error(f"--kill {kill} is not a replica of --world-size {args.world_size}; "
                    f"give 0..{args.world_size - 1}")
        if not 0 < args.kill_at < args.steps:
            p.error(f"--kill-at {args.kill_at} must be between 1 and --steps {args.steps} - 1 "
                    f"(the replica dies mid-run), e.g. 2")
        return settings | {"kill": kill, "kill_at": args.kill_at}
    labargs.check_positive(p, args, "sync-every", "fragments")
    if args.sync_every % args.fragments:
        p.error(f"--sync-every {args.sync_every} must be a multiple of --fragments "
                f"{args.fragments} (each fragment syncs every H/F steps), e.g. "
                f"{args.fragments * 2}")
    if args.steps % args.sync_every:
        p.error(f"--steps {args.steps} must be a multiple of --sync-every {args.sync_every} "
                f"(so every run ends on a sync and the bytes compare), e.g. "
                f"{args.sync_every * 2}")
    return settings | {"sync_every": args.sync_every, "fragments": args.fragments}


def parser():
    p = labargs.parser("ft", __doc__.splitlines()[0])
    p.add_argument("--what", default="hangs", choices=WHAT,
                   help="which run; its defaults: " + "; ".join(
                       f"{w}: --world-size {d['world_size']} --timeout {d['timeout']:g} "
                       f"--steps {d['steps']}" for w, d in DEFAULTS.items()))
    p.add_argument("--plant", default="all", choices=("all", *hangs.PLANTS),
                   help="hangs: which planted hang (all: each in turn)")
    p.add_argument("--slow-rank", type=int, default=None,
                   help="straggler: the slowed rank (default: the last)")
    p.add_argument("--slowdown", type=float, default=3.0,
                   help="straggler: how many times slower its device is (1: an even run)")
    p.add_argument("--device-s", type=float, default=0.05,
                   help="straggler: seconds each step holds, as a GPU's kernels would")
    p.add_argument("--kill", type=int, default=None,
                   help="replica: the replica killed (default: the last)")
    p.add_argument("--kill-at", type=int, default=2,
                   help="replica: killed once this update is committed")
    p.add_argument("--sync-every", type=int, default=4, help="diloco: H, inner steps per sync")
    p.add_argument("--fragments", type=int, default=1,
                   help="diloco: F, Streaming DiLoCo's fragments (1: DiLoCo)")
    return p


def main(argv=None):
    p = parser()
    what = p.parse_known_args(argv)[0].what
    p.set_defaults(**DEFAULTS[what])              # the run's own defaults; flags override
    args = labkit.parse(p, argv)
    settings = check_settings(p, args) | {"dtype": args.dtype}
    info = {"backend": "gloo", "device": "cpu"}
    if what == "hangs":
        results, rows, head = run_hangs(args)
    elif what == "straggler":
        results, rows, head, info = run_straggler(args, settings)
    elif what == "replica":
        results, rows, head = run_replica(args, settings)
    else:
        results, rows, head = run_diloco(args)
    record = labkit.result("ft", args.world_size, settings, results, info,
                           labkit.stable_rows(rows), head)
    record["settings"]["command"] = " ".join(["python", "labs/ft.py", *sys.argv[1:]])
    return labkit.emit(record, args.json)


if __name__ == "__main__":
    main()
