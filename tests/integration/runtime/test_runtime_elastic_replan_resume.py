"""An elastic run that loses a device for good continues on a re-plan from its checkpoint: the elastic
S = 1, R = 2 run writes one copy of its state (one writer group) every 4 steps; `plan --exclude-devices`
re-plans the live devices as R = 1; `train --resume` (not elastic) continues at the checkpoint's step with
the same global batch, and `train --elastic --resume` on the old plan does too, stopped by --stop-after 2 and resumed
again. Four launches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from geotrain.cli.main import main
from geotrain.plan import Plan
from paths import ROOT

pytest.importorskip("torchft")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
SRC = str(ROOT / "src")
CLUSTER = str(ROOT / "tests" / "data" / "wan-2x2.yaml")
LOST_DEVICE, LOST_NAME = 2, "west-0"  # group 1 of the plan [[0, 2]]
TINY = ["--model", "tiny-2layer", "--seq-len", "16", "--microbatches", "1", "--time-scale", "0", "--eval-windows", "4",
        "--steps", "8", "--checkpoint-every", "4", "--json"]


def _train(tmp: Path, plan: dict, *flags: str) -> subprocess.CompletedProcess:
    path = tmp / f"plan-{plan['replicas']}.json"
    path.write_text(json.dumps(plan))
    return subprocess.run([sys.executable, "-m", "geotrain", "train", "--cluster", CLUSTER, "--plan", str(path),
                           "--checkpoint-dir", str(tmp / "ckpt"), *TINY, *flags], capture_output=True, text=True,
                          timeout=150, env={**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}, cwd=tmp)


def test_an_elastic_run_that_loses_a_device_for_good_resumes_on_the_replan_from_its_checkpoint(tmp_path, capsys):
    plan = {"stages": 1, "replicas": 2, "assignment": [[0, LOST_DEVICE]]}
    done = _train(tmp_path, plan, "--elastic", "--batch-size", "2", "--heartbeat-timeout", "1.5", "--run-dir", "elastic")
    assert done.returncode == 0, done.stderr[-2000:]
    elastic = json.loads(done.stdout)
    assert elastic["summary"]["steps"] == 8 and elastic["summary"]["groups_finished"] == [0, 1]
    directory = tmp_path / "ckpt"
    assert (directory / "latest").read_text() == "step-000008\n"
    for step in (4, 8):
        manifest = json.loads((directory / f"step-{step:06d}" / "manifest.json").read_text())
        assert manifest["step"] == step and manifest["world_size"] == 1  # one copy: one shard per stage
        assert sorted(p.name for p in (directory / f"step-{step:06d}").iterdir()) == ["manifest.json", "rank-0000.pt"]
        assert (manifest["identity"]["replicas"], manifest["identity"]["batch_size"]) == (1, 4)  # global batch 2 x 2
        assert manifest["written_by"]["elastic_groups"] == 2 and manifest["written_by"]["group"] in (0, 1)
    saved = [json.loads(line) for path in (tmp_path / "elastic" / "metrics").glob("rank-*.jsonl")
             for line in path.read_text().splitlines() if '"checkpoint"' in line]
    assert sorted(e["step"] for e in saved) == [4, 8]  # one writer group per checkpoint: its event, its shard
    assert all(e["bytes"] == (tmp_path / e["path"]).stat().st_size for e in saved)
    (directory / "latest").write_text("step-000004\n")  # device west-0 is lost after step 4 for good

    out = tmp_path / "replan.json"
    assert main(["plan", "--cluster", CLUSTER, "--stages", "1", "--replicas", "1", "--exclude-devices", LOST_NAME,
                 "--out", str(out), "--json"]) == 0
    capsys.readouterr()
    replan = Plan.load(out)
    assert replan.assignment.shape == (1, 1) and LOST_DEVICE not in replan.assignment
    plan_r1 = {"stages": 1, "replicas": 1, "assignment": replan.assignment.tolist()}

    refused = _train(tmp_path, plan_r1, "--resume", "--batch-size", "2")
    assert refused.returncode != 0
    assert "global batch is 4 sequences (1 replicas x 4), this plan's is 2 (1 x 2)" in refused.stderr
    assert "pass --batch-size 4" in refused.stderr and "Traceback" not in refused.stderr

    resumed = _train(tmp_path, plan_r1, "--resume", "--batch-size", "4", "--run-dir", "replan")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    events = [json.loads(line) for line in (tmp_path / "replan" / "metrics" / "rank-0.jsonl").read_text().splitlines()]
    replanned = [e for e in events if e.get("event") == "replan"]  # the 2 elastic groups' state on 1 replica
    assert [(e["step"], e["from_replicas"], e["to_replicas"], e["to_assignment"]) for e in replanned] == [
        (4, 2, 1, plan_r1["assignment"])]
    losses = json.loads(resumed.stdout)["losses"]
    # step t's global batch is the same 4 windows, in one slice instead of two: the same mean gradient up
    # to float summation order (measured: within 3e-7)
    print("resumed - elastic losses:", np.subtract(losses, elastic["losses"][4:]))
    assert len(losses) == 4
    np.testing.assert_allclose(losses, elastic["losses"][4:], rtol=0, atol=1e-6)
    manifest = json.loads((directory / "step-000008" / "manifest.json").read_text())
    assert "written_by" not in manifest and manifest["identity"]["replicas"] == 1

    (directory / "latest").write_text("step-000004\n")
    elastic_again = ("--elastic", "--resume", "--batch-size", "2", "--heartbeat-timeout", "1.5")
    stopped = _train(tmp_path, plan, *elastic_again, "--stop-after", "2")  # steps 4 and 5, a checkpoint after 6
    assert stopped.returncode == 0, stopped.stderr[-2000:]
    first = json.loads(stopped.stdout)
    assert first["summary"]["steps"] == 6 and (directory / "latest").read_text() == "step-000006\n"
    again = _train(tmp_path, plan, *elastic_again)
    assert again.returncode == 0, again.stderr[-2000:]
    rerun = json.loads(again.stdout)
    assert rerun["summary"]["steps"] == 8 and rerun["losses"][:6] == [None] * 6
    # the same groups on the same state, stopped and resumed once more: bit for bit
    assert first["losses"][4:] + rerun["losses"][6:] == elastic["losses"][4:]
