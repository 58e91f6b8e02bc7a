"""geotrain.observe without processes: the metrics lines, their time split, run-directory retention, the
Chrome trace's layout, the report's aggregation and TensorBoard files read back with TensorBoard's reader."""

from __future__ import annotations

import json

import pytest

from geotrain.observe.metrics import MetricsWriter, metrics_path, read_metrics, step_metrics
from geotrain.observe.report import holding_back, observer_cost, time_split
from geotrain.observe.rundir import RunDirError, check_run_dir, prepare_run_dir
from geotrain.observe.trace import build_trace


def worker_record(step=0, rank=0, compute=0.2, dp=0.5, span=(1.0, 2.0), inter=300.0, total=1000.0):
    return {"step": step, "rank": rank, "stage": 0, "replica": rank, "loss": 3.0, "compute_s": compute,
            "iteration_s": 0.9, "dp_s": dp, "dp_emulated_s": dp, "dp_bytes": 640, "pp_bytes": 0, "grad_norm": 1.5,
            "val_loss": None,
            "emulated": None if span is None else {"start_s": span[0], "end_s": span[1], "bytes": total,
                                                   "inter_region_bytes": inter, "inter_region_wire": []}}


def test_step_split_under_emulation_is_emulated_span_less_compute_and_scaled_collective_time():
    line = step_metrics(worker_record(compute=0.2, dp=0.25, span=(1.0, 2.0)), site="a", device=3, lr=0.1,
                        tokens=64, time_scale=0.5, t_wall=10.0)
    # the transport's DP seconds are emulated x time scale: 0.25 / 0.5 = 0.5 emulated s
    assert line["step_s"] == pytest.approx(1.0)
    assert line["comm_s"] == pytest.approx(0.5)
    assert line["wait_s"] == pytest.approx(1.0 - 0.2 - 0.5)
    assert (line["bytes_intra"], line["bytes_inter"]) == (700.0, 300.0)
    assert line["site"] == "a" and line["device"] == 3 and line["tokens"] == 64


def test_an_overlapped_sync_exposes_only_the_step_time_compute_did_not_cover():
    # a sync posted steps ago lands here: its collective spans 0.9 emulated s, the step 1.0 s with 0.8 s compute
    line = step_metrics(worker_record(compute=0.8, dp=0.9, span=(1.0, 2.0)), site="a", device=0, lr=0.1,
                        tokens=8, time_scale=1.0, t_wall=10.0)
    assert line["comm_s"] == pytest.approx(0.2) and line["wait_s"] == 0.0
    assert line["compute_s"] + line["comm_s"] + line["wait_s"] == pytest.approx(line["step_s"])


def test_step_split_without_emulation_uses_wall_seconds_and_leaves_link_classes_unknown():
    line = step_metrics(worker_record(compute=0.3, dp=0.4, span=None), site="a", device=0, lr=0.1, tokens=8,
                        time_scale=0.0, t_wall=10.0)
    assert line["step_s"] == pytest.approx(0.9)
    assert line["wait_s"] == pytest.approx(0.9 - 0.3 - 0.4)
    assert line["bytes_intra"] is None and line["bytes_inter"] is None and line["bytes_dp"] == 640


def test_a_nan_loss_is_written_as_null_and_the_line_stays_strict_json(tmp_path):
    record = {**worker_record(), "loss": float("nan")}
    writer = MetricsWriter(metrics_path(tmp_path, 0))
    writer.write(step_metrics(record, site="a", device=0, lr=0.1, tokens=8, time_scale=1.0, t_wall=1.0))
    writer.close()
    assert read_metrics(tmp_path)[0]["loss"] is None


def test_writer_buffers_lines_until_a_flush_and_a_torn_last_line_is_skipped(tmp_path):
    now = [0.0]
    writer = MetricsWriter(metrics_path(tmp_path, 1), clock=lambda: now[0])
    event = {"kind": "event", "event": "note", "step": 0, "rank": 1, "t_wall": 1.0}
    writer.write({**event, "n": 1})
    assert read_metrics(tmp_path) == []  # buffered: nothing on disk before a flush
    now[0] = 10.0  # past FLUSH_EVERY_S: the next write flushes both
    writer.write({**event, "n": 2})
    assert [r["n"] for r in read_metrics(tmp_path)] == [1, 2]
    with metrics_path(tmp_path, 1).open("a") as handle:
        handle.write('{"kind": "event", "n": 3')  # a process killed mid-write
    assert [r["n"] for r in read_metrics(tmp_path)] == [1, 2]
    writer.close()


def test_a_run_dir_that_holds_metrics_is_refused(tmp_path):
    metrics_path(tmp_path, 0).parent.mkdir(parents=True)
    metrics_path(tmp_path, 0).write_text("{}\n")
    with pytest.raises(RunDirError, match="already holds a run's metrics"):
        prepare_run_dir(tmp_path, {})
    (tmp_path / "file").write_text("")
    with pytest.raises(RunDirError, match="is a file"):
        check_run_dir(tmp_path / "file")


def steps_of_three_sites():
    """Sites a and b compute 0.1 s and wait 0.5 s for site c, which computes 0.6 s; step 0 is set-up."""
    steps = []
    for step in range(3):
        for rank, site, compute, wait in ((0, "a", 0.1, 0.5), (1, "b", 0.1, 0.5), (2, "c", 0.6, 0.0)):
            setup = 5.0 if step == 0 else 0.0
            steps.append({"kind": "step", "step": step, "rank": rank, "stage": 0, "replica": rank, "site": site,
                          "step_s": 1.0 + setup, "compute_s": compute + setup, "comm_s": 0.4, "wait_s": wait,
                          "bytes_intra": 10.0, "bytes_inter": 100.0, "loss": 2.0, "t_wall": 100.0 + step,
                          "emulated_end_s": float(step + 1)})
    return steps


def test_time_split_means_skip_the_first_step_and_name_the_site_the_others_wait_for():
    split = time_split(steps_of_three_sites())
    assert split["steps_used"] == [1, 2]
    sites = {s["site"]: s for s in split["sites"]}
    assert sites["a"]["compute_s"] == pytest.approx(0.1) and sites["a"]["wait_pct"] == pytest.approx(50.0)
    assert sites["c"]["compute_pct"] == pytest.approx(60.0) and sites["c"]["wait_s"] == 0.0
    assert sites["c"]["bytes_inter"] == pytest.approx(200.0)  # summed over steps 1 and 2
    slow = holding_back(split)
    assert slow["site"] == "c" and slow["others_wait_pct"] == pytest.approx(50.0)


def test_no_site_is_named_when_every_site_waits_alike():
    steps = [{**s, "wait_s": 0.3, "compute_s": 0.3} for s in steps_of_three_sites()]
    assert holding_back(time_split(steps)) is None


def emulator_report():
    t = [{"op": "send", "seq": i, "src_device": 0, "dst_device": 2, "src_rank": 0, "dst_rank": 1,
          "nbytes": 100.0, "start_s": 0.1 * i, "end_s": 0.1 * i + 0.25, "wire_end_s": 0.1 * i + 0.05}
         for i in range(4)]  # pipelined: each arrives after the next has started
    ops = [{"op": "allreduce", "seq": 0, "group": "0", "ranks": [0, 1], "nbytes": 50.0, "start_s": 0.0,
            "end_s": 0.5}]
    return {"cluster": "c", "time_scale": 1.0, "transfers": t, "ops": ops,
            "ranks": [{"rank": 0, "device": 0, "clock_s": 1.0, "slept_s": 0.0}]}


def test_trace_has_one_event_per_transfer_and_op_with_no_overlap_on_a_thread():
    trace = build_trace(emulator_report())
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    transfers = [e for e in events if e["cat"] == "transfer"]
    assert [e["args"]["seq"] for e in transfers] == [0, 1, 2, 3]
    assert transfers[1]["ts"] == pytest.approx(0.1e6) and transfers[1]["dur"] == pytest.approx(0.25e6)
    assert len([e for e in events if e["cat"] == "collective"]) == 1
    by_thread = {}
    for e in events:
        by_thread.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_thread.values():
        spans.sort()
        assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))
    assert len({tid for (_, tid) in by_thread}) == 4  # 3 transfer lanes (each overlaps the next) + 1 collective
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert names == {0: "rank 0"}
    json.dumps(trace, allow_nan=False)


def test_tensorboard_reader_sees_every_rank_and_site_scalar(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from geotrain.observe.tensorboard import write_scalars

    folder = write_scalars(tmp_path, [{**s, "lr": 0.1, "grad_norm": None} for s in steps_of_three_sites()])
    events = EventAccumulator(str(folder))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"rank0/loss", "rank2/compute_s", "site/c/wait_s", "site/a/bytes_inter"} <= tags
    assert "rank0/grad_norm" not in tags  # None values are not written
    compute = events.Scalars("rank2/compute_s")
    assert [s.step for s in compute] == [0, 1, 2]
    assert [s.value for s in compute] == pytest.approx([5.6, 0.6, 0.6])
    assert [s.value for s in events.Scalars("site/a/wait_s")] == pytest.approx([0.5, 0.5, 0.5])


def test_observer_cost_is_seconds_and_bytes_per_step_per_rank_against_the_wall_gap_between_steps():
    steps = steps_of_three_sites()  # each rank's steps end 1 wall second apart
    ends = [{"kind": "event", "event": "end", "rank": r, "steps": 3, "observer_s": 0.003, "bytes_written": 1500}
            for r in range(3)]
    cost = observer_cost(steps, ends + [{"kind": "event", "event": "start", "rank": 0}])
    assert cost["observer_s_per_step"] == pytest.approx(0.001) and cost["bytes_per_step"] == pytest.approx(500)
    assert cost["step_wall_s"] == pytest.approx(1.0) and cost["overhead_pct"] == pytest.approx(0.1)
    assert observer_cost(steps, []) is None  # no rank ended normally
