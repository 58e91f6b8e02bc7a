"""CLI contract of `geotrain plan` / `geotrain cost` (DESIGN.md): one JSON object, cost agreement,
one-line errors with exit code 2."""

import json
import subprocess
import sys

import numpy as np
import pytest

from geotrain.cli.main import main
from geotrain.cluster import seed_geo
from geotrain.cost import as_assignment, traffic_of_job, yuan_cost_reference
from geotrain.job import GPT_13B_SEED

CONTRACT_KEYS = {"method", "stages", "replicas", "assignment", "cost", "seconds"}


def run_cli(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_plan_json_is_exactly_one_object_with_the_contract_keys(tmp_path):
    command = [sys.executable, "-m", "geotrain", "plan", "--cluster", "seed-geo", "--stages", "4", "--replicas", "8",
               "--json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1
    doc = json.loads(lines[0])
    assert CONTRACT_KEYS <= set(doc)
    assert set(doc["cost"]) >= {"dp", "pp", "total"}
    assert doc["method"] == "auto" and doc["stages"] == 4 and doc["replicas"] == 8
    assert doc["details"]["chosen"] == "exact" and doc["gap"] == 0.0  # seed-geo is region-uniform: proven optimum
    assignment = as_assignment(doc["assignment"], 4, 8, 32)
    reference = yuan_cost_reference(seed_geo(), traffic_of_job(GPT_13B_SEED, 4, 8), assignment.tolist())
    assert doc["cost"]["total"] == pytest.approx(reference["total"], rel=1e-12)
    assert doc["cost"]["dp"] + doc["cost"]["pp"] == pytest.approx(doc["cost"]["total"], rel=1e-12)
    assert doc["seconds"] >= 0


@pytest.mark.parametrize("method", ["local-search", "pipeline-local", "dp-local", "random"])
def test_cost_of_the_plan_file_equals_the_plan_total(method, tmp_path, capsys):
    code, out, _ = run_cli(capsys, "plan", "--cluster", "seed-geo", "--stages", "4", "--replicas", "8",
                           "--method", method, "--json", "--out", str(tmp_path / "written.json"))
    assert code == 0
    plan = json.loads(out)
    (tmp_path / "plan.json").write_text(out)
    for path in ("plan.json", "written.json"):
        code, cost_out, _ = run_cli(capsys, "cost", "--cluster", "seed-geo", "--plan", str(tmp_path / path), "--json")
        assert code == 0
        cost = json.loads(cost_out)
        assert cost["cost"]["total"] == plan["cost"]["total"]  # exact: same model, same assignment
        assert cost["cost"]["dp"] == plan["cost"]["dp"] and cost["cost"]["pp"] == plan["cost"]["pp"]
    assert json.loads((tmp_path / "written.json").read_text())["assignment"] == plan["assignment"]


def test_plan_is_deterministic_and_options_reach_the_method(capsys):
    base = ["plan", "--cluster", "seed-geo", "--stages", "4", "--replicas", "8", "--json", "--seed", "3",
            "--method", "local-search"]
    first = json.loads(run_cli(capsys, *base, "--strict", "--iterations", "3000")[1])
    second = json.loads(run_cli(capsys, *base, "-o", "strict=true", "-o", "iterations=3000")[1])
    assert first["assignment"] == second["assignment"] and first["cost"] == second["cost"]
    assert first["options"] == {"strict": True, "iterations": 3000} and first["evaluations"] == 5 * 3000
    sampled = json.loads(run_cli(capsys, *base, "--method", "random", "--samples", "7")[1])
    assert sampled["evaluations"] == 7


def test_plan_and_cost_tables_for_people(tmp_path, capsys):
    code, out, _ = run_cli(capsys, "plan", "--cluster", "seed-geo", "--stages", "4", "--replicas", "8",
                           "--method", "pipeline-local", "--out", str(tmp_path / "p.json"))
    assert code == 0
    assert "19.291" in out and "stage 3" in out and "0=region0" in out
    code, out, _ = run_cli(capsys, "cost", "--cluster", "seed-geo", "--plan", str(tmp_path / "p.json"))
    assert code == 0 and "19.291" in out and "stage dp s" in out


def test_cost_uses_the_plans_replicas_and_the_default_job(tmp_path, capsys):
    plan = {"stages": 2, "replicas": 3, "assignment": [[0, 9, 17], [1, 10, 18]]}
    (tmp_path / "hand.json").write_text(json.dumps(plan))
    code, out, err = run_cli(capsys, "cost", "--cluster", "seed-geo", "--plan", str(tmp_path / "hand.json"), "--json")
    assert code == 0
    # rounded as `plan` rounds it (341 samples per replica, as the seed's floor gives): no edit asked of the user
    assert err == ("geotrain: note: job 'gpt-1.3b-seed': global_batch 1024 rounded to 1023, the nearest multiple of "
                   "the 3 replicas (341 samples each)\n")
    reference = yuan_cost_reference(seed_geo(), traffic_of_job(GPT_13B_SEED, 2, 3), plan["assignment"])
    assert json.loads(out)["cost"]["total"] == pytest.approx(reference["total"], rel=1e-12)


@pytest.mark.parametrize("argv,fragment", [
    (["plan", "--cluster", "seed-geo", "--stages", "5", "--replicas", "8"], "needs 40 devices, the cluster has 32"),
    (["plan", "--cluster", "nowhere.yaml", "--stages", "1", "--replicas", "1"], "neither a cluster preset"),
    (["plan", "--cluster", "seed-geo", "--stages", "4", "--replicas", "8", "--method", "random", "--iterations", "5"],
     "method 'random' has no option 'iterations'"),
    (["plan", "--cluster", "seed-geo", "--stages", "4", "--replicas", "8", "-o", "strict"], "must be KEY=VALUE"),
    (["plan", "--cluster", "seed-geo", "--stages", "4", "--replicas", "8", "--method", "local-search", "-o", "restarts=0"],
     "restarts must be"),
    (["plan", "--cluster", "seed-geo", "--stages", "4", "--replicas", "8", "--restarts", "2"],
     "method 'auto' has no option 'restarts'"),
    (["plan", "--cluster", "seed-geo", "--stages", "2", "--replicas", "2", "--job", "nojob"], "neither a job preset"),
    (["cost", "--cluster", "seed-geo", "--plan", "missing.json"], "missing.json: cannot read"),
])
def test_errors_are_one_line_with_exit_code_2(argv, fragment, capsys):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("geotrain: error: ") and fragment in lines[0]


@pytest.mark.parametrize("plan,fragment", [
    ({"stages": 1, "replicas": 2, "assignment": [[0, 40]]}, "device index must be in 0..31"),
    ({"stages": 1, "replicas": 2, "assignment": [[3, 3]]}, "used more than once"),
    ({"stages": 2, "replicas": 2, "assignment": [[0, 1]]}, "shape"),
    ({"replicas": 2, "assignment": [[0, 1]]}, "missing key 'stages'"),
])
def test_bad_plan_files_are_one_line_errors(plan, fragment, tmp_path, capsys):
    (tmp_path / "bad.json").write_text(json.dumps(plan))
    code, _, err = run_cli(capsys, "cost", "--cluster", "seed-geo", "--plan", str(tmp_path / "bad.json"), "--json")
    assert code == 2 and len(err.strip().splitlines()) == 1 and fragment in err and "bad.json" in err


def test_plan_on_a_cluster_file(tmp_path, capsys):
    (tmp_path / "two.yaml").write_text(
        "regions:\n  - {name: a, devices: 4, intra: {gbps: 10, ms: 1}}\n  - {name: b, devices: 4, intra: {gbps: 10, ms: 1}}\n"
        "links:\n  - {between: [a, b], gbps: 1e0, ms: 40}\n")
    code, out, _ = run_cli(capsys, "plan", "--cluster", str(tmp_path / "two.yaml"), "--stages", "2", "--replicas", "4",
                           "--method", "pipeline-local", "--json")
    assert code == 0
    regions = np.array(json.loads(out)["assignment"]) // 4
    assert np.all(regions[0] == regions[1])  # every pipeline inside one region


def test_a_method_that_reports_its_plan_only_at_the_end_keeps_the_bound_after_the_search(capsys):
    """Beside the search the bound starts from the first plan: genetic tells its plan when it ends, so its
    bound runs after it (the 40 % share), as before; the JSON says which."""
    code, out, _ = run_cli(capsys, "plan", "--cluster", "multicloud-1024", "--stages", "8", "--replicas", "16",
                           "--method", "genetic", "--time-limit", "6", "--lower-bound", "--json")
    doc = json.loads(out)
    assert code == 0 and "lower_bound_beside" not in doc["details"]
    assert 0.0 < doc["lower_bound"] <= doc["cost"]["total"] and doc["details"]["lower_bound_seconds"] > 0.0


def test_a_lower_bound_on_a_model_without_pairwise_terms_is_refused_before_the_search(capsys):
    """Before: genetic on 1024 devices by "schedule" ran a minute (past --time-limit 6) and then refused."""
    code, _, err = run_cli(capsys, "plan", "--cluster", "multicloud-1024", "--stages", "8", "--replicas", "16",
                           "--method", "genetic", "--cost-model", "schedule", "--time-limit", "6", "--lower-bound")
    assert code == 2 and "--lower-bound needs a pairwise cost model" in err and "'schedule'" in err
