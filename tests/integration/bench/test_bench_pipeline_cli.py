"""`geotrain bench pipeline --json`: two short rows through the runtime (the cut inside a site, and across
the 100 Mbit/s link with int4-block activations)."""

import json
import math
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(300)


def test_a_short_bench_measures_bytes_time_and_loss_per_row():
    done = subprocess.run([sys.executable, "-m", "geotrain", "bench", "pipeline", "--steps", "3",
                           "--codecs", "int4-block", "--json"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(done.stdout)
    local, across = doc["rows"]
    assert (local["label"], across["label"]) == ("local, fp32", "across, int4-block")
    assert local["cut_bytes_per_step"] == 2 * 8 * 96 * 128 * 4  # activations and gradients of 8 sequences
    assert across["cut_bytes_per_step"] == 2 * 8 * (96 * 128 // 2 + 4 * 96 * 128 // 128)
    assert across["bytes_ratio"] == pytest.approx(local["cut_bytes_per_step"] / across["cut_bytes_per_step"])
    assert across["step_s"] > local["step_s"] + 0.02  # 20 ms per message across the slow link
    for row in (local, across):
        assert len(row["losses"]) == 3 and math.isfinite(row["final_loss"]) and row["steps_to_target"] is None
    assert doc["link"] == {"inter_gbps": 0.1, "inter_ms": 20.0}
