"""`geotrain train --elastic`: replica groups on torchft survive a killed group, which the launcher
restarts and which recovers from its live peer; bad input ends in one line, in bounded time, with
nothing left running. One launch per sync mode, shared by several assertions: per step with 1-bit Adam (its
exchange on the quorum, its state recovered from the peer: geotrain.sync.elastic_onebit; per-step AdamW with a killed
group: test_runtime_elastic_partition.py) and DiLoCo with AdamW."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from paths import ROOT
from proctree import alive, comm, descendants

pytest.importorskip("torchft")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")]
SRC = str(ROOT / "src")
CLUSTER = str(ROOT / "tests" / "data" / "wan-2x2.yaml")
TINY = ["--model", "tiny-2layer", "--seq-len", "16", "--batch-size", "2", "--microbatches", "1", "--time-scale", "0", "--heartbeat-timeout",
        "1.5", "--eval-windows", "4"]
KILL_GROUP_1 = "kill-site:every=100s,first=1s,site=1,count=1"
STEPS = {"per-step": 320, "diloco": 150}
COMM_TIMEOUT_S = 30


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}


def _plan(tmp: Path, replicas: int = 2) -> str:
    path = tmp / f"plan-{replicas}.json"
    path.write_text(json.dumps({"stages": 1, "replicas": replicas, "assignment": [list(range(replicas))]}))
    return str(path)


def _train(tmp: Path, *flags: str, timeout_s: float = 150) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "geotrain", "train", "--cluster", CLUSTER, "--plan", _plan(tmp),
                           "--elastic", *TINY, *flags], capture_output=True, text=True, timeout=timeout_s, env=_env(),
                          cwd=tmp)


def _train_into_slow_pipe(tmp: Path, *flags: str, timeout_s: float = 240) -> tuple[int, bytes, str]:
    """`_train` with stdout a pipe whose open file description is non-blocking (as a child sharing it may
    leave it), read 4 KiB at a time with a pause after each, so that the 64 KiB pipe fills and a write(2) returns
    short; PYTHONUNBUFFERED, under which Python's text layer drops what a short write left (CPython gh-85393): with
    cli/output.py's write_whole replaced by a plain write, 65,536 bytes arrive and the launcher exits 0 (no other
    load needed). (exit, stdout, stderr)."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    try:
        with (tmp / "stderr.txt").open("w") as err:
            launcher = subprocess.Popen([sys.executable, "-m", "geotrain", "train", "--cluster", CLUSTER, "--plan",
                                         _plan(tmp), "--elastic", *TINY, *flags], stdout=write_end, stderr=err,
                                        env={**_env(), "PYTHONUNBUFFERED": "1"}, cwd=tmp)
        os.close(write_end)
        chunks = []
        while chunk := os.read(read_end, 4096):
            chunks.append(chunk)
            time.sleep(0.002)
        code = launcher.wait(timeout=timeout_s)
    finally:
        os.close(read_end)
    return code, b"".join(chunks), (tmp / "stderr.txt").read_text()


@pytest.fixture(scope="module", params=["per-step", "diloco"])
def killed_run(request, tmp_path_factory):
    """A 2-group run whose group 1 is SIGKILLed once, 1 s into training (JSON summary, sync flags). A kill
    that landed while the groups still met (between a quorum and its process group's rendezvous) left the survivor
    waiting out --comm-timeout (120.0 s with the default, in 2 of ~10 loaded CI runs): the dead list of
    runtime/elastic/peers.py ends that wait; COMM_TIMEOUT_S, far above the 1.5 s heartbeat timeout, bounds its stall.
    The per-step run (1-bit Adam, 2 warm-up steps: the kill lands after its variance froze) trains 320 steps (a JSON
    over 200 KB) into a slow non-blocking pipe."""
    sync = [] if request.param == "per-step" else ["--sync-every", "3"]
    optimizer = ["--optimizer", "onebit-adam", "--onebit-warmup-steps", "2"] if request.param == "per-step" else []
    tmp = tmp_path_factory.mktemp(request.param)
    flags = ("--chaos", KILL_GROUP_1, "--json", "--comm-timeout", str(COMM_TIMEOUT_S), *sync, *optimizer)
    if sync:
        done = _train(tmp, "--steps", str(STEPS["diloco"]), *flags)
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout), sync
    code, out, err = _train_into_slow_pipe(tmp, "--steps", str(STEPS["per-step"]), *flags)
    assert code == 0 and len(out) > 200_000, (code, len(out), err[-2000:])
    return json.loads(out), sync  # whole: it parses


@pytest.mark.timeout(300)
def test_a_killed_group_is_restarted_and_the_run_never_restarts_globally(killed_run):
    run, sync = killed_run
    summary, steps = run["summary"], STEPS["diloco" if sync else "per-step"]
    assert summary["steps"] == steps and len(run["losses"]) == steps
    assert summary["replica_failures"] == 1 and summary["kills"] == 1 and summary["restarts"] == [0, 1]
    # the killed group rejoins; on a loaded host a live group whose commit failed (a late collective) heals from its
    # peer too, which torchft counts as one more rejoin without a failure (seen once at three pytest workers: 2)
    assert summary["rejoins"] >= 1 and summary["global_restarts"] == 0
    assert summary["groups_finished"] == [0, 1]
    assert len(summary["recovery_s"]) == 1 and 0 < summary["recovery_s"][0] < 60
    # the survivor never waits for the dead group past a heartbeat timeout plus a quorum, wherever the kill landed
    # (in the quorum before its rendezvous, it waited out --comm-timeout: runtime/elastic/peers.py)
    assert summary["stall_s"] < COMM_TIMEOUT_S
    assert summary["max_param_diff_across_replicas"] == 0.0 and summary["replicas_in_sync"] is True


@pytest.mark.timeout(300)
def test_elastic_json_has_the_layout_of_every_train_json(killed_run):
    from geotrain.cli.train_cmd import SUMMARY_JSON_KEYS, TRAIN_JSON_KEYS

    run, _ = killed_run
    assert set(TRAIN_JSON_KEYS) <= set(run) and set(SUMMARY_JSON_KEYS) <= set(run["summary"])
    assert run["elastic"] is True and run["plan"] == "plan-2" and run["assignment"] == [[0, 1]]
    assert "replica_failures" not in run and "group_records" not in run["summary"]  # facts in the summary only
    (validation,) = run["validation"]
    assert validation == {"step": run["summary"]["steps"], "loss": run["summary"]["val_loss"]}
    assert run["summary"]["final_loss"] == run["losses"][-1] and run["config"]["plan"] == "plan-2"


@pytest.mark.timeout(300)
def test_the_rejoined_group_equals_its_peer_bit_for_bit_from_its_first_sync(killed_run):
    run, sync = killed_run
    survivor, rejoined = run["group_records"]["0"], run["group_records"]["1"]
    first = rejoined[0]["step"]
    assert 0 < first < STEPS["diloco" if sync else "per-step"]
    digest = {r["step"]: r["params_sha256"] for r in survivor if r["synced"]}
    synced = [r for r in rejoined if r["synced"]]
    assert synced and all(r["params_sha256"] == digest[r["step"]] for r in synced)
    # per step it contributes its own gradient; with DiLoCo its first outer gradient (a repeat of its
    # peer's) has weight 0, so that sync averaged the survivor's alone
    assert synced[0]["contributors"] == (1.0 if sync else 2.0)


@pytest.mark.timeout(300)
def test_data_position_each_group_trains_its_slice_of_every_step_once_and_the_rejoiner_continues(killed_run):
    run, sync = killed_run
    from geotrain.runtime.training_data import load_training_data

    data, steps = load_training_data(None, 0, 0.1), STEPS["diloco" if sync else "per-step"]
    survivor, rejoined = run["group_records"]["0"], run["group_records"]["1"]
    assert [r["step"] for r in survivor] == list(range(steps))
    first = rejoined[0]["step"]
    assert [r["step"] for r in rejoined] == list(range(first, steps))  # no step repeated, none skipped
    if not sync:  # per step: it rejoins at the step the survivor was running
        assert first in [r["step"] for r in survivor]
    for group, records in ((0, survivor), (1, rejoined)):
        for record in records[::17]:
            x, _ = data.batch(0, record["step"], group, 2, 2, 16)
            assert record["batch_sum"] == int(x.sum())


@pytest.mark.timeout(120)
def test_an_unreachable_lighthouse_is_one_line_in_bounded_time(tmp_path):
    started = time.monotonic()
    done = _train(tmp_path, "--steps", "5", "--lighthouse", "127.0.0.1:9", "--comm-timeout", "3")
    print(f"unreachable lighthouse: {time.monotonic() - started:.1f} s")
    assert done.returncode == 2 and time.monotonic() - started < 90
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr and "127.0.0.1:9" in lines[0], done.stderr


@pytest.mark.timeout(120)
def test_a_quorum_that_never_forms_is_one_line_and_leaves_nothing_running(tmp_path):
    """Group 1 is killed and not restarted (--max-restarts 0); group 0 needs 2 groups: no quorum."""
    launcher = subprocess.Popen([sys.executable, "-m", "geotrain", "train", "--cluster", CLUSTER, "--plan",
                                 _plan(tmp_path), "--elastic", *TINY, "--steps", "100000", "--min-replicas", "2",
                                 "--max-restarts", "0", "--comm-timeout", "4", "--chaos", KILL_GROUP_1],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_env(), cwd=tmp_path)
    seen: set[int] = set()
    deadline = time.monotonic() + 90
    while launcher.poll() is None and time.monotonic() < deadline:
        seen |= descendants(launcher.pid)
        time.sleep(0.2)
    _, err = launcher.communicate(timeout=30)
    print(f"no quorum: {time.monotonic() - deadline + 90:.1f} s")
    assert launcher.returncode == 2, err
    *events, error = err.strip().splitlines()
    assert error.startswith("geotrain: error: ") and "no quorum of >= 2 replica groups" in error, err
    # the failure as it happened, naming the group and its site, then the one error line
    assert len(events) == 2 and re.fullmatch(r"geotrain: replica group 1 \(east\) killed by --chaos at \d+\.\d s",
                                             events[0]), err  # at about 1 s of the run (first=1s)
    assert events[1] == "geotrain: replica group 1 (east) failed (killed by SIGKILL): down for good after 0 restarts", err
    deadline = time.monotonic() + 10  # the fork server and the guardian end when they see the launcher gone
    while [pid for pid in seen if alive(pid)] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert seen and not [comm(pid) for pid in seen if alive(pid)]


@pytest.mark.timeout(120)
def test_a_sigkilled_launcher_leaves_no_lighthouse_and_no_group(tmp_path):
    launcher = subprocess.Popen([sys.executable, "-m", "geotrain", "train", "--cluster", CLUSTER, "--plan",
                                 _plan(tmp_path), "--elastic", *TINY, "--steps", "100000"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env(), cwd=tmp_path,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        wanted = {"geotrain-lighth", "geotrain-g0", "geotrain-g1", "geotrain-spare"}  # comm: 15 characters at most
        while not wanted <= {comm(pid) for pid in descendants(launcher.pid)}:
            assert launcher.poll() is None and time.monotonic() < deadline, "lighthouse and groups never appeared"
            time.sleep(0.2)
        family = descendants(launcher.pid)
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait()
        deadline = time.monotonic() + 20
        while [pid for pid in family if alive(pid)] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [comm(pid) for pid in family if alive(pid)]
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
