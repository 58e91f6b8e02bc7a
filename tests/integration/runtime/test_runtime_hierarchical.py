"""`geotrain train --dp-hierarchical` in real processes: one stage x 4 replicas over 2 regions of 2
devices, so the DP group reduces inside each region and compresses only between them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from geotrain.cluster import make_network
from geotrain.data import world_tokens
from geotrain.codecs import get_codec
from geotrain.comm import OneBitLayout
from geotrain.comm.hierarchical import HierarchicalGroups, expected_link_bytes
from geotrain.comm.regions import Regions
from geotrain.models import MODEL_PRESETS
from geotrain.runtime import RuntimeConfig, RuntimeConfigError, launch
from geotrain.runtime import checkpoint as ckpt
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


def test_hierarchical_onebit_adam_crosses_regions_once_with_flat_onebit_adams_loss(tokens, tmp_path):
    """--optimizer onebit-adam --dp-hierarchical: each region averages its gradient at full precision, 1-bit Adam runs
    with the 2 regions as its workers. Bytes between regions (the emulator's, summed over the ranks): the warm-up's
    are hierarchical fp32's; after the freeze one 1-bit message of the regions' layout per region and collective,
    below what flat 1-bit Adam must send between regions. The loss follows flat 1-bit Adam's."""
    steps, warmup = 6, 2
    options = {"optimizer": "onebit-adam", "onebit_warmup_steps": warmup, "steps": steps}
    hier = _run(tokens, **options, dp_hierarchical=True, checkpoint_dir=str(tmp_path))
    flat = _run(tokens, **options)
    assert hier.replicas_in_sync  # every member of a region holds the region's momentum and residuals
    records = [torch.load(ckpt.shard_path(tmp_path, steps, rank), weights_only=True)["records"] for rank in range(4)]
    inter = [sum(r[step]["emulated"]["inter_region_bytes"] for r in records) for step in range(steps)]
    sizes = [p.numel() for p in build_stage(MODEL_PRESETS["tiny-2layer"], 0, 0, 1).parameters()]
    groups = HierarchicalGroups(Regions.of([[0, 1], [2, 3]]), 2, (), {})
    fp32 = sum(expected_link_bytes(get_codec("none"), groups, rank, sum(sizes)).inter_bytes for rank in range(4))
    message = OneBitLayout(sizes, 2).message_bytes  # the regions' 1-bit message (one chunk per region)
    # after the freeze: an all-to-all and an all-gather, each region sending the other its message once
    assert inter == [fp32] * warmup + [2 * 2 * message] * (steps - warmup)
    # flat 1-bit Adam over 4 ranks: in its all-to-all each rank sends the other region's 2 ranks their chunks, in
    # its all-gather each rank's reply reaches the other region at least once: >= 12 of its messages (~n/32 bytes)
    assert 2 * 2 * message < 12 * OneBitLayout(sizes, 4).message_bytes
    # the warm-up averages the same 4 fp32 gradients (in another order: a few ulps, far below 1e-6 of the loss)
    assert hier.losses[:warmup + 1] == pytest.approx(flat.losses[:warmup + 1], rel=1e-6)
    # after it, 1-bit noise of 2 workers instead of 4: measured 0.004-0.018 nats on seeds 0-2 after 6 steps, while
    # flat 1-bit Adam's own seed-to-seed spread is 0.10 nats (docs/history/ddp_and_onebit_adam.md); half of it
    assert hier.losses[-1] == pytest.approx(flat.losses[-1], abs=0.05)
    assert hier.losses[-1] < hier.losses[0] - 0.5


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
