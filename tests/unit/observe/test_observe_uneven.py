"""What the metrics lines and `geotrain report` say about uneven runs (adaptive local steps, asynchronous outer
updates), without processes: the lr the worker set, the run's progress, an asynchronous exchange counted as comm,
no site named as holding the others back where nobody waits for a peer, and the loss panel's lines in time order
from the loop's start."""

from __future__ import annotations

import pytest

from geotrain.cluster import load_cluster
from geotrain.models import lr_at
from geotrain.observe.metrics import read_metrics, step_metrics
from geotrain.observe.observer import RunObserver
from geotrain.observe.report import holding_back, loss_lines, loop_origin, time_split
from geotrain.observe.tensorboard import site_means
from geotrain.runtime import RuntimeConfig


def worker_record(step=0, exchange=0.0, span=(1.0, 2.0), **extra):
    return {"step": step, "rank": 0, "stage": 0, "replica": 0, "loss": 3.0, "compute_s": 0.2, "iteration_s": 0.9,
            "dp_s": 0.0, "dp_emulated_s": 0.0, "dp_bytes": 640, "pp_bytes": 0, "grad_norm": None, "val_loss": None,
            "lr": 2e-4, "progress_step": 5, "exchange_s": exchange,
            "emulated": None if span is None else {"start_s": span[0], "end_s": span[1], "bytes": 0.0,
                                                   "inter_region_bytes": 0.0, "inter_region_wire": []}, **extra}


@pytest.mark.parametrize("span", [(1.0, 2.0), None], ids=["emulated", "wall"])
def test_an_asynchronous_exchange_is_comm_not_wait(span):
    line = step_metrics(worker_record(exchange=0.5, span=span, global_updates=3), site="a", device=0, lr=2e-4,
                        tokens=8, time_scale=1e-3, t_wall=10.0)
    assert line["comm_s"] == pytest.approx(0.5)
    assert line["wait_s"] == pytest.approx(line["step_s"] - 0.2 - 0.5)
    assert (line["progress_step"], line["global_updates"]) == (5, 3)


def test_the_observer_writes_the_lr_the_worker_set_not_one_recomputed_from_the_ranks_step(tmp_path):
    config = RuntimeConfig.of(load_cluster("seed-datacenter"), [[0, 1]], steps=16, run_dir=str(tmp_path))
    observer = RunObserver(config, 1, None, tmp_path)
    # an adaptive A100 rank at its own step 27 stands at step 15 of the run: the worker set lr_at(15)
    observer.step(worker_record(step=27, lr=lr_at(15, 16, 3e-3), progress_step=15))
    observer.close()
    line = next(r for r in read_metrics(tmp_path) if r["kind"] == "step")
    assert line["lr"] == pytest.approx(lr_at(15, 16, 3e-3)) and line["progress_step"] == 15
    assert line["global_updates"] is None


def uneven_lines(asynchronous: bool) -> list[dict]:
    """Replica 0 (site a, fast) takes 4 steps of 1 s from 50 s (start-up before it), replica 1 (site b) 2 steps of
    2 s; replica 1 waits nowhere, replica 0 for 40% of its steps (a blocking sync) unless asynchronous."""
    lines = []
    for replica, site, n, span in ((0, "a", 4, 1.0), (1, "b", 2, 2.0)):
        for step in range(n):
            start = 50.0 + span * step
            lines.append({"kind": "step", "step": step, "rank": replica, "stage": 0, "replica": replica,
                          "site": site, "t_wall": 1000.0 + start, "loss": 3.0 - step - replica, "val_loss": None,
                          "step_s": span, "compute_s": span * (1.0 if replica else 0.6), "comm_s": 0.0,
                          "wait_s": 0.0 if replica or asynchronous else span * 0.4, "bytes_intra": 0.0,
                          "bytes_inter": 0.0, "emulated_start_s": start, "emulated_end_s": start + span,
                          "progress_step": step, "global_updates": step if asynchronous else None})
    return lines


def test_no_site_holds_the_others_back_where_nobody_waits_for_a_peer():
    assert time_split(uneven_lines(asynchronous=True))["asynchronous"]
    assert holding_back(time_split(uneven_lines(asynchronous=True))) is None
    # the same shares, synchronous: site a waits on b
    assert holding_back(time_split(uneven_lines(asynchronous=False)))["site"] == "b"


def test_the_loss_panel_has_one_line_per_replica_in_time_order_from_the_loops_start():
    lines = uneven_lines(asynchronous=True)
    lines[-1] = {**lines[-1], "val_loss": 2.5}
    assert loop_origin(lines)[0] == 50.0
    panel = loss_lines(list(reversed(lines)))
    assert panel["lines"] == {"replica 0 (a)": [(1.0, 3.0), (2.0, 2.0), (3.0, 1.0), (4.0, 0.0)],
                              "replica 1 (b)": [(2.0, 2.0), (4.0, 1.0)]}
    assert panel["validation"] == [(4.0, 2.5)]
    # averaged by step index (the old panel), step 1 would sit at 4.0 s (replica 1's) and step 2 at 3.0 s



def test_the_loss_panel_draws_one_validation_point_per_evaluation_where_the_last_rank_joined_it():
    """Every rank of an evaluation records its all-reduced loss (the same float) on a step that ends at its own
    time: one point, at the latest; the old panel drew one point per rank (4 ranks x 4 evaluations: 16 dots)."""
    lines = uneven_lines(asynchronous=False)  # replica 0: steps end at 51..54 s; replica 1: at 52 and 54 s
    lines[1] = {**lines[1], "val_loss": 2.75, "emulated_end_s": 51.5}  # the fast rank is there first
    lines[4] = {**lines[4], "val_loss": 2.75}  # the slow rank joins at 52 s
    lines[3] = {**lines[3], "val_loss": 2.5}
    lines[5] = {**lines[5], "val_loss": 2.5}  # the end's evaluation: both at 54 s
    lines[2] = {**lines[2], "val_loss": 2.625}  # a replica's own evaluation (--eval-local): a point of its own
    assert loss_lines(lines)["validation"] == [(2.0, 2.75), (3.0, 2.625), (4.0, 2.5)]


def test_the_split_says_when_its_steps_are_the_ranks_own_counts():
    """An adaptive run of 2 steps where the fast rank took 4: its steps 1..3 are not the run's."""
    lines = uneven_lines(asynchronous=False)
    assert not time_split(lines)["uneven"]  # every step at its own progress: lock-step
    for line in lines[:4]:
        line["progress_step"] = line["step"] // 2  # the fast replica: 2 of its steps per step of the run
    split = time_split(lines)
    assert split["uneven"] and split["steps_used"] == [1, 3]


def test_a_sites_tensorboard_means_are_by_the_runs_progress_not_the_ranks_step_index():
    """One site of an A100 (2 steps per step of the run) and a T4 (one step per 2), as in a compact
    `gpu: [A100, T4]` region: the T4's step 1 is the run's step 2, beside the A100's steps 4 and 5."""
    lines = []
    for rank, steps, per_progress in ((0, 6, 0.5), (1, 2, 2.0)):
        for step in range(steps):
            progress = int(step * per_progress)
            lines.append({"step": step, "rank": rank, "site": "a", "progress_step": progress,
                          "lr": lr_at(progress, 4, 3e-3), "loss": None})
    means = site_means(lines)
    assert sorted(means) == [("a", 0), ("a", 1), ("a", 2)]
    assert means[("a", 2)]["lr"] == pytest.approx(lr_at(2, 4, 3e-3))  # every rank's lr there is the run's step 2
    # by step index, step 1 would average the A100's run step 0 with the T4's run step 2
    assert means[("a", 1)]["lr"] == pytest.approx(lr_at(1, 4, 3e-3))


def test_rewriting_the_tensorboard_files_replaces_them(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from geotrain.observe.tensorboard import write_scalars

    lines = [{**line, "rank": line["replica"], "lr": 1e-3, "grad_norm": None, "t_wall": 1000.0 + i}
             for i, line in enumerate(uneven_lines(asynchronous=False))]
    write_scalars(tmp_path, lines)
    folder = write_scalars(tmp_path, lines)  # `geotrain report --tensorboard` on a finished run
    assert len(list(folder.glob("events.out.tfevents.*"))) == 1
    events = EventAccumulator(str(folder))
    events.Reload()
    assert [s.step for s in events.Scalars("rank0/loss")] == [0, 1, 2, 3]  # once each, not twice
