"""examples/hsdp_diloco_train.py under `geotrain emulate` on 2 sites x 2 devices: FSDP2 inside each site, DiLoCo
(int8-block, 2 fragments, delay 1) across, per shard: the same shard at both sites ends equal, each rank holds
about half of the model, and the loss falls."""

import os
import re
import subprocess
import sys

import pytest
from paths import ROOT

pytestmark = pytest.mark.slow  # a launch of 4 processes under the emulator

LINE = re.compile(r"site (\d) shard (\d): holds (\d+) of (\d+) elements; loss (\S+) -> (\S+) .*shard sum (\S+)")


def test_hsdp_example_ends_with_equal_shard_peers_and_the_loss_down():
    done = subprocess.run([sys.executable, "-m", "geotrain", "emulate", "--cluster", "examples/clusters/lab-2x2.yaml",
                           "--devices", "0,1,2,3", "--time-scale", "0", "--timeout", "250", "--",
                           "examples/hsdp_diloco_train.py", "--periods", "4", "--hidden", "32"],
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src")}, capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {(int(m.group(1)), int(m.group(2))): m.groups()[2:] for m in LINE.finditer(done.stdout)}
    assert sorted(rows) == [(0, 0), (0, 1), (1, 0), (1, 1)], done.stdout
    for shard in (0, 1):
        assert rows[0, shard][4] == rows[1, shard][4]  # the shard's sum, printed with 10 decimals
    for held, total, first, last, _ in rows.values():
        assert 0.4 < int(held) / int(total) < 0.6  # a shard, not the model
        assert float(last) < 0.8 * float(first)
