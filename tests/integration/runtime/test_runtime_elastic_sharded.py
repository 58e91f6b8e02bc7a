"""`geotrain train --elastic` on a sharded plan of 2 pipeline stages (plan --shards 2): a replica group is its
2 x 2 processes, each stage's 2 holding FSDP2 shards of the stage, one torchft Manager each (the replicate
dimension: position (stage s, shard k)'s outer sync goes to the same position of the other group). A shard process
killed alone takes its group with it: the launcher restarts the group as a whole, counted once, and each of its
positions rejoins by live recovery from the same position of group 0, while group 0 commits every outer sync.
On emulated links (the default --time-scale): each process on its own device, the FSDP2 collectives inside a
site, the stage-to-stage sends inside the region, the outer sync between the regions. One launch, shared by the
assertions; it is also the composition table's cell "shards" x "elastic"
(tests/integration/runtime/test_runtime_composition_launch.py)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from paths import ROOT
from proctree import comm, descendants

pytest.importorskip("torchft")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")]
CLUSTER = str(ROOT / "examples" / "clusters" / "lab-2x4.yaml")
PLAN = {"method": "manual", "stages": 2, "replicas": 2, "assignment": [[0, 4], [2, 6]],
        "shards": {"k": 2, "devices": [[[0, 1], [4, 5]], [[2, 3], [6, 7]]]}}
"""Group 0 at region east's two sites (stage 0 on devices 0-1, stage 1 on 2-3), group 1 at west's (4-5, 6-7)."""
MODEL_FP32_BYTES = 4 * 288_768
"""tiny-2layer's parameters (models/presets.py, tests/unit/models/test_models_presets.py) in fp32: what a run that
is not elastic of this plan sends per outer sync between the regions per replica (measured: 1,155,072 B)."""
STEPS, EVERY, CHECKPOINT_EVERY = 48, 4, 4
SHARD_PROCESSES = tuple(f"geotrain-g{g}s{s}k{k}" for g in range(2) for s in range(2) for k in range(2))
KILLED = "geotrain-g1s1k1"


@pytest.fixture(scope="module")
def killed_shard_run(tmp_path_factory):
    """S = 2, K = 2, R = 2 (PLAN); group 1's stage 1 shard 1 process SIGKILLed alone by this
    test once the first checkpoint is written (step 4: both groups are training). Returns the JSON summary, every
    pid seen per shard process name and the checkpoint directory."""
    tmp = tmp_path_factory.mktemp("sharded")
    plan = tmp / "plan.json"
    plan.write_text(json.dumps(PLAN))
    out, err = (tmp / "summary.json").open("w"), (tmp / "stderr.txt").open("w")  # files: a pipe would fill up
    launcher = subprocess.Popen(
        [sys.executable, "-m", "geotrain", "train", "--cluster", CLUSTER, "--plan", str(plan), "--elastic",
         "--model", "tiny-2layer", "--seq-len", "16", "--batch-size", "4", "--microbatches", "2",
         "--sync-every", str(EVERY), "--outer-lr", "1", "--outer-momentum", "0", "--checkpoint-dir", str(tmp / "ckpt"),
         "--checkpoint-every", str(CHECKPOINT_EVERY),
         "--heartbeat-timeout", "1.5", "--eval-windows", "4", "--steps", str(STEPS), "--json"],
        stdout=out, stderr=err, cwd=tmp,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"})
    seen: dict[str, list[int]] = {name: [] for name in SHARD_PROCESSES}
    killed = False
    deadline = time.monotonic() + 180
    while launcher.poll() is None and time.monotonic() < deadline:
        for pid in descendants(launcher.pid):
            name = comm(pid)
            if name in seen and pid not in seen[name]:
                seen[name].append(pid)
        if not killed and seen[KILLED] and (tmp / "ckpt" / "latest").is_file():
            os.kill(seen[KILLED][0], signal.SIGKILL)
            killed = True
        time.sleep(0.1)
    if launcher.poll() is None:
        launcher.kill()  # the supervisor's guardian stops the rest
    launcher.wait(timeout=60)
    out.close()
    err.close()
    assert launcher.returncode == 0, (tmp / "stderr.txt").read_text()[-2000:]
    return json.loads((tmp / "summary.json").read_text()), seen, tmp / "ckpt"


@pytest.mark.timeout(240)
def test_a_killed_shard_takes_its_group_out_which_rejoins_without_a_global_restart(killed_shard_run):
    doc, seen, _ = killed_shard_run
    run = doc["summary"]
    assert doc["config"]["shards"] == 2 and doc["stages"] == 2 and run["steps"] == STEPS
    # one failure of group 1 (one shard process alone killed), counted once, a restart of its 4 processes; group
    # 0's processes never changed
    assert run["replica_failures"] == 1 and run["restarts"] == [0, 1] and run["kills"] == 0
    assert {name: len(pids) for name, pids in seen.items()} == {name: 1 + name.startswith("geotrain-g1")
                                                                for name in SHARD_PROCESSES}
    assert run["rejoins"] == 1 and run["global_restarts"] == 0 and run["groups_finished"] == [0, 1]
    assert run["max_param_diff_across_replicas"] == 0.0  # each (stage, shard) against the same, all 4
    assert len(doc["losses"]) == STEPS and all(math.isfinite(loss) for loss in doc["losses"])
    assert math.isfinite(run["val_loss"]) and run["val_loss"] < doc["losses"][0]


@pytest.mark.timeout(240)
def test_each_rejoined_shard_equals_its_peer_shard_bit_for_bit_after_every_sync(killed_shard_run):
    survivor, rejoined = (killed_shard_run[0]["group_records"][g] for g in ("0", "1"))
    assert [r["step"] for r in survivor] == list(range(STEPS))
    first = rejoined[0]["step"]
    assert CHECKPOINT_EVERY <= first < STEPS - EVERY and [r["step"] for r in rejoined] == list(range(first, STEPS))
    shards = {r["step"]: r["stage_params_sha256"] for r in survivor if r["synced"]}
    synced = [r for r in rejoined if r["synced"]]
    assert len(synced) >= 1 and all(len(r["stage_params_sha256"]) == 4 and r["stage_params_sha256"] == shards[r["step"]]
                                    for r in synced)
    assert len(set(shards[STEPS - 1])) == 4  # the 4 positions hold different quarters of the model
    # it recovers in an outer sync's quorum, where its outer gradient would repeat its peer's (weight 0); both
    # groups contribute to every later one
    assert [r["contributors"] for r in synced] == [1.0] + [2.0] * (len(synced) - 1)


@pytest.mark.timeout(240)
def test_the_end_checkpoint_holds_one_group_s_four_shards_as_plain_local_tensors(killed_shard_run):
    directory = killed_shard_run[2]
    manifest = json.loads((directory / (directory / "latest").read_text().strip() / "manifest.json").read_text())
    assert manifest["step"] == STEPS and manifest["world_size"] == 4 and manifest["identity"]["replicas"] == 1
    slots = [torch.load(directory / f"step-{STEPS:06d}" / shard["file"], weights_only=True)["slot"]
             for shard in manifest["shards"]]
    assert slots == [{"rank": 2 * s + k, "stage": s, "replica": 0, "shard": k} for s in range(2) for k in range(2)]


@pytest.mark.timeout(240)
def test_between_regions_each_group_sends_its_model_once_per_outer_sync_as_a_run_that_is_not_elastic(
        killed_shard_run):
    """A run that is not elastic sends, per replica and outer sync of 2 replicas (a ring all-reduce of 2 members:
    each sends its buffer once), the model's fp32 bytes between the regions: each (stage, shard) its shard. An
    elastic group sends the same, plus its 4 positions' one fp32 weight each (the quorum's weight sum rides in the
    all-reduce, geotrain.sync.elastic); nothing between the regions otherwise: the
    pipeline's sends and the FSDP2 collectives stay inside the region. A sync whose first try died with its peer
    also sent that try's part (at most one such sync per failure)."""
    records = {g: killed_shard_run[0]["group_records"][g] for g in ("0", "1")}
    per_sync = MODEL_FP32_BYTES + 4 * 4
    assert all(r["inter_region_bytes"] == 0 and r["sent_bytes"] > 0 for rs in records.values() for r in rs
               if not r["synced"])
    both = [r["inter_region_bytes"] for rs in records.values() for r in rs if r["synced"] and r["contributors"] == 2.0]
    retried = [b for b in both if b != per_sync]
    assert len(both) >= STEPS // EVERY and len(retried) <= killed_shard_run[0]["summary"]["replica_failures"]
    assert all(b > per_sync for b in retried)
    emulated = [r["emulated_s"] for r in records["0"]]
    assert killed_shard_run[0]["summary"]["train_emulated_s"] >= emulated[-1] > 0 and emulated == sorted(emulated)
