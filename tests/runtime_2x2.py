"""The 2-region, 2x2 cluster and plan that the runtime CLI tests run (0.01 Gbit/s, 20 ms between regions)."""

import json
from pathlib import Path

CLUSTER_YAML = """\
name: test-2x2
regions:
  - {name: east, devices: 2, gpu: V100, intra: {gbps: 10, ms: 0.1}}
  - {name: west, devices: 2, gpu: V100, intra: {gbps: 10, ms: 0.1}}
links:
  - {between: [east, west], gbps: 0.01, ms: 20}
"""
PLAN = {"method": "manual", "stages": 2, "replicas": 2, "assignment": [[0, 2], [1, 3]]}


def write_job_files(root: Path) -> dict[str, str]:
    """CLUSTER_YAML and PLAN written into `root`: {"cluster": path, "plan": path} for `geotrain train`."""
    (root / "cluster.yaml").write_text(CLUSTER_YAML)
    (root / "plan.json").write_text(json.dumps(PLAN))
    return {"cluster": str(root / "cluster.yaml"), "plan": str(root / "plan.json")}
