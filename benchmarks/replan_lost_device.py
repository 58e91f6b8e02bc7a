"""A run that loses one device for good, re-plans the live devices and continues from its checkpoint.

    PYTHONPATH=src python benchmarks/replan_lost_device.py [--steps 20] [--json OUT.json]

Through the CLI, as a user would, on wan-4x1 (4 sites x 1 V100, 100 Mbit/s and 50-150 ms between
sites, links emulated at --time-scale 1) with the tiny GPT (planned as the job of its real sizes,
bench.wan.model_job): `plan` 2 stages x 2 replicas; `train` it for the first half with a checkpoint
there (the device is lost after that step); `plan --exclude-devices` (stage 0 of replica 1's device)
2 x 1 on the 3 live devices; `train --resume` on the re-plan with the global batch kept (per-replica
batch doubled). An uninterrupted run of the first plan is the loss reference, and a re-plan with
another S is shown refused. Per phase: the planner's predicted communication (yuan, seconds per
step), the runtime's predicted iteration (cost model "schedule" with the measured compute) and the
measured iteration. Results: docs/fault_tolerance.md ("Re-planning").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = str(ROOT / "src" / "geotrain" / "bench" / "data" / "wan-4x1.yaml")
PER_REPLICA_BATCH = 4


def geotrain(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, "-m", "geotrain", *args], capture_output=True, text=True, env=env)
    if check and done.returncode != 0:
        raise SystemExit(f"geotrain {' '.join(args[:1])} failed: {done.stderr.strip()}")
    return done


def phase(name: str, plan: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    summary = run["summary"]
    return {"phase": name, "assignment": plan["assignment"], "steps": [run["iterations"][0]["step"],
                                                                      run["iterations"][-1]["step"]],
            "plan_predicted_comm_s": plan["cost"]["total"], "measured_comm_s": summary["comm_measured_s"],
            "predicted_iteration_s": summary["iteration_predicted_s"]["schedule"],
            "measured_iteration_s": summary["iteration_s"], "losses": run["losses"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="steps of the run; the device is lost at half")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    from geotrain.bench.wan import model_job

    half = args.steps // 2
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        job = work / "tiny-job.json"
        job.write_text(json.dumps(asdict(model_job(2 * PER_REPLICA_BATCH))))
        common = ["--cluster", CLUSTER, "--steps", str(args.steps), "--time-scale", "1", "--microbatches", "2",
                  "--json"]
        plans = {}
        for name, stages, replicas, extra in (("old", 2, 2, []), ("new", 2, 1, None), ("other-s", 1, 2, None)):
            if extra is None:
                extra = ["--exclude-devices", str(plans["old"]["assignment"][0][1])]
            geotrain("plan", "--cluster", CLUSTER, "--job", str(job), "--stages", str(stages), "--replicas",
                     str(replicas), "--out", str(work / f"{name}.json"), *extra)
            plans[name] = json.loads((work / f"{name}.json").read_text())
        ckpt = ["--checkpoint-dir", str(work / "ckpt")]
        old = ["--plan", str(work / "old.json"), "--batch-size", str(PER_REPLICA_BATCH)]
        reference = json.loads(geotrain("train", *common, *old).stdout)
        before = json.loads(geotrain("train", *common, *old, *ckpt, "--checkpoint-every", str(half),
                                     "--stop-after", str(half)).stdout)
        new = ["--plan", str(work / "new.json"), "--batch-size", str(2 * PER_REPLICA_BATCH), "--resume"]
        after = json.loads(geotrain("train", *common, *new, *ckpt).stdout)
        refused = geotrain("train", *common, "--plan", str(work / "other-s.json"), "--batch-size",
                           str(2 * PER_REPLICA_BATCH), "--resume", *ckpt, check=False)
    rows = [phase("before (2 x 2)", plans["old"], before), phase("after re-plan (2 x 1)", plans["new"], after),
            phase("reference, no loss (2 x 2)", plans["old"], reference)]
    diff = max(abs(a - b) for a, b in zip(after["losses"], reference["losses"][half:]))
    result = {"rows": rows, "excluded": plans["new"]["membership"], "max_abs_loss_diff_after_vs_reference": diff,
              "other_s": {"returncode": refused.returncode, "stderr": refused.stderr.strip()}}
    print("| phase | devices (stage x replica) | steps | planned comm s/step (yuan) | measured comm s/step | "
          "predicted s/step (schedule) | measured s/step |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['phase']} | {row['assignment']} | {row['steps'][0]}-{row['steps'][1]} | "
              f"{row['plan_predicted_comm_s']:.3f} | {row['measured_comm_s']:.3f} | "
              f"{row['predicted_iteration_s']:.3f} | {row['measured_iteration_s']:.3f} |")
    print(f"excluded: {result['excluded']}; max |loss after - reference| = {diff:.2e}")
    print(f"another S: exit {refused.returncode}: {refused.stderr.strip()}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
