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
measured iteration. Results: docs/history/fault_tolerance.md ("Re-planning").

    PYTHONPATH=src python benchmarks/replan_lost_device.py --elastic [--steps 20] [--json OUT.json]

The same for an elastic run (`train --elastic`, S = 1: one replica group per site, R = 4, per-group
batch 3, links emulated): it writes a checkpoint at half (one writer group); `tokyo-0` is lost for
good after that; `plan --exclude-devices` re-plans 1 x 3; the elastic checkpoint is resumed on the
re-plan by `train --resume` (per-replica batch 4: the global batch 12 kept) and by `train --elastic
--resume`. The elastic run (all steps) is the loss reference; a non-elastic run of the 1 x 4 plan gives
the runtime's prediction for the layout before the loss. Results: docs/history/fault_tolerance.md ("An elastic
run that lost a device for good").
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


def elastic_phase(name: str, plan: dict[str, Any], run: dict[str, Any], first: int, end: int) -> dict[str, Any]:
    """Steps `first`..`end`-1 of a run by `train --elastic`: its s/step are group 0's (wall, and emulated by
    its clock); an elastic run has no runtime prediction of its own (the planner's comm is shown)."""
    records = [r for r in run["group_records"]["0"] if first <= r["step"] < end]
    emulated = [r["emulated_s"] for r in records]
    return {"phase": name, "assignment": plan["assignment"], "steps": [records[0]["step"], records[-1]["step"]],
            "plan_predicted_comm_s": plan["cost"]["total"],
            "measured_emulated_s": (emulated[-1] - emulated[0]) / (len(records) - 1),
            "measured_iteration_s": sum(r["wall_s"] for r in records[1:]) / (len(records) - 1),
            "losses": run["losses"][first:end]}


def elastic_main(args: argparse.Namespace, work: Path, job_for: Any) -> dict[str, Any]:
    """The --elastic workflow of the module doc; its rows."""
    half, batch = args.steps // 2, 3
    job = work / "tiny-job.json"
    job.write_text(json.dumps(asdict(job_for(4 * batch))))
    common = ["--cluster", CLUSTER, "--steps", str(args.steps), "--time-scale", "1", "--microbatches", "1", "--json"]
    plans = {}
    for name, replicas, extra in (("old", 4, []), ("new", 3, ["--exclude-devices", "tokyo-0"])):
        geotrain("plan", "--cluster", CLUSTER, "--job", str(job), "--stages", "1", "--replicas", str(replicas),
                 "--out", str(work / f"{name}.json"), *extra)
        plans[name] = json.loads((work / f"{name}.json").read_text())
    ckpt = ["--checkpoint-dir", str(work / "ckpt")]
    old, new = ["--plan", str(work / "old.json")], ["--plan", str(work / "new.json"), "--batch-size", str(4 * batch // 3)]
    elastic = json.loads(geotrain("train", *common, *old, "--batch-size", str(batch), "--elastic", *ckpt,
                                  "--checkpoint-every", str(half)).stdout)
    manifest = json.loads((work / "ckpt" / f"step-{half:06d}" / "manifest.json").read_text())
    reference = json.loads(geotrain("train", *common, *old, "--batch-size", str(batch)).stdout)
    (work / "ckpt" / "latest").write_text(f"step-{half:06d}\n")  # tokyo-0 is lost after step `half`
    after = json.loads(geotrain("train", *common, *new, *ckpt, "--resume").stdout)
    (work / "ckpt" / "latest").write_text(f"step-{half:06d}\n")
    elastic_after = json.loads(geotrain("train", *common, *new, *ckpt, "--resume", "--elastic").stdout)
    rows = [elastic_phase("before: elastic 1 x 4", plans["old"], elastic, 0, half),
            phase("runtime on the 1 x 4 plan (prediction before)", plans["old"], reference),
            phase("after re-plan: train --resume 1 x 3", plans["new"], after),
            elastic_phase("after re-plan: train --elastic --resume 1 x 3", plans["new"], elastic_after, half,
                          args.steps)]
    reference_losses = elastic["losses"][half:]
    return {"rows": rows, "excluded": plans["new"]["membership"], "written_by": manifest["written_by"],
            "max_abs_loss_diff_resume_vs_elastic": max(abs(a - b) for a, b in zip(after["losses"], reference_losses)),
            "max_abs_loss_diff_elastic_resume_vs_elastic":
                max(abs(a - b) for a, b in zip(elastic_after["losses"][half:], reference_losses))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="steps of the run; the device is lost at half")
    parser.add_argument("--elastic", action="store_true", help="the workflow for an elastic run (module doc)")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    from geotrain.bench.wan import model_job

    if args.elastic:
        with tempfile.TemporaryDirectory() as tmp:
            result = elastic_main(args, Path(tmp), model_job)
        for row in result["rows"]:
            extra = (f"predicted {row['predicted_iteration_s']:.3f}" if "predicted_iteration_s" in row
                     else f"emulated {row['measured_emulated_s']:.3f}")
            print(f"{row['phase']}: {row['assignment']} steps {row['steps']}: planned comm "
                  f"{row['plan_predicted_comm_s']:.3f}, {extra}, measured {row['measured_iteration_s']:.3f} s/step")
        print({k: v for k, v in result.items() if k != "rows"})
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
        return

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
