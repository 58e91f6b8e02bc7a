"""`geotrain calibrate` measures a model's step; `plan --calibration` charges compute at it."""

import json

import pytest

from geotrain.cli.main import main
from geotrain.cost.gpus import gpu_peak_flops

CLUSTER = """name: two-h100-sites
regions:
  - {name: a, devices: 2, gpu: H100, intra: {gbps: 100, ms: 0.1}}
  - {name: b, devices: 2, gpu: A100, intra: {gbps: 100, ms: 0.1}}
links:
  - {between: [a, b], gbps: 1, ms: 50}
"""
# the tiny preset as a planning job: 8 sequences of 96 tokens per replica, as calibrated below
JOB = "name: tiny\nparams: 816896\nlayers: 4\nhidden: 128\nseq_len: 96\nglobal_batch: 16\nbytes_per_value: 4\nvocab: 44\n"


def test_the_plan_charges_the_measured_step_on_the_gpu_it_stands_for(tmp_path, capsys):
    calibration = tmp_path / "calibration.json"
    (tmp_path / "c.yaml").write_text(CLUSTER)
    (tmp_path / "job.yaml").write_text(JOB)
    assert main(["calibrate", "--model", "tiny", "--batch-size", "8", "--steps", "1", "--warmup", "0",
                 "--cluster", str(tmp_path / "c.yaml"), "--out", str(calibration), "--json"]) == 0
    measured = json.loads(capsys.readouterr().out)
    assert measured["stands_for"] == "H100" and measured["params"] == 816_896 and measured["tokens_per_step"] == 768
    assert json.loads(calibration.read_text()) == measured
    assert main(["plan", "--cluster", str(tmp_path / "c.yaml"), "--job", str(tmp_path / "job.yaml"), "--stages", "1",
                 "--replicas", "2", "--wan-recipe", "auto", "--recipe-outer-sync", "sync", "--calibration",
                 str(calibration), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["calibration"]["utilisation"] == pytest.approx(measured["utilisation"])
    # synchronous recipes only: an asynchronous one's compute_s is its step, the server's round trips in it
    # the job's step is the calibrated one (same parameters and tokens): on an H100, the measured seconds; on an
    # A100, those x the peaks' ratio (as the emulator runs the cluster's fastest GPU at this machine's speed)
    slowest = max(gpu_peak_flops("H100") / gpu_peak_flops(gpu) for gpu in
                  ["H100" if d < 2 else "A100" for d in plan["assignment"][0]])
    assert plan["wan_recipe"]["compute_s"] == pytest.approx(measured["seconds_per_step"] * slowest, rel=1e-9)


def test_calibrate_asks_what_a_cpu_measurement_stands_for(capsys):
    assert main(["calibrate", "--steps", "1"]) == 2
    assert "--as-gpu NAME, or --cluster C" in capsys.readouterr().err
    assert main(["calibrate", "--steps", "1", "--as-gpu", "H1000"]) == 2
    assert "H1000" in capsys.readouterr().err
