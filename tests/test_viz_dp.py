"""Notebook 02's busiest-link plot counts bytes per direction, as the theory does."""
import matplotlib

matplotlib.use("Agg")

from lessonlib import costmodel as cm  # noqa: E402
from lessonlib.data_parallel.bench import AlgorithmRun, BenchRun  # noqa: E402
from lessonlib.viz import dp  # noqa: E402

S = 1024


def _ranks(n):
    """Ledger totals as allreduce_bench reports them, from the theory, for n ranks."""
    ring = int(cm.ring_allreduce_bytes_per_rank(n, S))
    server = (n - 1) * S
    def run(sent, received):
        return AlgorithmRun(times=[], max_error=0.0, bytes_sent=sent, bytes_received=received)

    return [BenchRun(rank=r, info={}, sizes={S: {
                "ring": run(ring, ring),
                "parameter_server": run(server if r == 0 else S, server if r == 0 else S)}})
            for r in range(n)]


def test_busiest_link_is_one_direction_and_the_ratio_is_n_over_2():
    for n in (2, 4, 8):
        ratio = dp.busiest_link(_ranks(n), S, "parameter_server") / dp.busiest_link(
            _ranks(n), S, "ring")
        assert ratio == n / 2


def test_plot_busiest_link_draws_ledger_points_on_the_theory():
    fig = dp.plot_busiest_link({2: _ranks(2), 4: _ranks(4)}, S)
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    server = lines["parameter server: ledger"]
    assert list(server.get_xdata()) == [2, 4]
    assert list(server.get_ydata()) == [S / dp.MiB, 3 * S / dp.MiB]
    theory = lines["parameter server: theory"]
    assert theory.get_ydata()[list(theory.get_xdata()).index(4)] == 3 * S / dp.MiB
