"""Widgets over real runs: move a slider, the ranks run again, and the measurement is drawn
over the prediction.

What it teaches: the cost model is a claim, and a claim is checked by running. Each widget
here launches a real multi-rank run (``lessonlib.launch``) for the slider's values and draws
what it measured next to what the model predicts for the same values:

* ``allreduce_widget`` (02): the ring against the parameter server at the slider's rank
  count and size: time, and bytes through the busiest link each way, measured and predicted;
* ``assembly_line_widget`` (03): the assembly line at the slider's p: each rank's idle
  share against (p-1)/p, and its timeline;
* ``pipeline_widget`` (04): the measured Gantt chart and bubble of the slider's schedule,
  p and m, over the simulated one;
* ``layout_widget`` (05): a tiny (t, p, d) layout picked by sliders: its measured step,
  and the bytes each axis sent beside the cost model's count.

How a live widget behaves (``live_explorer``): the first run happens when the cell runs, so
a notebook executed headless (nbval, nbclient) stores one picture drawn with the defaults.
After that each slider move is measured in a background thread; a value overtaken by a newer
one before its run starts is dropped, not queued, and a result that arrives after a newer
value was asked for is not drawn. A run that fails shows its error in the widget; the
notebook goes on.

One job: the live widgets, each a measure (a record) and a drawing of it; its length is four
lessons' widgets.

Laptop:  in a notebook, ``from lessonlib.viz import live; live.pipeline_widget()``
GPU box: the same; the runs use one GPU per rank when there are enough.
"""
from __future__ import annotations

import io
import threading
from dataclasses import dataclass

import ipywidgets as w
import matplotlib.pyplot as plt
from IPython.display import Image

from lessonlib import launcher
from lessonlib import model_parallel as mp
from lessonlib.costmodel import parameter_server_bytes, ring_allreduce_bytes_per_rank
from lessonlib.costmodel.alpha_beta import predict_from_fit
from lessonlib.data_parallel import bench as dp_bench
from lessonlib.hybrid.layout_runs import run as run_layout
from lessonlib.hybrid.traffic import expected_traffic, measured_traffic
from lessonlib.models import HYBRID_CONFIG
from lessonlib.viz.pipeline import gantt

KiB = 1024


class LiveRun:
    """The latest-wins worker behind a live widget: ``request(values)`` asks for a run;
    ``measure(**values)`` runs in one background thread, one run at a time; only the newest
    request is run next (older ones waiting are dropped), and a result is shown only if no
    newer request came while it ran. ``show(result_or_error, values)`` draws it."""

    def __init__(self, measure, show):
        self.measure, self.show = measure, show
        self.lock, self.wake = threading.Lock(), threading.Event()
        self.pending, self.asked, self.runs, self.dropped = None, 0, 0, 0
        threading.Thread(target=self._loop, daemon=True, name="live-widget").start()

    def request(self, values: dict) -> None:
        with self.lock:
            if self.pending is not None:
                self.dropped += 1                      # overtaken before it started
            self.asked += 1
            self.pending = (self.asked, dict(values))
        self.wake.set()

    def run_now(self, values: dict) -> None:
        """Measure and draw in the caller's thread (the cell's first picture)."""
        self.show(self._attempt(values), values)

    def _attempt(self, values):
        self.runs += 1
        try:
            return self.measure(**values)
        except Exception as exc:                     # shown in the widget, never raised
            return exc

    def _loop(self):
        while True:
            self.wake.wait()
            with self.lock:
                self.wake.clear()
                ticket, self.pending = self.pending, None
            if ticket is None:
                continue
            number, values = ticket
            result = self._attempt(values)
            with self.lock:
                current = number == self.asked
                if not current:
                    self.dropped += 1                  # a newer value came while it ran
            if current:
                self.show(result, values)


def _error_text(exc: BaseException) -> str:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"this run failed, nothing is drawn: {type(exc).__name__}: {first}"


def live_explorer(measure, draw, **controls):
    """Controls over a real run: ``measure(**values)`` (launches ranks) and
    ``draw(result, **values) -> figure`` or ``(figure, text)``. Returns the box to display;
    its ``.live`` is the ``LiveRun`` (for tests)."""
    out, status = w.Output(), w.HTML()

    def show(result, values):
        out.outputs = ()
        if isinstance(result, BaseException):
            status.value = ""
            out.append_stdout(_error_text(result) + "\n")
            return
        made = draw(result, **values)
        fig, text = made if isinstance(made, tuple) else (made, None)
        png = io.BytesIO()
        fig.savefig(png, format="png", dpi=80, bbox_inches="tight")
        plt.close(fig)
        out.append_display_data(Image(png.getvalue()))
        if text:
            out.append_stdout(text)
        status.value = "<i>measured now, on this machine</i>"

    live = LiveRun(measure, show)

    def moved(_=None):
        status.value = "<i>running the ranks ...</i>"
        live.request({name: c.value for name, c in controls.items()})

    for name, control in controls.items():
        control.description = control.description or name
        control.observe(moved, names="value")
    live.run_now({name: c.value for name, c in controls.items()})
    box = w.VBox([w.HBox(list(controls.values()), layout=w.Layout(flex_flow="row wrap")),
                  status, out])
    box.add_class("widget-interact")
    box.add_class("live-widget")
    box.live = live
    return box


# ---------------------------------------------------------------- 02: ring against server
ALLREDUCE_ALGORITHMS = ("ring", "parameter_server")


def measure_allreduce(ranks: int, size_kib: int, budget_s: float = 0.3) -> dict:
    """Both all-reduces on ``ranks`` ranks at one size: slowest-rank median times and the
    bytes through the busiest link, one direction (rank 0 is the server)."""
    size = size_kib * KiB
    per_rank = launcher.launch(dp_bench.allreduce_bench, ranks, [size], ALLREDUCE_ALGORITHMS,
                               budget_s=budget_s, min_iters=3, max_iters=8)
    rows = [r.sizes[size] for r in per_rank]
    return {alg: {"time_s": dp_bench.slowest_rank_median([r[alg].times for r in rows]),
                  "busiest_link_bytes": max(max(r[alg].bytes_sent, r[alg].bytes_received)
                                            for r in rows)}
            for alg in ALLREDUCE_ALGORITHMS}


def draw_allreduce(result: dict, ranks: int, size_kib: int, fits: dict | None = None):
    """Bars: measured time (left) and bytes through the busiest link (right) of each
    algorithm, next to the alpha-beta prediction and the bytes the model counts."""
    size = size_kib * KiB
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.2), constrained_layout=True)
    names = ["ring", "parameter server"]
    xs = range(len(ALLREDUCE_ALGORITHMS))
    left.bar([x - 0.2 for x in xs], [1e3 * result[a]["time_s"] for a in ALLREDUCE_ALGORITHMS],
             0.4, label="measured", color="#4c72b0")
    if fits:
        left.bar([x + 0.2 for x in xs],
                 [1e3 * predict_from_fit(a, ranks, size, fits[a]) for a in ALLREDUCE_ALGORITHMS],
                 0.4, label="alpha-beta prediction", color="#bbbbbb")
    left.set_xticks(list(xs), names)
    left.set_ylabel("time per all-reduce (ms)")
    left.legend(fontsize=8)
    predicted = [ring_allreduce_bytes_per_rank(ranks, size), parameter_server_bytes(ranks, size) / 2]
    right.bar([x - 0.2 for x in xs], [result[a]["busiest_link_bytes"] / KiB ** 2
                                      for a in ALLREDUCE_ALGORITHMS], 0.4, label="measured (ledger)",
              color="#4c72b0")
    right.bar([x + 0.2 for x in xs], [b / KiB ** 2 for b in predicted], 0.4, label="predicted",
              color="#bbbbbb")
    right.set_xticks(list(xs), names)
    right.set_ylabel("MiB through the busiest link, each way")
    right.legend(fontsize=8)
    fig.suptitle(f"{ranks} ranks, {size_kib} KiB per all-reduce", fontsize=10)
    return fig


def allreduce_widget(fits: dict | None = None, ranks: int = 4, size_kib: int = 16384):
    """Live: ring vs parameter server at the sliders' rank count and size."""
    return live_explorer(measure_allreduce,
                         lambda r, ranks, size_kib: draw_allreduce(r, ranks, size_kib, fits),
                         ranks=w.IntSlider(ranks, 2, 6, description="ranks"),
                         size_kib=w.SelectionSlider(options=[16, 64, 256, 1024, 4096, 16384],
                                                    value=size_kib, description="KiB"))


# ---------------------------------------------------------------- 03: the assembly line
@dataclass
class AssemblyLineRun:
    """``measure_assembly_line``: the line's ``LineRecord`` and each stage's timeline."""
    record: mp.runs.LineRecord
    timelines: list


def measure_assembly_line(p: int) -> AssemblyLineRun:
    """The MLP assembly line on p ranks (2 timed steps)."""
    results = mp.run_assembly_line(p, p=p, model="mlp", steps=2, warmup=1, batch=8,
                                   layers=2 * p, width=128)
    return AssemblyLineRun(mp.line_record(results),
                           [r.timeline for r in sorted(results, key=lambda r: r.stage)])


def draw_assembly_line(result: AssemblyLineRun, p: int):
    record = result.record
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3), constrained_layout=True,
                                      gridspec_kw={"width_ratios": [1, 2]})
    left.bar(range(p), record.idle_per_rank, color="#4c72b0", label="measured")
    left.axhline(record.idle_predicted, color="black", ls="--",
                 label=f"predicted (p-1)/p = {record.idle_predicted:.2f}")
    left.set_xticks(range(p), [f"rank {r}" for r in range(p)])
    left.set_ylim(0, 1)
    left.set_ylabel("idle share of the step")
    left.legend(fontsize=8, loc="lower right")
    gantt([[s for s in line if s.kind in ("F", "B") or s.kind.startswith("RECV")]
           for line in result.timelines], ax=right, title=f"p = {p}: one rank works at a time")
    return fig, (f"idle share, mean over ranks: measured {record.idle_mean:.2f}, "
                 f"predicted {record.idle_predicted:.2f}\n")


def assembly_line_widget(p: int = 3):
    """Live: the assembly line's idle share at the slider's p."""
    return live_explorer(measure_assembly_line, draw_assembly_line,
                         p=w.IntSlider(p, 2, 4, description="p"))


# ---------------------------------------------------------------- 04: the pipeline
@dataclass
class PipelineRun:
    """``measure_pipeline``: the step's ``runs.ScheduleRow`` and each stage's spans."""
    row: object
    spans: list


def measure_pipeline(schedule: str, p: int, m: int) -> PipelineRun:
    """One timed step (after one warm-up) of ``schedule`` on p ranks with m micro-batches."""
    # Imported here: the pipeline room pulls in torch's pipelining and DTensor (about 2.5 s),
    # which notebooks 02, 03 and 05 and the fork servers they start need not pay for.
    from lessonlib.pipeline import schedule_runs as pipeline_runs

    # Stages heavy enough (4 layers of width 1024, 32-row micro-batches) that each action's
    # compute outweighs its fixed costs on CPU ranks, so the bubble lands near the theory.
    per_rank = launcher.launch(pipeline_runs.measure, p, ms=(m,), schedules=(schedule,),
                               engines=("lessonlib",), width=1024, layers_per_stage=4,
                               micro=32, steps=1, warmup=1)
    rows = pipeline_runs.summarize(per_rank)
    case = next(iter(per_rank[0]))
    return PipelineRun(rows[0], [r.spans for r in pipeline_runs.median_step(per_rank, case)])


def draw_pipeline(result: PipelineRun, schedule: str, p: int, m: int):
    row = result.row
    fig, ax = plt.subplots(figsize=(10, 0.9 + 0.45 * p), constrained_layout=True)
    gantt(result.spans, ax=ax, title=f"{schedule}, p = {p}, m = {m}, measured")
    return fig, (f"bubble (share of the step's wall time): measured {row.bubble_mean:.1%} "
                 f"(mean over stages), theory {row.bubble_theory_wall:.1%} "
                 f"({'(p-1)/(m+p-1)' if schedule in ('gpipe', '1f1b') else 'at T_F = T_B = T_W'})\n")


def pipeline_widget(schedule: str = "1f1b", p: int = 2, m: int = 4):
    """Live: the measured Gantt chart and bubble of the sliders' schedule, p and m."""
    return live_explorer(measure_pipeline, draw_pipeline,
                         schedule=w.Dropdown(options=["gpipe", "1f1b", "zb-h1", "zbv"],
                                             value=schedule),
                         p=w.IntSlider(p, 2, 4, description="p"),
                         m=w.IntSlider(m, 1, 8, description="m"))


# ---------------------------------------------------------------- 05: a tiny 3-D layout
LAYOUTS = ["t1p1d2", "t2p1d1", "t1p2d1", "t2p2d1", "t1p2d2", "t2p1d2", "t1p1d4", "t4p1d1"]


def measure_layout(layout: str, m: int = 2) -> dict:
    """Train the tiny GPT 3 steps on ``layout``: the median step and one step's traffic."""
    t, p, d = (int(x) for x in layout[1:].replace("p", " ").replace("d", " ").split())
    per_rank = run_layout(dp=d, pp=p, tp=t, m=m, steps=3, warmup=1, check=False, timeline=True)
    return {"step_time_s": max(r.step_time_s for r in per_rank),
            "measured": measured_traffic(per_rank[0].traffic[-1]),
            "predicted": expected_traffic(HYBRID_CONFIG, d, p, t, 8, m, 0,
                                          per_rank[0].param_count),
            "t": t, "p": p, "d": d}


def draw_layout(result: dict, layout: str, m: int = 2):
    axes = ["tp_all_reduce", "pp_send", "dp_all_reduce"]
    fig, ax = plt.subplots(figsize=(7, 3), constrained_layout=True)
    xs = range(len(axes))
    ax.bar([x - 0.2 for x in xs], [getattr(result["measured"], a).bytes / KiB for a in axes],
           0.4, label="measured (ledger, rank 0)", color="#4c72b0")
    ax.bar([x + 0.2 for x in xs], [getattr(result["predicted"], a).bytes / KiB for a in axes],
           0.4, label="predicted", color="#bbbbbb")
    ax.set_xticks(list(xs), ["TP all-reduce", "PP sends", "DP all-reduce"])
    ax.set_ylabel("KiB per step, rank 0")
    ax.set_title(f"{layout}: step {1e3 * result['step_time_s']:.0f} ms (measured)", fontsize=10)
    ax.legend(fontsize=8)
    return fig


def layout_widget(layout: str = "t2p1d2", m: int = 2):
    """Live: a tiny layout picked from the dropdown, run for real, its bytes beside the model's."""
    return live_explorer(measure_layout, draw_layout,
                         layout=w.Dropdown(options=LAYOUTS, value=layout, description="layout"),
                         m=w.IntSlider(m, 1, 4, description="m"))
