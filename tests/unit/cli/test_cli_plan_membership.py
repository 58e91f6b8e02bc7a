"""`geotrain plan --exclude-devices / --membership`: the search runs on the live devices, the plan names
full-cluster devices (what `train --cluster` reads), records the excluded ones, and costs what the full
cluster's cost model says of it."""

from __future__ import annotations

import json
from importlib.resources import files

import numpy as np
import pytest

from geotrain.cli.main import main
from geotrain.cluster import load_cluster
from geotrain.cost import build_cost_model
from geotrain.job import load_job

WAN = str(files("geotrain.bench") / "data" / "wan-4x1.yaml")  # oregon-0, virginia-0, frankfurt-0, tokyo-0


def _plan(capsys, *flags: str) -> tuple[int, dict | None, str]:
    code = main(["plan", "--cluster", WAN, "--json", *flags])
    out, err = capsys.readouterr()
    return code, json.loads(out) if code == 0 else None, err


def test_excluding_a_device_plans_the_others_and_the_plan_costs_what_the_full_cluster_predicts(capsys):
    code, plan, _ = _plan(capsys, "--stages", "2", "--replicas", "1", "--exclude-devices", "virginia-0")
    assert code == 0
    assert plan["membership"] == {"excluded_devices": [1], "excluded_device_names": ["virginia-0"],
                                  "live_devices": 3, "cluster_devices": 4}
    assignment = np.array(plan["assignment"])
    assert assignment.shape == (2, 1) and 1 not in assignment and set(assignment.flat) <= {0, 2, 3}
    model = build_cost_model("yuan", load_cluster(WAN), load_job("gpt-1.3b-seed"), 2, 1)
    assert model.evaluate(assignment).total == pytest.approx(plan["cost"]["total"], rel=1e-12)
    # the best of every 2-stage pipeline on the live devices (auto's exact search on 3 devices)
    pairs = [np.array([[a], [b]]) for a in range(4) for b in range(4) if a != b]
    best_live = min(model.evaluate(p).total for p in pairs if 1 not in p)
    assert plan["cost"]["total"] == pytest.approx(best_live, rel=1e-12)


def test_a_membership_file_plans_the_same_as_excluding_the_rest(capsys, tmp_path):
    (tmp_path / "live.json").write_text('["oregon-0", 2, "tokyo-0"]')
    _, by_file, _ = _plan(capsys, "--stages", "2", "--replicas", "1", "--membership", str(tmp_path / "live.json"))
    _, by_exclusion, _ = _plan(capsys, "--stages", "2", "--replicas", "1", "--exclude-devices", "1")
    assert by_file["assignment"] == by_exclusion["assignment"]
    assert by_file["membership"] == by_exclusion["membership"]


@pytest.mark.parametrize("flags, line", [
    (["--exclude-devices", "mars-0"], "geotrain: error: --exclude-devices: unknown device 'mars-0': cluster 'wan-4x1' "
                                      "has devices 0..3 named oregon-0, virginia-0, frankfurt-0, tokyo-0\n"),
    (["--exclude-devices", "0,1,2,3"], "geotrain: error: --exclude-devices: excludes all 4 devices of cluster "
                                       "'wan-4x1'; at least one must stay live\n"),
    (["--exclude-devices", " , "], "geotrain: error: --exclude-devices: expected a comma list of device names or "
                                   "indices, got ' , '\n"),
])
def test_bad_exclusions_are_one_line_naming_the_value(capsys, flags, line):
    code, _, err = _plan(capsys, "--stages", "1", "--replicas", "1", *flags)
    assert (code, err) == (2, line)


def test_exclusions_need_a_fixed_layout_and_exclude_the_membership_flag(capsys, tmp_path):
    code, _, err = _plan(capsys, "--exclude-devices", "1")
    assert code == 2 and err.startswith("geotrain: error: --exclude-devices / --membership re-plan a fixed layout")
    with pytest.raises(SystemExit) as exit_:
        main(["plan", "--cluster", WAN, "--stages", "1", "--replicas", "1", "--exclude-devices", "1",
              "--membership", str(tmp_path / "m.json")])
    assert exit_.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err
