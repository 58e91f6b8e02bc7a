"""A run that loses a device for good continues on a re-plan: `geotrain plan --exclude-devices` plans the
live devices, and the 2 x 2 run's step-2 checkpoint resumes on the 2 x 1 re-plan (the global batch kept:
per-replica batch doubled). One reference launch (checkpoints at steps 2 and 4), one resumed launch."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from geotrain.cli.main import main
from geotrain.cluster import load_cluster
from geotrain.data import world_tokens
from geotrain.plan import Plan
from geotrain.runtime import RuntimeConfig, launch
from geotrain.runtime.checkpoint import CheckpointError

from runtime_2x2 import PLAN, write_job_files

pytestmark = pytest.mark.timeout(240)

LOST_DEVICE, LOST_NAME = 2, "west-0"  # stage 0 of replica 1 in PLAN's [[0, 2], [1, 3]]
OPTIONS = {"steps": 4, "time_scale": 0.0, "heartbeat_timeout_s": 20.0, "microbatches": 2}


def _replan(files: dict[str, str], tmp_path: Path, stages: int, replicas: int) -> Plan:
    out = tmp_path / f"replan-{stages}x{replicas}.json"
    code = main(["plan", "--cluster", files["cluster"], "--stages", str(stages), "--replicas", str(replicas),
                 "--exclude-devices", LOST_NAME, "--out", str(out), "--json"])
    assert code == 0
    return Plan.load(out)


def test_a_run_that_loses_a_device_resumes_on_the_replan_at_the_same_step_with_the_same_global_batch(
        tmp_path, capsys):
    files = write_job_files(tmp_path)
    cluster = load_cluster(files["cluster"])
    assert cluster.device_names[LOST_DEVICE] == LOST_NAME
    directory = tmp_path / "ckpt"
    settings = {**OPTIONS, "checkpoint_dir": str(directory)}
    tokens = world_tokens(0)
    reference = launch(RuntimeConfig.of(cluster, PLAN["assignment"], batch_size=4, checkpoint_every=2, **settings),
                       tokens=tokens).report
    (directory / "latest").write_text("step-000002\n")  # the device is lost after step 2: resume from there

    replan = _replan(files, tmp_path, stages=2, replicas=1)
    assert replan.extra["membership"]["excluded_devices"] == [LOST_DEVICE]
    assert replan.extra["membership"]["excluded_device_names"] == [LOST_NAME]
    assert LOST_DEVICE not in replan.assignment and replan.assignment.shape == (2, 1)
    narrower = _replan(files, tmp_path, stages=1, replicas=2)
    capsys.readouterr()

    with pytest.raises(CheckpointError, match=r"the checkpoint has S = 2 pipeline stages, this plan S = 1: a re-plan "
                                              r"must keep S \(re-splitting the layers .* not supported"):
        launch(RuntimeConfig.of(cluster, narrower.assignment, batch_size=4, resume=True, **settings), tokens=tokens)
    with pytest.raises(CheckpointError, match=r"global batch is 8 sequences \(2 replicas x 4\), this plan's is 4 "
                                              r"\(1 x 4\); a re-plan keeps the global batch: pass --batch-size 8$"):
        launch(RuntimeConfig.of(cluster, replan.assignment, batch_size=4, resume=True, **settings), tokens=tokens)
    with pytest.raises(CheckpointError, match=r"checkpoint was written by a different run: seed is 0 there, 1 now"):
        launch(RuntimeConfig.of(cluster, replan.assignment, batch_size=8, resume=True, seed=1, **settings),
               tokens=tokens)

    resumed = launch(RuntimeConfig.of(cluster, replan.assignment, batch_size=8, resume=True, **settings),
                     tokens=tokens).report
    assert [row.step for row in resumed.rows] == [2, 3]  # continues at the checkpoint's step, none repeated
    # Step t's global batch is the same 8 windows, cut in one slice instead of two: the same mean
    # gradient up to float summation order, so the losses agree to rounding, not bit for bit.
    np.testing.assert_allclose(resumed.losses, reference.losses[2:], rtol=0, atol=1e-5)
    assert resumed.replicas == 1 and resumed.assignment == replan.assignment.tolist()
    assert json.loads((directory / "step-000004" / "manifest.json").read_text())["identity"]["replicas"] == 1
