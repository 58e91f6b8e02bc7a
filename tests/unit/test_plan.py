"""One Plan dataclass: parsed once, typed fields, written back byte for byte; loaders share one error helper."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from geotrain.cli.output import strict_json_text
from geotrain.cluster import ClusterFileError, load_cluster
from geotrain.job import JobError, load_job
from geotrain.plan import Plan, PlanCodecs, PlanError, PlanSplit
from geotrain.yaml_text import DocumentError, document_errors_as

WRITTEN = {  # the key order `plan --uneven-split --codecs auto --out` writes, auto-config keys in the middle
    "method": "pipeline-local", "stages": 2, "replicas": 3, "microbatches": 4,
    "assignment": [[0, 2, 4], [1, 3, 5]], "cost": {"dp": 0.25, "pp": 0.5, "total": 0.75, "compute": 0.0},
    "seconds": 0.001, "evaluations": 1, "details": {"exhaustive": True}, "seed": 0, "cluster": "c",
    "split": {"rule": "speed", "layers": 4, "counts": [3, 1], "boundaries": [0, 3, 4], "shares": [0.75, 0.25]},
    "codecs": {"version": 1, "policy": "dp=sign,pp=fp16", "tolerance": 0.02, "dp": ["sign", "none"],
               "pp": ["fp16"], "cost": {"total": 0.5}},
}


def test_a_plan_file_is_parsed_once_into_typed_fields():
    plan = Plan.from_json(WRITTEN, "p.json")
    assert (plan.stages, plan.replicas, plan.method, plan.microbatches, plan.seconds) == (2, 3, "pipeline-local", 4, 0.001)
    assert plan.assignment.dtype == np.int64 and plan.assignment.tolist() == [[0, 2, 4], [1, 3, 5]]
    assert plan.cost == {"dp": 0.25, "pp": 0.5, "total": 0.75, "compute": 0.0}
    assert plan.codecs == PlanCodecs(dp=("sign", "none"), pp=("fp16",))
    assert plan.split == PlanSplit(boundaries=(0, 3, 4)) and plan.split.layer_shares == [0.75, 0.25]
    assert plan.extra == {"evaluations": 1, "details": {"exhaustive": True}, "seed": 0, "cluster": "c"}


def test_to_json_writes_back_the_file_byte_for_byte(tmp_path):
    text = strict_json_text(WRITTEN, indent=2) + "\n"
    (tmp_path / "p.json").write_text(text)
    assert strict_json_text(Plan.load(tmp_path / "p.json").to_json(), indent=2) + "\n" == text
    reordered = {"assignment": WRITTEN["assignment"], "replicas": 3, "zeta": 1, "stages": 2}
    assert list(Plan.from_json(reordered).to_json()) == ["assignment", "replicas", "zeta", "stages"]


def test_a_plan_built_in_code_writes_the_contract_order():
    plan = Plan(stages=1, replicas=2, assignment=np.array([[3, 1]]), method="random", cost={"dp": 1.0, "pp": 0.0,
                "total": 1.0}, seconds=0.5, extra={"seed": 7})
    plan = replace(plan, codecs=PlanCodecs(dp=("fp16",), pp=()))
    assert json.dumps(plan.to_json()) == json.dumps({
        "method": "random", "stages": 1, "replicas": 2, "assignment": [[3, 1]],
        "cost": {"dp": 1.0, "pp": 0.0, "total": 1.0}, "seconds": 0.5, "seed": 7,
        "codecs": {"dp": ["fp16"], "pp": []}})
    assert Plan.from_json(plan.to_json()).to_json() == plan.to_json()


@pytest.mark.parametrize(("key", "value", "message"), [
    ("method", 5, "p.json: method must be a string, got 5"),
    ("seconds", "fast", "p.json: seconds must be a number of seconds, got 'fast'"),
    ("microbatches", 0, "p.json: microbatches must be an integer >= 1, got 0"),
    ("microbatches", True, "p.json: microbatches must be an integer >= 1, got True"),
    ("cost", {"dp": "x"}, "p.json: cost.dp must be a number of seconds, got 'x'"),
    ("cost", [1], r"p.json: cost must be an object of seconds by term \(dp, pp, total...\), got \[1\]"),
])
def test_a_typed_field_of_the_wrong_type_is_refused_naming_the_key(key, value, message):
    with pytest.raises(PlanError, match=f"^{message}$"):
        Plan.from_json({**WRITTEN, key: value}, "p.json")


def test_every_loader_turns_a_document_error_into_its_own_type_with_the_same_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: [1,\n")
    for load, error_type in ((Plan.load, PlanError), (load_job, JobError), (load_cluster, ClusterFileError)):
        with pytest.raises(error_type) as caught:
            load(str(bad))
        assert not isinstance(caught.value, DocumentError) and caught.value.__cause__ is None
        assert str(caught.value).startswith(f"{bad}: line ") and "not valid YAML/JSON" in str(caught.value)


def test_document_errors_as_passes_other_errors_through():
    with pytest.raises(KeyError):
        with document_errors_as(PlanError):
            raise KeyError("not a document problem")
    with pytest.raises(PlanError, match="^f.json: line 2: broken$"):
        with document_errors_as(PlanError):
            raise DocumentError("f.json", "line 2", "broken")


def test_a_plan_records_its_cluster_and_is_refused_on_another_naming_both():
    from geotrain.cluster import parse_cluster_text
    from geotrain.plan import cluster_record

    text = "name: {name}\nregions:\n  - {{name: a, devices: 2, gpu: T4, intra: {{gbps: {gbps}, ms: 1}}}}\n"
    ours = parse_cluster_text(text.format(name="ours", gbps=10), "ours.yaml")
    plan = Plan.from_json({"stages": 1, "replicas": 2, "assignment": [[0, 1]], **cluster_record(ours)}, "p.json")
    assert plan.check_cluster(ours, "p.json", "ours.yaml") is None
    assert plan.check_cluster(parse_cluster_text(text.format(name="renamed", gbps=10), "r.yaml")) is None
    other = parse_cluster_text(text.format(name="ours", gbps=5), "other.yaml")
    with pytest.raises(PlanError) as caught:
        plan.check_cluster(other, "p.json", "other.yaml")
    assert str(caught.value) == (f"p.json is a plan for cluster 'ours' (fingerprint {ours.fingerprint()}), not for "
                                 f"other.yaml: cluster 'ours' (fingerprint {other.fingerprint()}); plan again with "
                                 f"--cluster other.yaml")
    old = Plan.from_json({"stages": 1, "replicas": 2, "assignment": [[0, 1]], "cluster": "ours"}, "old.json")
    assert old.check_cluster(other, "old.json", "other.yaml") == (
        "old.json records cluster 'ours' but no cluster fingerprint (a plan of an older geotrain): not checked "
        "against other.yaml")
    assert Plan.from_json({"stages": 1, "replicas": 2, "assignment": [[0, 1]]}).check_cluster(other) is None


def test_a_plan_records_its_job_whole_and_a_preset_by_name():
    from geotrain.job import JOB_PRESETS, Job
    from geotrain.plan import job_record

    mine = Job(name="mine", params=1e8, seq_len=512, hidden=768, global_batch=64, layers=12)
    plan = Plan.from_json({"stages": 1, "replicas": 1, "assignment": [[0]], **job_record(mine)})
    assert plan.recorded_job() == mine
    preset = next(iter(JOB_PRESETS))
    assert Plan.from_json({"stages": 1, "replicas": 1, "assignment": [[0]], "job": preset}).recorded_job() == \
        JOB_PRESETS[preset]
    assert Plan.from_json({"stages": 1, "replicas": 1, "assignment": [[0]], "job": "gone"}).recorded_job() is None
    bad = Plan.from_json({"stages": 1, "replicas": 1, "assignment": [[0]], "job_spec": {"name": "x"}})
    with pytest.raises(PlanError, match=r"^p.json: job_spec"):
        bad.recorded_job("p.json")
