"""`geotrain train --dp-hierarchical` in real processes: one stage x 4 replicas over 2 regions of 2
devices, so the DP group reduces inside each region and compresses only between them."""

from __future__ import annotations

import numpy as np
import pytest

from geotrain.cluster import make_network
from geotrain.data import world_tokens
from geotrain.codecs import get_codec
from geotrain.comm.hierarchical import HierarchicalGroups, expected_link_bytes
from geotrain.comm.regions import Regions
from geotrain.models import MODEL_PRESETS
from geotrain.runtime import RuntimeConfig, RuntimeConfigError, launch
from geotrain.runtime.stages import build_stage
from geotrain.sync.moments import SECOND_MOMENT_CODEC
from geotrain.sync.streaming import fragment_pieces

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

CLUSTER = make_network([2, 2], 10.0, (0.01, 0.01), (20.0, 20.0), seed=0, name="test-2x2")
ONE_STAGE = np.array([[0, 1, 2, 3]])  # one DP group of 4 replicas: devices 0,1 in one region, 2,3 in the other


@pytest.fixture(scope="module")
def tokens():
    return world_tokens(0)


def _run(tokens, **options):
    options = {"steps": 4, "time_scale": 0.01, "heartbeat_timeout_s": 20.0, "model_name": "tiny-2layer",
               "assignment": ONE_STAGE, **options}
    return launch(RuntimeConfig.of(cluster=CLUSTER, gpt=MODEL_PRESETS["tiny-2layer"], **options), tokens=tokens).report


def test_hierarchical_sign_trains_in_sync_and_sends_less_than_flat_sign(tokens):
    # (a resume restoring the hierarchical residuals: the posted test below, with a sync in flight)
    hier = _run(tokens, dp_codec="sign", dp_hierarchical=True)
    assert hier.replicas_in_sync  # every replica applies the same bits
    assert hier.losses[-1] < hier.losses[0]
    # each rank sends its region peer half the vector in fp32 twice (reduce-scatter, all-gather) and
    # the other region one sign payload of its half, one scale per parameter piece
    sizes = [p.numel() for p in build_stage(MODEL_PRESETS["tiny-2layer"], 0, 0, 1).parameters()]
    regions = Regions.of([[0, 1], [2, 3]])
    expected = [expected_link_bytes(get_codec("sign"), HierarchicalGroups(regions, 2, (), {}), rank, sum(sizes),
                                    segments=sizes) for rank in range(4)]
    assert hier.dp_bytes_per_stage[0] == max(e.intra_bytes + e.inter_bytes for e in expected)
    assert expected[0].intra_bytes == 4 * sum(sizes)


def test_hierarchical_refuses_powersgd():
    with pytest.raises(RuntimeConfigError, match="dp-hierarchical"):
        RuntimeConfig.of(cluster=CLUSTER, assignment=ONE_STAGE, dp_codec="powersgd", dp_hierarchical=True)


def test_hierarchical_exchange_posted_with_a_sync_delay_carries_the_moments_with_the_blocking_bytes(tokens, tmp_path):
    """--sync-delay 1 --fragments 2 --sync-moments (6 steps): each fragment's hierarchical exchanges (outer gradients, first
    and second moments, each through its own codec) are posted after its sync step and land one step later; the
    bytes of a landing step are the every-step region mean's plus the blocking hierarchical exchange's of each part
    (expected_link_bytes, the formula the blocking run is held to). A run stopped with a sync in flight and resumed
    continues it exactly (the sync settled into the checkpoint, every part's error-feedback residuals restored)."""
    options = {"dp_codec": "int8-block", "dp_hierarchical": True, "sync_every": 4, "fragments": 2, "sync_delay": 1,
               "sync_moments": True, "steps": 6}
    report = _run(tokens, **options)
    assert report.replicas_in_sync and min(report.losses[1:]) < report.losses[0]  # (step 4 spikes, blocking too)
    # stopped after step 1, fragment 1's sync in flight (it lands after step 2): settled into the checkpoint
    _run(tokens, **options, stop_after=2, checkpoint_dir=str(tmp_path))
    resumed = _run(tokens, **options, resume=True, checkpoint_dir=str(tmp_path))
    assert resumed.losses == report.losses  # the in-flight sync and every part's residuals restored
    params = list(build_stage(MODEL_PRESETS["tiny-2layer"], 0, 0, 1).parameters())
    groups = HierarchicalGroups(Regions.of([[0, 1], [2, 3]]), 2, (), {})

    def hier_bytes(fragment: list) -> int:
        sizes = [params[piece.index].numel() for piece in fragment]
        return max(sum(sum(vars(expected_link_bytes(get_codec(codec), groups, rank, sum(sizes),
                                                    segments=sizes)).values())
                       for codec in ("int8-block", "int8-block", SECOND_MOMENT_CODEC)) for rank in range(4))

    first, second = (hier_bytes(f) for f in fragment_pieces(params, 2))
    region = report.rows[0].dp_bytes  # the region's every-step mean (step 0: no outer sync)
    # fragment 1 starts after step 1, fragment 0 after step 3; each lands a step later; step 5 (the last) syncs both,
    # blocking
    assert [row.dp_bytes - region for row in report.rows] == [0, 0, second, 0, first, first + second]
