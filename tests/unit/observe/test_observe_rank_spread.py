"""The report plot of 3,000 ranks stays readable: the per-rank panel becomes one spread per site (three sites:
three labelled groups, not 3,000 bars), and the whole plot is drawn in seconds."""

from __future__ import annotations

import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from geotrain.observe.rank_spread import rank_spread  # noqa: E402
from geotrain.observe.report import plot_run, time_split  # noqa: E402

SITES = ("oregon", "virginia", "tokyo")


def many_rank_steps(ranks: int) -> list[dict]:
    steps = []
    for rank in range(ranks):
        for step in range(2):
            wait = 0.9 if rank == 7 else 0.1 + 0.001 * (rank % 10)  # one rank waits far longer than its site
            steps.append({"kind": "step", "step": step, "rank": rank, "stage": 0, "replica": rank,
                          "site": SITES[rank % 3], "t_wall": 100.0 + step, "loss": 3.0 - 0.1 * step,
                          "step_s": 0.6 + wait, "compute_s": 0.5, "comm_s": 0.1, "wait_s": wait, "bytes_intra": None,
                          "bytes_inter": None, "emulated_start_s": None, "emulated_end_s": None})
    return steps


def test_the_rank_panel_of_3000_ranks_is_one_labelled_spread_per_site():
    rows = time_split(many_rank_steps(3000))["ranks"]
    fig, ax = plt.subplots()
    labels = rank_spread(ax, rows, "wall s", {"compute_s": "blue", "comm_s": "orange", "wait_s": "red"})
    assert labels == ["oregon\n1000 ranks", "virginia\n1000 ranks", "tokyo\n1000 ranks"]
    assert [t.get_text() for t in ax.get_xticklabels()] == labels
    fliers = [line for line in ax.lines if line.get_marker() not in ("None", "", None) and len(line.get_ydata())]
    assert any(0.89 < y < 0.91 for line in fliers for y in line.get_ydata())  # rank 7's wait is an outlier
    plt.close(fig)


def test_a_3000_rank_plot_is_drawn_in_seconds(tmp_path):
    started = time.perf_counter()
    plot_run(many_rank_steps(3000), [], tmp_path / "big.png", title="3000 ranks")  # > MAX_RANK_BARS
    assert time.perf_counter() - started < 60 and (tmp_path / "big.png").stat().st_size > 10_000
