"""`geotrain probe` inside a netlab with known shaping: bandwidths within 10%, regions recovered."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import yaml

from geotrain.cli.main import main
from geotrain.cluster import load_cluster_file
from geotrain.netlab.names import NETNS_DIR
from lab_marks import NEEDS_LAB
from paths import ROOT

pytestmark = [
    pytest.mark.serial,
    pytest.mark.slow,
    NEEDS_LAB,
]

SRC = str(ROOT / "src")
CLUSTER_DOC = {"name": "lab-2x2",
               "regions": [{"name": "east", "devices": 2, "intra": {"gbps": 1, "ms": 0.1}},
                           {"name": "west", "devices": 2, "intra": {"gbps": 1, "ms": 0.1}}],
               "links": [{"between": ["east", "west"], "gbps": 0.1, "ms": 20}]}
DEVICES = [0, 2, 1, 3]  # ranks alternate regions: east, west, east, west


def test_probe_in_netlab_recovers_bandwidth_and_regions(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PYTHONPATH", SRC)
    config = tmp_path / "lab.yaml"
    config.write_text(yaml.safe_dump(CLUSTER_DOC))
    out = tmp_path / "probed.yaml"
    before = set(os.listdir(NETNS_DIR)) if os.path.isdir(NETNS_DIR) else set()
    # 6.25 MB takes 0.5 s at 100 Mbit/s; 1 Gbit/s pairs grow their transfers to 25 MB (0.2 s)
    code = main(["netlab", "run", "--cluster", str(config), "--devices", ",".join(map(str, DEVICES)),
                 "--timeout", "240", "--", "-m", "geotrain", "probe", "--out", str(out),
                 "--bytes", "6250000", "--repeats", "1", "--pings", "10"])
    assert code == 0
    latency_shaped = "latency: NOT shaped" not in capsys.readouterr().err
    assert set(os.listdir(NETNS_DIR)) <= before
    measured = load_cluster_file(out)
    truth = np.array([0, 1, 0, 1])
    same = measured.region_of[:, None] == measured.region_of[None, :]
    assert np.array_equal(same, truth[:, None] == truth[None, :])
    configured_gbps = np.where(truth[:, None] == truth[None, :], 1.0, 0.1)
    off = ~np.eye(4, dtype=bool)
    ratio = measured.bandwidth_gbps[off] / configured_gbps[off]
    assert np.all(np.abs(ratio - 1) <= 0.10), ratio
    raw = json.loads(out.read_text().split("#   bandwidth_gbps_directed: ")[1].split("\n")[0])
    assert np.all(np.abs(np.asarray(raw)[off] / configured_gbps[off] - 1) <= 0.10), raw
    # without netem the latencies are all the host's own (~0.1 ms): bandwidth must decide
    assert f"clustered on {'latency' if latency_shaped else 'bandwidth'}" in out.read_text()
    assert main(["plan", "--cluster", str(out), "--stages", "2", "--replicas", "2", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert sorted(np.ravel(plan["assignment"]).tolist()) == [0, 1, 2, 3]
