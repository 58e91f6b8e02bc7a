"""A run of an overlapped, uneven or asynchronous outer sync, stopped mid-period (--stop-after) or by Ctrl-C and
resumed from its checkpoint, ends on the uninterrupted run's parameters and losses: Streaming DiLoCo with P 2, tau 1
and int8-block (an exchange in flight at the checkpoint, settled: sync/settle.py) and adaptive local steps on an
H100 + P100 pair with a delay and eager landing (each replica checkpoints at its own share of the period:
AdaptiveOuterSync.checkpoint_position), both to the bit. Adaptive splits come from measured step times, so a period
of the resumed run shares its steps as the uninterrupted run's did only while the measured speed ratio stays on the
same side of a rounding boundary (sync/adaptive.py): with an A100 + T4 pair (4.8x apart, the 5 / 1 split flips below
3x) a loaded host moved one, and the resumed run ended up to 4.7e-4 away; 46.6x apart, the fast rank's steps must
measure 15x slow for that. The test reads each period's split from both runs' records and compares the parameters
to the bit where every split agrees (within 5e-3 otherwise: one step moved; the run moves its parameters by about
1e-2); asynchronous outer updates on a plan of 2 pipeline stages (a global model's server per stage, on replica 0's
rank of it; a checkpoint round of each stage's server, every replica pausing all its stages at once:
sync/async_outer.py; in 2 fragments, each stage's server a fragment server per fragment, each fragment pushed at its
own step of the period: sync/async_fragments.py; outer lr 1, no momentum; both asynchronous modes with --sync-moments,
the servers holding global AdamW second moments beside the model: sync/async_moments.py) to within 0.1 nats of the
final global model's validation loss (the round's pause lets the other replica run ahead, so the server applies
arrivals in another order than the run without it: measured 0.0004 nats once; with DiLoCo's Nesterov and a stale update
at full weight, the default since, a loaded CI host saw 0.028; with 2 fragments, whose pushes at their own steps make
more orders possible, three uninterrupted runs spread 0.014 and a resumed run under load ended 0.064 away); asynchronous hierarchical updates (4 replicas in 2 regions: the
rounds reach the replicas through their region's server, whose region model, momentum and unmerged updates the
checkpoint holds: sync/async_region.py) to within 0.1 nats and 0.02 in any parameter (arrival order is a race at
--time-scale 0: three uninterrupted runs differed by up to 0.020 nats and 3.5e-3, resumed vs uninterrupted by 0.012 to
0.049 nats and 3.0e-3 to 4.2e-3; the run moves its parameters by about 1e-2 after step 3).
The fixture's twelve runs (not about the launch itself) go through two processes side by side, six command lines each
(tests/one_interpreter.py: a launch's seconds of imports paid once per process); the Ctrl-C test's launches are
`geotrain` processes, and the printed resume commands run in two processes likewise."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from geotrain.runtime import checkpoint as ckpt
from one_interpreter import OneInterpreter, results_of
from runtime_2x2 import write_job_files
from two_gpus import two_gpus_yaml

pytestmark = pytest.mark.timeout(600)

GEOTRAIN = [sys.executable, "-m", "geotrain"]
ONE_BY_TWO = {"method": "manual", "stages": 1, "replicas": 2, "assignment": [[0, 1]]}
MODES = {
    "streaming": ["--time-scale", "0", "--steps", "8", "--sync-every", "4", "--fragments", "2", "--sync-delay", "1",
                  "--dp-codec", "int8-block"],
    "adaptive": ["--time-scale", "1e-3", "--emulate-gpu-speed", "--steps", "9", "--sync-every", "3",
                 "--local-steps", "adaptive", "--sync-delay", "1", "--sync-landing", "eager", "--dp-codec",
                 "int8-block"],
    "async": ["--time-scale", "0", "--steps", "8", "--sync-every", "2", "--outer-sync", "async", "--eval-every", "8",
              "--outer-lr", "1", "--outer-momentum", "0", "--sync-moments", "--fragments", "2"],
    # averaged region deltas (outer lr 1, no momentum): DiLoCo's Nesterov over 4 outer steps per replica overshoots,
    # and its loss then moved by 0.32 nats between two uninterrupted runs of different arrival orders
    "async-hierarchical": ["--time-scale", "0", "--steps", "8", "--sync-every", "2", "--outer-sync",
                           "async-hierarchical", "--eval-every", "8", "--outer-lr", "1", "--outer-momentum", "0",
                           "--sync-moments"],
}
STOP = {"streaming": 2, "adaptive": 4, "async": 3, "async-hierarchical": 3}
EXACT = ("streaming", "adaptive")
SPLIT_MOVED = 5e-3
"""The largest parameter difference allowed, resumed against uninterrupted, where a period's adaptive split differs
between the two (module doc); where every split agrees, none."""
NATS = {"async": 0.1, "async-hierarchical": 0.1}
"""The resumed asynchronous run's final validation loss within this of the uninterrupted one's (module doc)."""
"""--stop-after: streaming's fragment 1 started after step 1 and lands after step 2 (in flight at the checkpoint);
adaptive's step 4 is inside the second period (the H100 replica 1 of its 5 steps in, the P100 one 0 of 1); async's step 3
is inside a period of the equal schedule (each stage's global model holds 3 of the run's 8 replica updates);
async-hierarchical's likewise (6 of 16)."""


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, dict[str, str]]:
    root = tmp_path_factory.mktemp("job")
    streaming = write_job_files(root)
    (root / "plan12.json").write_text(json.dumps({**ONE_BY_TWO, "assignment": [[0, 2]]}))
    (root / "two.yaml").write_text(two_gpus_yaml("far-apart", 1.0, 20).replace("A100", "H100").replace("T4", "P100"))
    (root / "plan2.json").write_text(json.dumps(ONE_BY_TWO))
    (root / "plan4.json").write_text(json.dumps({**ONE_BY_TWO, "replicas": 4, "assignment": [[0, 1, 2, 3]]}))
    return {"streaming": {"cluster": streaming["cluster"], "plan": str(root / "plan12.json")},
            "async": streaming,  # 2 stages x 2 replicas
            "async-hierarchical": {"cluster": streaming["cluster"], "plan": str(root / "plan4.json")},
            "adaptive": {"cluster": str(root / "two.yaml"), "plan": str(root / "plan2.json")}}


def _words(files: dict[str, dict[str, str]], mode: str, directory: Path, *extra: str) -> list[str]:
    return ["train", "--run-dir", "none", "--cluster", files[mode]["cluster"], "--plan", files[mode]["plan"],
            *MODES[mode], "--checkpoint-dir", str(directory), *extra]


def _run_all(commands: list[list[str]], directory: Path) -> list[subprocess.CompletedProcess]:
    """Run `geotrain` commands (with --json) in two processes side by side, the even-numbered ones in order in one and
    the odd-numbered in the other (so commands i and i + 2 run one after the other); each must exit 0."""
    halves = [OneInterpreter([[*words, "--json"] for words in commands[part::2]], directory, f"part{part}")
              for part in range(2)]
    done = results_of(halves)
    ordered = [done[i % 2][i // 2] for i in range(len(commands))]
    for run in ordered:
        assert run.returncode == 0, f"{shlex.join(run.args)}:\n{run.stderr}"
    return ordered


def final_weights(directory: Path, steps: int, ranks: int = 2) -> list[dict[str, torch.Tensor]]:
    """Each rank's stage weights in the checkpoint at the run's end."""
    manifest = ckpt.read_manifest(directory, steps)
    return [ckpt.load_shard(directory, steps, rank, manifest, {"rank": rank, "stage": 0, "replica": rank})["stage"]
            for rank in range(ranks)]


def largest_difference(a: list[dict[str, torch.Tensor]], b: list[dict[str, torch.Tensor]]) -> float:
    return max(float((x[k].double() - y[k].double()).abs().max()) for x, y in zip(a, b, strict=True) for k in x)


def _assert_ends_alike(ref_dir: Path, cut_dir: Path, steps: int, ref_losses: list, resumed_losses: list) -> None:
    """The resumed run (checkpoints in `cut_dir`) ends on the uninterrupted one's weights and losses: to the bit where
    every period was split alike, within SPLIT_MOVED where a measured split moved a step (module doc)."""
    splits = [_splits(ref_dir, steps), _splits(cut_dir, steps)]
    difference = largest_difference(final_weights(ref_dir, steps), final_weights(cut_dir, steps))
    if splits[0] == splits[1]:
        assert difference == 0.0, f"every period's split agreed ({splits[0]}), yet the weights differ by {difference}"
        assert resumed_losses == ref_losses  # the records of the steps before the stop, restored
    else:
        assert difference <= SPLIT_MOVED, f"splits {splits[0]} (uninterrupted) and {splits[1]} (resumed)"
        np.testing.assert_allclose(resumed_losses, ref_losses, rtol=0, atol=0.01)


def _splits(directory: Path, steps: int, ranks: int = 2) -> list[list[int]]:
    """Per rank, the inner steps it took in each outer period, from the records in the run's final checkpoint (a
    step's period: the syncs done before it, the previous record's outer_step; none for a run of equal steps, whose
    records carry no outer_step)."""
    manifest = ckpt.read_manifest(directory, steps)
    out = []
    for rank in range(ranks):
        records = ckpt.load_shard(directory, steps, rank, manifest, {"rank": rank, "stage": 0, "replica": rank})[
            "records"]
        if "outer_step" not in records[0]:
            return []
        periods = [0] + [record["outer_step"] for record in records[:-1]]
        out.append([periods.count(period) for period in range(max(periods) + 1)])
    return out


def _validation(report: dict) -> float:
    """The final global model's validation loss (every rank scores the same model after the final exchange)."""
    losses = {entry["loss"] for entry in report["validation"]}
    assert len(losses) == 1
    return losses.pop()


def _steps(mode: str) -> int:
    return int(MODES[mode][MODES[mode].index("--steps") + 1])


@pytest.fixture(scope="module")
def runs(files, tmp_path_factory) -> dict[str, dict]:
    """Per mode: the uninterrupted run (a checkpoint at its end), and the run stopped at STOP (checkpointing every
    step) then resumed; both ends' weights and the losses."""
    root = tmp_path_factory.mktemp("runs")
    n = len(MODES)  # a mode's stopped run and its resumption are n (even) apart: the same process, in order
    done = _run_all([*(_words(files, mode, root / f"{mode}-cut", "--checkpoint-every", "1", "--stop-after",
                              str(STOP[mode])) for mode in MODES),
                     *(_words(files, mode, root / f"{mode}-cut", "--checkpoint-every", "1", "--resume")
                       for mode in MODES),
                     *(_words(files, mode, root / f"{mode}-ref") for mode in MODES)], root)
    stopped, resumed, reference = done[:n], done[n:2 * n], done[2 * n:]
    out: dict[str, dict] = {}
    for i, mode in enumerate(MODES):
        out[mode] = {"ref": json.loads(reference[i].stdout), "stopped": json.loads(stopped[i].stdout),
                     "resumed": json.loads(resumed[i].stdout), "ref_dir": root / f"{mode}-ref",
                     "cut_dir": root / f"{mode}-cut"}
    return out


@pytest.mark.parametrize("mode", EXACT)
def test_a_run_stopped_mid_period_and_resumed_ends_on_the_uninterrupted_runs_weights(runs, mode):
    run = runs[mode]
    _assert_ends_alike(run["ref_dir"], run["cut_dir"], _steps(mode), run["ref"]["losses"], run["resumed"]["losses"])
    assert run["ref"]["summary"]["replicas_in_sync"] and run["resumed"]["summary"]["replicas_in_sync"]


def test_an_asynchronous_run_stopped_and_resumed_ends_as_the_uninterrupted_one(runs):
    run = runs["async"]
    assert abs(_validation(run["resumed"]) - _validation(run["ref"])) < NATS["async"]
    assert run["resumed"]["summary"]["replicas_in_sync"]  # every rank holds the final global model
    shards = [torch.load(ckpt.shard_path(run["cut_dir"], STOP["async"], rank), weights_only=True) for rank in range(4)]
    states = [shard["dp"]["asynchronous"] for shard in shards]
    for rank, shard in enumerate(shards):  # the resumed run goes on from each rank's records at the stop
        ended = torch.load(ckpt.shard_path(run["cut_dir"], _steps("async"), rank), weights_only=True)["records"]
        steps = [(r["step"], r["loss"]) for r in shard["records"]]
        assert len(steps) >= 2 and [(r["step"], r["loss"]) for r in ended][:len(steps)] == steps
    for host, client in ((0, 1), (2, 3)):  # ranks 0 and 2 (replica 0 of stages 0 and 1) host their stage's server
        server, client = states[host], states[client]
        # the round opened at 3 of the 8 updates (fragment 0's: periods); the other rank went on until both were paused
        first, second = server["server"]["fragments"]
        assert 3 <= first["updates"] < 8 and second["updates"] >= 3 and "server" not in client
        assert server["outer_step"] + client["outer_step"] >= 3 and first["optimizer"]["arrivals"] >= 1
        assert len(server["versions"]) == 2 and server["versions"][0] == server["version"]
    assert {state["checkpointed"] for state in states} == {STOP["async"]}  # every rank paused in one round


def test_each_stages_server_ends_holding_the_model_every_client_of_that_stage_pulled(runs):
    """The 2-stage asynchronous run's end: a server per stage, on replica 0's rank of it; its global model is the
    stage's weights on every rank of that stage (the clients' final pull), bit for bit; both stages' servers hold the
    run's 8 replica updates; each push carries one fragment of its stage's parameters and their AdamW second moments
    (fp32, a 40-byte header), not the stage's; every rank's AdamW ends holding its server's global second moments (the
    final reply's)."""
    run = runs["async"]
    shards = [torch.load(ckpt.shard_path(run["ref_dir"], _steps("async"), rank), weights_only=True) for rank in range(4)]
    states = [shard["dp"]["asynchronous"] for shard in shards]
    assert ["server" in state for state in states] == [True, False, True, False]
    sizes = []
    for host, ranks in ((0, (0, 1)), (2, (2, 3))):
        fragments = [part["model"] for part in states[host]["server"]["fragments"]]  # each [parameters | v] of its own
        assert states[host]["server"]["fragments"][0]["updates"] == 8  # the budget (a replica whose other stage is
        # short sends more: discarded)
        halves = [len(f) // 2 for f in fragments]
        model = torch.cat([f[:h] for f, h in zip(fragments, halves)] + [f[h:] for f, h in zip(fragments, halves)])
        for rank in ranks:
            weights = torch.cat([w.reshape(-1) for w in shards[rank]["stage"].values()])
            n, adamw = weights.numel(), shards[rank]["dp"]["optimizer"]["state"]
            second = torch.cat([adamw[i]["exp_avg_sq"].reshape(-1) for i in range(len(adamw))])
            assert torch.equal(states[rank]["anchor"], torch.cat(fragments)) and torch.equal(weights, model[:n])
            assert torch.equal(second, model[n:]) and second.min() >= 0 and second.max() > 0
            assert states[rank]["outer_step"] == 8 and states[rank]["moments_loaded"] >= 1
        pushes = {r["dp_bytes"] for r in shards[ranks[1]]["records"][:-1]} - {0}  # the client's, before its final ones
        assert pushes == {40 + 2 * 4 * h for h in halves} and sum(halves) == n  # a fragment's [parameters | v] each
        sizes.append(n)
    assert sizes[0] != sizes[1] and min(sizes) > 0.4 * sum(sizes)  # each server holds its stage, not the model
    assert _validation(run["ref"]) < run["ref"]["losses"][0] - 0.3  # the loss falls


def test_an_asynchronous_hierarchical_run_stopped_and_resumed_ends_as_the_uninterrupted_one(runs):
    run, steps = runs["async-hierarchical"], _steps("async-hierarchical")
    assert len(run["resumed"]["losses"]) == len(run["ref"]["losses"])
    assert abs(_validation(run["resumed"]) - _validation(run["ref"])) < NATS["async-hierarchical"]
    assert largest_difference(final_weights(run["ref_dir"], steps, 4), final_weights(run["cut_dir"], steps, 4)) < 0.02
    assert run["resumed"]["summary"]["replicas_in_sync"]


def test_the_hierarchical_checkpoint_holds_every_replica_update_at_the_global_server_or_in_its_region(runs):
    """Ranks 0 and 2 lead the regions (east 0-1, west 2-3; rank 0 also hosts the global server): each update sent
    is in the global model or in its region's model, not yet merged; every replica paused at the round's step."""
    cut = runs["async-hierarchical"]["cut_dir"]
    states = [torch.load(ckpt.shard_path(cut, STOP["async-hierarchical"], rank), weights_only=True)["dp"]
              ["asynchronous"] for rank in range(4)]
    assert [sorted({"server", "region"} & set(state)) for state in states] == [["region", "server"], [], ["region"], []]
    top, regions = states[0]["server"], [states[0]["region"], states[2]["region"]]
    unmerged = [region["server"]["updates"] - region["global_updates"] for region in regions]
    assert top["updates"] + sum(unmerged) == sum(state["pushes"] for state in states)
    assert 6 <= top["updates"] + sum(unmerged) < 16 and top["discarded"] == 0  # the round at 3 of 8 steps' 16
    assert [client for client, _ in top["base"]] == [0, 2]  # the regions' servers are the global server's clients
    n = sum(w.numel() for w in final_weights(cut, STOP["async-hierarchical"], 1)[0].values())
    assert top["model"].numel() == regions[0]["server"]["model"].numel() == 2 * n  # and the second moments
    assert top["model"][n:].min() >= 0 and top["model"][n:].max() > 0
    assert all(state["checkpointed"] == STOP["async-hierarchical"] for state in states)


def test_the_checkpoint_holds_what_was_in_flight_and_each_replicas_place_in_its_period(runs):
    streaming = torch.load(ckpt.shard_path(runs["streaming"]["cut_dir"], STOP["streaming"], 0), weights_only=True)
    assert [flight["fragment"] for flight in streaming["dp"]["in_flight"]] == [1]
    assert streaming["dp"]["in_flight"][0]["delivered"]["bytes"] > 0  # its bytes, counted when it lands
    adaptive = [torch.load(ckpt.shard_path(runs["adaptive"]["cut_dir"], STOP["adaptive"], rank),
                           weights_only=True)["dp"] for rank in range(2)]
    assert [dp["local_steps"] for dp in adaptive] == [[5, 1], [5, 1]]  # the H100 replica 5 of the period's 6 steps
    assert [dp["period_steps"] for dp in adaptive] == [1, 0] and [dp["outer_step"] for dp in adaptive] == [1, 1]
    assert all(dp["posted_step_s"].shape == (2, 1) for dp in adaptive)  # the speeds of the period just ended


@pytest.mark.slow
def test_ctrl_c_then_the_printed_resume_command_ends_on_the_uninterrupted_runs_weights(files, runs, tmp_path):
    """Ctrl-C after the second checkpoint (every step), each mode side by side; the command the launcher prints
    resumes it, and the end is the uninterrupted run's."""
    from proctree import default_signals

    launchers = {}
    for mode in MODES:
        words = _words(files, mode, tmp_path / mode, "--checkpoint-every", "1")
        launchers[mode] = subprocess.Popen([*GEOTRAIN, *words], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                           text=True, start_new_session=True, preexec_fn=default_signals)
    commands = []
    try:
        waiting, deadline = dict(launchers), time.monotonic() + 300
        while waiting:  # each run gets its Ctrl-C as soon as its second checkpoint is complete
            for mode, launcher in list(waiting.items()):
                if (tmp_path / mode).is_dir() and (ckpt.latest_step(tmp_path / mode) or 0) >= 2:
                    os.killpg(launcher.pid, signal.SIGINT)  # Ctrl-C in a terminal
                    del waiting[mode]
                else:
                    assert launcher.poll() is None and time.monotonic() < deadline, f"{mode}: no 2nd checkpoint"
            time.sleep(0.02)
        for mode, launcher in launchers.items():
            _, err = launcher.communicate(timeout=120)
            assert launcher.returncode == 130, err
            assert ckpt.latest_step(tmp_path / mode) < _steps(mode)
            commands.append(shlex.split(err.strip().splitlines()[-1].split(": ", 2)[2])[1:])
    finally:
        for launcher in launchers.values():
            if launcher.poll() is None:
                os.killpg(launcher.pid, signal.SIGKILL)
                launcher.wait()
    resumed = _run_all(commands, tmp_path)
    for mode, done in zip(MODES, resumed, strict=True):
        steps = _steps(mode)
        if mode in EXACT:
            _assert_ends_alike(runs[mode]["ref_dir"], tmp_path / mode, steps, runs[mode]["ref"]["losses"],
                               json.loads(done.stdout)["losses"])
        else:
            assert abs(_validation(json.loads(done.stdout)) - _validation(runs[mode]["ref"])) < NATS[mode]
