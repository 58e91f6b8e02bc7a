"""Watching real runs: `geotrain emulate --trace` against its own report, and `geotrain train --run-dir`
(plain and --sync-every) read back as metrics, trace, TensorBoard scalars and `geotrain report`.

The `geotrain emulate`, `train` and `report` command lines run in the module fixture `runs`: in one folder, one after
another in one process (tests/one_interpreter.py: its later launches skip the seconds of imports and fork server
start-up; two processes side by side took 48 s on one core against one process's 34 s), the elastic run first (its
fork server preloads torchft), the failing run last."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from one_interpreter import OneInterpreter
from paths import ROOT
from runtime_2x2 import write_job_files

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src")}

TWO_SITES = """\
name: two-sites
regions:
  - {name: lisbon, devices: 2, intra: {gbps: 10, ms: 0.1}}
  - {name: tokyo, devices: 2, intra: {gbps: 10, ms: 0.1}}
links:
  - {between: [lisbon, tokyo], gbps: 0.1, ms: 60}
"""
SCRIPT = """\
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
x = torch.ones(20000)
for step in range(3):
    dist.all_reduce(x)
    if rank == 0:
        dist.send(torch.ones(5000), 1)
    elif rank == 1:
        dist.recv(torch.empty(5000), 0)
    dist.barrier()
dist.destroy_process_group()
"""


def test_emulate_trace_of_a_two_site_run_matches_its_report_transfer_for_transfer(runs):
    tmp_path = runs[0]
    ran(runs, "emulate")
    report = json.loads((tmp_path / "r.json").read_text())
    trace = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    transfers = [e for e in trace if e.get("cat") == "transfer"]
    collectives = [e for e in trace if e.get("cat") == "collective"]
    assert len(report["transfers"]) > 20  # three all-reduces over 4 ranks, three sends, barriers
    assert len(transfers) == len(report["transfers"]) and len(collectives) == len(report["ops"])
    key = lambda t: (t["op"], t["seq"], t["src_rank"], t["dst_rank"], t["start_s"])  # noqa: E731
    by_key = {key(e["args"]): e for e in transfers}
    assert len(by_key) == len(transfers)
    for t in report["transfers"]:  # each entry: one event, on its sender's track, at its emulated times
        event = by_key[key(t)]
        assert event["args"] == t and event["pid"] == t["src_rank"] and event["ph"] == "X"
        assert event["ts"] == pytest.approx(t["start_s"] * 1e6)
        assert event["dur"] == pytest.approx((t["end_s"] - t["start_s"]) * 1e6)
    between = [t for t in report["transfers"] if (t["src_device"] < 2) != (t["dst_device"] < 2)]
    assert between and sum(t["nbytes"] for t in between) == report["summary"]["inter_region_bytes"]
    assert sorted(e["args"]["start_s"] for e in collectives) == sorted(o["start_s"] for o in report["ops"])
    names = {e["pid"]: e["args"]["name"] for e in trace if e["name"] == "process_name"}
    assert names[1] == "rank 1 (tokyo-0)"


def checkpoint_args() -> list[str]:
    """The checkpoint test's two runs: 4 steps of the 2x2 plan, a checkpoint after every step."""
    return ["train", "--cluster", "cluster.yaml", "--plan", "plan.json", "--steps", "4", "--time-scale", "0",
            "--checkpoint-dir", "ckpt", "--checkpoint-every", "1", "--keep-checkpoints", "4", "--json"]


FAILING_MODEL = '''
import os
import torch
from torch import nn

calls = [0]


class Mixer(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(32, 32)

    def forward(self, x):
        calls[0] += 1
        if os.environ.get("RANK") == "1" and calls[0] == 8:
            raise RuntimeError("injected fault in the user's layer")
        return x + self.lin(x)


def build():
    return [nn.Embedding(256, 32), Mixer(), nn.Linear(32, 256)]
'''
# --sync-every 2 over 4 steps, blocking and streamed: the outer-sync test's runs by id
SYNC_FLAGS = {"blocking": (), "streaming-delay": ("--fragments", "2", "--sync-delay", "1")}


def _commands(root: Path) -> dict[str, list[str]]:
    """The command lines by name, in order (relative paths are under `root`)."""
    files = write_job_files(root)
    plan = ["--cluster", files["cluster"], "--plan", files["plan"]]
    (root / "fail.py").write_text(FAILING_MODEL)
    (root / "dp2-manual.json").write_text(json.dumps({"method": "manual", "stages": 1, "replicas": 2,
                                                      "assignment": [[0, 2]]}))
    (root / "dp2.json").write_text(json.dumps({"stages": 1, "replicas": 2, "assignment": [[0, 2]]}))
    (root / "p.json").write_text(json.dumps({"stages": 1, "replicas": 2, "assignment": [[0, 2]]}))  # east, west
    (root / "c.yaml").write_text(TWO_SITES)
    (root / "s.py").write_text(SCRIPT)
    elastic = {
        "elastic": ["train", "--cluster", str(ROOT / "tests" / "data" / "wan-2x2.yaml"), "--plan", "p.json",
                    "--elastic", "--model", "tiny-2layer", "--seq-len", "16", "--batch-size", "2",
                    "--microbatches", "1", "--time-scale", "0.01", "--heartbeat-timeout", "3", "--eval-windows", "4",
                    "--steps", "150", "--chaos", "kill-site:every=100s,first=1s,site=1,count=1", "--comm-timeout",
                    "30", "--run-dir", "elastic-run", "--json"],
        "elastic-report": ["report", "elastic-run", "--json"]} if importlib.util.find_spec("torchft") else {}
    return {
        **elastic,
        "emulate": ["emulate", "--cluster", "c.yaml", "--devices", "0,2,1,3", "--time-scale", "0", "--report", "r.json",
                    "--trace", "t.json", "--", "s.py"],
        "run-dir": ["train", *plan, "--steps", "3", "--time-scale", "0.1", "--run-dir", str(root / "run"), "--json"],
        "run-dir-report": ["report", str(root / "run"), "--json", "--plot", "p.png"],
        **{name: ["train", *plan, "--steps", "4", "--time-scale", "0.1", "--sync-every", "2", *flags, "--run-dir",
                  f"{name}-run", "--json"] for name, flags in SYNC_FLAGS.items()},
        "stopped": [*checkpoint_args(), "--stop-after", "2"],  # in the default run directory
        "resumed": [*checkpoint_args(), "--resume", "--run-dir", "second"],
        "adaptive": ["train", "--cluster", files["cluster"], "--plan", "dp2.json", "--steps", "4", "--time-scale",
                     "0.1", "--microbatches", "1", "--sync-every", "2", "--local-steps", "adaptive", "--checkpoint-dir",
                     "adaptive-ckpt", "--run-dir", "adaptive-run", "--json"],
        "failing": ["train", "--cluster", files["cluster"], "--plan", "dp2-manual.json", "--steps", "30", "--model",
                    "fail.py:build", "--microbatches", "1", "--time-scale", "0.1", "--heartbeat-timeout", "3",
                    "--run-dir", "failing-run"]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, dict[str, subprocess.CompletedProcess]]:
    """(the folder, each command line's outcome by name). Beside the stopped run's default run directory, three
    finished default runs made on three days of 2000 (marker unlocked), with GEOTRAIN_KEEP_RUNS=2."""
    root = tmp_path_factory.mktemp("runs")
    for i in range(3):
        old = root / "geotrain-runs" / f"2000010{i}-000000-old"
        old.mkdir(parents=True)
        (old / "run.json").write_text("{}")
        (old / ".geotrain-default-run").write_text("")
        os.utime(old / ".geotrain-default-run", (946684800 + i * 86400,) * 2)
    commands = _commands(root)
    process = OneInterpreter(list(commands.values()), root, "runs", {**ENV, "GEOTRAIN_KEEP_RUNS": "2"}, cwd=root)
    return root, dict(zip(commands, process.results(), strict=True))


def ran(runs: tuple[Path, dict[str, subprocess.CompletedProcess]], name: str) -> subprocess.CompletedProcess:
    """The command line `name` of `runs`, which exited 0."""
    done = runs[1][name]
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def read_lines(run_dir: Path) -> list[dict]:
    return [json.loads(line) for path in sorted((run_dir / "metrics").glob("rank-*.jsonl"))
            for line in path.read_text().splitlines()]


def test_train_run_dir_holds_every_rank_step_a_trace_tensorboard_and_a_report(runs):
    tmp_path = runs[0]
    run_dir = tmp_path / "run"
    done = ran(runs, "run-dir")
    assert json.loads(done.stdout)["run_dir"] == str(run_dir)
    assert f"run directory {run_dir}" in done.stderr
    lines = read_lines(run_dir)
    steps = [r for r in lines if r["kind"] == "step"]
    assert sorted((r["rank"], r["step"]) for r in steps) == [(r, s) for r in range(4) for s in range(3)]
    for r in steps:
        assert r["compute_s"] > 0 and r["comm_s"] > 0 and r["wait_s"] >= 0
        assert r["compute_s"] + r["comm_s"] + r["wait_s"] == pytest.approx(r["step_s"])
        assert r["bytes_inter"] >= r["bytes_dp"] > 0  # every DP group of the plan spans east and west
        assert r["site"] == ("east" if r["device"] < 2 else "west")
    last = [r for r in steps if r["stage"] == 1]
    assert all(r["loss"] is not None for r in last) and all(r["loss"] is None for r in steps if r["stage"] == 0)
    assert Counter(r["event"] for r in lines if r["kind"] == "event") == {"start": 4, "end": 4}
    ends = [r for r in lines if r.get("event") == "end"]
    for end in ends:  # each rank's own cost: seconds in the observer and the metrics bytes of its 3 steps
        assert end["steps"] == 3 and 0 < end["observer_s"] < 1.0
        mine = (run_dir / "metrics" / f"rank-{end['rank']}.jsonl").read_text().splitlines(keepends=True)
        assert end["bytes_written"] == sum(len(line.encode()) for line in mine[:-1])  # all but the end line

    trace = json.loads((run_dir / "trace.json").read_text())["traceEvents"]
    parts = [json.loads(p.read_text()) for p in (run_dir / "emulator").glob("rank-*.json")]
    assert Counter(e.get("cat") for e in trace if e["ph"] != "M") == {
        "step": 12, "transfer": sum(len(p["transfers"]) for p in parts),
        "collective": sum(len(p["ops"]) for p in parts)}

    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = EventAccumulator(str(run_dir / "tensorboard"))
    board.Reload()
    assert [s.step for s in board.Scalars("rank3/loss")] == [0, 1, 2]
    assert [s.value for s in board.Scalars("rank2/wait_s")] == pytest.approx(
        [r["wait_s"] for r in sorted(steps, key=lambda r: r["step"]) if r["rank"] == 2])
    assert len(board.Scalars("site/west/comm_s")) == 3

    report = json.loads(ran(runs, "run-dir-report").stdout)
    assert [s["site"] for s in report["split"]["sites"]] == ["east", "west"]
    assert report["split"]["steps_used"] == [1, 2] and (tmp_path / "p.png").stat().st_size > 10_000
    cost = report["observer_cost"]
    assert cost["ranks"] == 4 and cost["bytes_per_step"] == pytest.approx(
        sum(e["bytes_written"] for e in ends) / 12) and 0 < cost["overhead_pct"] < 100


def sync_events(lines: list[dict]) -> tuple[set, set]:
    """(rank, fragment, step) of every outer_sync start, and (rank, fragment, started, landed step) of every landing."""
    syncs = [r for r in lines if r.get("event") == "outer_sync"]
    return ({(e["rank"], e["fragment"], e["step"]) for e in syncs if e["phase"] == "start"},
            {(e["rank"], e["fragment"], e["started"], e["step"]) for e in syncs if e["phase"] == "land"})


@pytest.mark.parametrize("name, landings", [
    ("blocking", {(0, 1, 1), (0, 3, 3)}),  # blocking DiLoCo: each sync lands after the step it started after
    # Streaming, 2 fragments, delay 1: fragment 1 (offset 1) starts after steps 0 and 2, lands a step later (the
    # last step lands everything, then syncs every fragment at once, blocking); fragment 0 after step 1 and 3
    ("streaming-delay", {(1, 0, 1), (0, 1, 2), (1, 2, 3), (0, 3, 3), (1, 3, 3)}),
], ids=list(SYNC_FLAGS))
def test_outer_syncs_are_events_from_start_to_landing_and_spans_in_the_trace(runs, name, landings):
    ran(runs, name)
    run_dir = runs[0] / f"{name}-run"
    lines = read_lines(run_dir)
    starts, lands = sync_events(lines)
    assert lands == {(rank, *landing) for rank in range(4) for landing in landings}
    assert starts == {(rank, fragment, started) for rank, fragment, started, _ in lands}
    steps = {(r["rank"], r["step"]): r for r in lines if r["kind"] == "step"}
    handed: dict = {}
    for e in (r for r in lines if r.get("event") == "outer_sync" and r["phase"] == "land"):
        handed[(e["rank"], e["step"])] = handed.get((e["rank"], e["step"]), 0) + e["bytes"]
        assert e["bytes"] > 0 and e["emulated_s"] <= steps[(e["rank"], e["step"])]["emulated_end_s"]
    # the landings' bytes are the DP bytes of the steps they land in (a posted sync's counted at its landing)
    assert handed == {key: r["bytes_dp"] for key, r in steps.items() if r["bytes_dp"] > 0}
    trace = json.loads((run_dir / "trace.json").read_text())["traceEvents"]
    spans = [e for e in trace if e.get("cat") == "sync"]
    assert sorted((e["pid"], e["args"]["fragment"], e["args"]["started"], e["args"]["landed"]) for e in spans) == \
        sorted(lands)
    for e in spans:  # from its start (before the exchange) to its landing, on the emulated clock
        assert e["ph"] == "X" and e["dur"] > 0
        landed_step = steps[(e["pid"], e["args"]["landed"])]
        if e["args"]["landed"] > e["args"]["started"]:  # in flight from one step into the next
            assert e["ts"] / 1e6 < landed_step["emulated_start_s"] < (e["ts"] + e["dur"]) / 1e6
        else:
            assert landed_step["emulated_start_s"] <= e["ts"] / 1e6
    assert not [e for e in trace if e.get("cat") == "event" and e["name"] == "outer_sync"]


def test_default_run_dir_is_printed_and_old_ones_are_swept(runs):
    tmp_path, done = runs[0], ran(runs, "stopped")
    root = tmp_path / "geotrain-runs"
    run_dir = Path(json.loads(done.stdout)["run_dir"])
    assert run_dir.parent.name == "geotrain-runs" and run_dir.name.endswith("-manual")
    assert "removed 2 old run directories" in done.stderr
    assert sorted(p.name for p in root.iterdir()) == ["20000102-000000-old", run_dir.name]
    steps = [r for r in read_lines(tmp_path / run_dir) if r["kind"] == "step"]  # 2 steps x 4 ranks, no emulation
    assert len(steps) == 8 and all(r["bytes_inter"] is None and r["emulated_end_s"] is None for r in steps)


def test_a_failing_rank_flushes_its_steps_and_a_failure_event(runs):
    """A rank whose model raises mid-run: its lines up to the failure are on disk, the failure named."""
    done, run_dir = runs[1]["failing"], runs[0] / "failing-run"
    assert done.returncode != 0 and "failed at step" in done.stderr  # (torch's stage error hides our text)
    lines = [json.loads(line) for line in (run_dir / "metrics" / "rank-1.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in lines if r["kind"] == "step"]
    failure = [r for r in lines if r.get("event") == "failure"]
    assert steps == list(range(len(steps))) and len(steps) >= 1
    assert len(failure) == 1 and failure[0]["step"] == len(steps)  # the step it was in (0-based)
    assert "rank 1" in failure[0]["reason"] and "RuntimeError" in failure[0]["reason"]
    # the failing rank's emulator records reach the trace, which the launcher writes although the run failed
    sent = json.loads((run_dir / "emulator" / "rank-1.json").read_text())["transfers"]
    trace = json.loads((run_dir / "trace.json").read_text())["traceEvents"]
    assert sent and len([e for e in trace if e.get("cat") == "transfer" and e["pid"] == 1]) == len(sent)
    assert [e["args"]["step"] for e in trace if e.get("cat") == "event" and e["pid"] == 1] == [len(steps)]


def test_checkpoint_and_resume_events_name_their_steps(runs):
    """A run stopped after 2 of 4 steps (checkpoint every step; `runs`'s "stopped", in the default run directory),
    then resumed into a second run directory."""
    tmp_path, done = runs[0], ran(runs, "stopped")
    ran(runs, "resumed")
    first_dir = tmp_path / json.loads(done.stdout)["run_dir"]
    first, second = read_lines(first_dir), read_lines(tmp_path / "second")
    assert sorted((r["rank"], r["step"]) for r in first if r.get("event") == "checkpoint") == [
        (rank, step) for rank in range(4) for step in (1, 2)]  # completed steps, as the checkpoint names them
    assert sorted((r["rank"], r["step"]) for r in second if r.get("event") == "resume") == [(r, 2) for r in range(4)]
    assert sorted({r["step"] for r in second if r["kind"] == "step"}) == [2, 3]
    for e in (r for r in first + second if r.get("event") == "checkpoint"):  # the shard, its size, the save's time
        assert e["path"] == f"ckpt/step-{e['step']:06d}/rank-{e['rank']:04d}.pt"  # under --checkpoint-dir as given
        assert e["bytes"] == (tmp_path / e["path"]).stat().st_size > 1000 and 0 < e["seconds"] < 30


def test_adaptive_local_steps_record_each_sync_and_the_final_checkpoint(runs):
    """--local-steps adaptive: a rank's syncs fall where its own H_r ends; each starts and lands after one step."""
    tmp_path = runs[0]
    ran(runs, "adaptive")
    lines = read_lines(tmp_path / "adaptive-run")
    starts, lands = sync_events(lines)
    assert {(rank, fragment, step) for rank, fragment, step, _ in lands} == starts
    assert all(started == landed for _, _, started, landed in lands)
    for rank in range(2):  # ceil(4 / 2) periods, every rank's last sync after its last step
        mine = sorted(landed for r, _, _, landed in lands if r == rank)
        assert len(mine) == 2 and mine[-1] == max(r["step"] for r in lines if r["kind"] == "step" and r["rank"] == rank)
    checkpoints = [r for r in lines if r.get("event") == "checkpoint"]
    assert sorted((e["rank"], e["step"]) for e in checkpoints) == [(rank, 4) for rank in range(2)]
    assert all(e["bytes"] == (tmp_path / e["path"]).stat().st_size for e in checkpoints)


def test_elastic_run_writes_each_groups_steps_and_a_killed_groups_restart_and_rejoin(runs):
    pytest.importorskip("torchft")
    tmp_path, done = runs[0], ran(runs, "elastic")
    result = json.loads(done.stdout)
    assert result["run_dir"] == "elastic-run"
    assert result["summary"]["replica_failures"] == 1 and result["summary"]["rejoins"] == 1
    lines = read_lines(tmp_path / "elastic-run")
    steps = [r for r in lines if r["kind"] == "step"]
    assert sorted({r["step"] for r in steps if r["rank"] == 0}) == list(range(150))  # the survivor: every step
    assert all(r["loss"] is not None and r["step_s"] > 0 for r in steps)
    for r in steps:  # wall seconds: compute, the exchange's all-reduce and commit, the rest (quorums) waiting
        assert r["compute_s"] > 0 and r["comm_s"] > 0 and r["wait_s"] >= 0
        assert r["compute_s"] + r["comm_s"] + r["wait_s"] == pytest.approx(r["step_s"], abs=1e-9) or (
            r["wait_s"] == 0 and r["compute_s"] + r["comm_s"] >= r["step_s"])
        # the groups sit in two regions: what a group sends goes between them (the emulated links' records)
        assert r["bytes_dp"] > 0 and r["bytes_inter"] > 0 and r["bytes_intra"] == 0
    events = [(r["rank"], r["event"]) for r in lines if r["kind"] == "event"]
    assert events.count((1, "start")) == 1 and events.count((1, "restart")) == 1  # start flushed before the kill
    failure = next(r for r in lines if r.get("event") == "failure")  # written by the launcher for the killed group
    assert failure["rank"] == 1 and failure["exit"] == "killed by SIGKILL" and failure["restart"] == 1
    rejoin = next(r for r in lines if r.get("event") == "rejoin")
    assert rejoin["rank"] == 1 and rejoin["seconds"] > 0
    assert min(r["step"] for r in steps if r["rank"] == 1 and r["t_wall"] > rejoin["t_wall"]) == rejoin["step"]
    # the step it was in: the launcher's count of its committed steps (killed about 1 s in), before its rejoin's
    assert 0 < failure["step"] <= rejoin["step"] and failure["t_wall"] < rejoin["t_wall"]
    trace = json.loads((tmp_path / "elastic-run" / "trace.json").read_text())["traceEvents"]
    assert sorted((e["pid"], e["name"]) for e in trace if e.get("cat") == "event") == [
        (1, "failure"), (1, "rejoin"), (1, "restart")]
    report = json.loads(ran(runs, "elastic-report").stdout)
    assert report["events"] == {"failure": 1, "restart": 1, "rejoin": 1}
    assert [s["site"] for s in report["split"]["sites"]] == ["east", "west"]
