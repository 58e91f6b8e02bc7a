"""`geotrain train --sync-every H --sync-moments` on the 2x2 test plan, real processes over gloo: the syncs
carry the moments beside the outer gradients (bytes as the codecs declare), replicas agree, a checkpoint
holds the first moment's anchor (stop and resume = one run), and the flag's misuse is refused."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from geotrain.codecs import get_codec
from runtime_2x2 import write_job_files

GEOTRAIN = [sys.executable, "-m", "geotrain"]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    return write_job_files(tmp_path_factory.mktemp("job"))


def _train(files: dict[str, str], *extra: str, steps: int = 8) -> dict:
    done = subprocess.run([*GEOTRAIN, "train", "--run-dir", "none", "--cluster", files["cluster"], "--plan", files["plan"],
                           "--time-scale", "0", "--steps", str(steps), "--dp-codec", "int8-block", "--json",
                           "--sync-every", "4", "--outer-lr", "1", "--outer-momentum", "0", *extra],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_moment_sync_bytes_replicas_and_resume(files, tmp_path):
    plain = _train(files)
    report = _train(files, "--sync-moments", "--checkpoint-dir", str(tmp_path / "a"), "--checkpoint-every", "4")
    assert report["summary"]["replicas_in_sync"]
    assert report["losses"][:4] == plain["losses"][:4]  # the same until the first sync lands
    assert report["losses"][4:] != plain["losses"][4:]  # the moments changed the next period
    # a sync step carries the outer gradients and first moments (int8-block) plus the second moments (log-block);
    # a report row's dp_bytes: the most one rank handed (the larger stage's, in both runs)
    sync_bytes, plain_bytes = report["iterations"][3]["dp_bytes"], plain["iterations"][3]["dp_bytes"]
    assert report["iterations"][2]["dp_bytes"] == 0
    int8 = get_codec("int8-block")
    numel = next(n for n in range(plain_bytes // 2, plain_bytes + 1) if int8.wire_nbytes((n,)) == plain_bytes)
    assert sync_bytes == 2 * int8.wire_nbytes((numel,)) + get_codec("log-block").wire_nbytes((numel,))
    # --moment-syncs 1: the first sync carries the moments, the second the outer gradients alone
    first_only = _train(files, "--sync-moments", "--moment-syncs", "1")
    assert first_only["summary"]["replicas_in_sync"]
    assert first_only["losses"][:8] == report["losses"][:8]  # the same until the second sync lands
    assert [row["dp_bytes"] for row in first_only["iterations"]][3::4] == [sync_bytes, plain_bytes]
    # 12 steps, stopped after 4: the sync after step 7 needs the first moment's anchor and the residuals
    # the checkpoint restored, and steps 8-11 show it
    whole = _train(files, "--sync-moments", steps=12)
    stopped = _train(files, "--sync-moments", "--checkpoint-dir", str(tmp_path / "b"), "--checkpoint-every", "4",
                     "--stop-after", "4", steps=12)
    resumed = _train(files, "--sync-moments", "--checkpoint-dir", str(tmp_path / "b"), "--checkpoint-every", "4",
                     "--resume", steps=12)
    assert stopped["losses"] == whole["losses"][:4]
    assert resumed["losses"] == whole["losses"]  # the resumed report holds the checkpoint's steps too


def test_moment_syncs_without_sync_moments_is_refused_in_one_line(files):
    done = subprocess.run([*GEOTRAIN, "train", "--run-dir", "none", "--cluster", files["cluster"], "--plan", files["plan"],
                           "--time-scale", "0", "--steps", "2", "--sync-every", "2", "--moment-syncs", "1"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "--moment-syncs says how many outer syncs carry the moments: it needs optim.sync_moments" in done.stderr
    assert len([line for line in done.stderr.splitlines() if line.strip()]) == 1


def test_moment_sync_without_sync_every_is_refused_in_one_line(files):
    done = subprocess.run([*GEOTRAIN, "train", "--run-dir", "none", "--cluster", files["cluster"], "--plan", files["plan"],
                           "--time-scale", "0", "--steps", "2", "--sync-moments"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "--sync-moments is Streaming DiLoCo's: it needs optim.sync_every" in done.stderr
    assert len([line for line in done.stderr.splitlines() if line.strip()]) == 1
