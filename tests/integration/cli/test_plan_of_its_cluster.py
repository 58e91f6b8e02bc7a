"""A plan records the cluster and the job it was made for: `cost --plan` scores that job (and says so),
`train` and `cost` refuse it on another cluster in one line naming both, and an older plan without a
fingerprint is taken with a one-line note."""

from __future__ import annotations

import json

import pytest

from geotrain.cli.main import main

from runtime_2x2 import CLUSTER_YAML

JOB = "name: my-job\nparams: 3.0e8\nseq_len: 1024\nhidden: 1024\nglobal_batch: 64\nlayers: 12\n"


@pytest.fixture
def planned(tmp_path, capsys) -> dict[str, str]:
    files = {"cluster": tmp_path / "c.yaml", "other": tmp_path / "other.yaml", "job": tmp_path / "job.yaml",
             "plan": tmp_path / "plan.json"}
    files["cluster"].write_text(CLUSTER_YAML)
    files["other"].write_text(CLUSTER_YAML.replace("gbps: 0.01", "gbps: 0.02"))  # same name, same size
    files["job"].write_text(JOB)
    assert main(["plan", "--cluster", str(files["cluster"]), "--job", str(files["job"]), "--stages", "2",
                 "--replicas", "2", "--out", str(files["plan"]), "--json"]) == 0
    capsys.readouterr()
    return {key: str(path) for key, path in files.items()}


def test_cost_scores_the_plans_job_unless_job_is_given(planned, capsys):
    doc = json.loads(open(planned["plan"]).read())
    assert doc["job"] == "my-job" and doc["job_spec"]["params"] == 3.0e8 and len(doc["cluster_fingerprint"]) == 16
    assert main(["cost", "--cluster", planned["cluster"], "--plan", planned["plan"], "--json"]) == 0
    from_plan = json.loads(capsys.readouterr().out)
    assert (from_plan["job"], from_plan["job_from"]) == ("my-job", "plan")
    assert main(["cost", "--cluster", planned["cluster"], "--plan", planned["plan"], "--job", "gpt-1.3b-seed",
                 "--json"]) == 0
    given = json.loads(capsys.readouterr().out)
    assert (given["job"], given["job_from"]) == ("gpt-1.3b-seed", "--job")
    assert given["cost"]["dp"] > 3 * from_plan["cost"]["dp"]  # 1.3e9 parameters against 3e8: a different job scored
    assert main(["cost", "--cluster", planned["cluster"], "--plan", planned["plan"]]) == 0
    assert "(job my-job: the plan's job; yuan)" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["cost", "train"])
def test_a_plan_of_another_cluster_is_refused_in_one_line_naming_both(planned, capsys, command):
    fingerprint = json.loads(open(planned["plan"]).read())["cluster_fingerprint"]
    assert main([command, "--cluster", planned["other"], "--plan", planned["plan"]]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"geotrain: error: {planned['plan']} is a plan for cluster 'test-2x2' "
                                   f"(fingerprint {fingerprint}), not for {planned['other']}: cluster 'test-2x2' "
                                   f"(fingerprint ")
    assert captured.err.endswith(f"); plan again with --cluster {planned['other']}\n") and captured.err.count("\n") == 1


def test_an_older_plan_without_a_fingerprint_is_taken_with_a_note(planned, tmp_path, capsys):
    doc = json.loads(open(planned["plan"]).read())
    del doc["cluster_fingerprint"]
    (tmp_path / "old.json").write_text(json.dumps(doc))
    assert main(["cost", "--cluster", planned["other"], "--plan", str(tmp_path / "old.json"), "--json"]) == 0
    assert capsys.readouterr().err == (f"geotrain: note: {tmp_path / 'old.json'} records cluster 'test-2x2' but no "
                                       f"cluster fingerprint (a plan of an older geotrain): not checked against "
                                       f"{planned['other']}\n")
