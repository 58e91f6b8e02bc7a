"""optim.local_steps adaptive in the runtime config: it reaches SyncOptions, and what would meet at a step index
other than an outer sync (a pipeline, elastic quorums, mid-run checkpoints) or a streaming sync is refused in one
line naming its keys."""

import numpy as np
import pytest

from geotrain.cluster import load_cluster
from geotrain.runtime import RuntimeConfig, RuntimeConfigError

CLUSTER = load_cluster("seed-datacenter")


def _config(assignment=((0, 1, 2, 3),), **keys) -> RuntimeConfig:
    return RuntimeConfig.of(CLUSTER, np.array(assignment), steps=8, **keys)


def test_adaptive_local_steps_reach_the_sync_options():
    assert _config(sync_every=4, local_steps="adaptive").sync_options(0).heterogeneity.local_steps == "adaptive"
    assert _config(sync_every=4).sync_options(0).heterogeneity.local_steps == "equal"


def test_adaptive_without_sync_every_is_refused():
    with pytest.raises(RuntimeConfigError, match=r"^optim.local_steps shares an outer period's inner steps: it "
                                                 r"needs optim.sync_every \(--sync-every H\), got 'adaptive'$"):
        _config(local_steps="adaptive")


def test_adaptive_with_a_pipeline_is_accepted_and_mid_run_checkpoints_are_taken(tmp_path):
    _config(((0, 1), (2, 3)), sync_every=4, local_steps="adaptive")  # a replica is its whole group of stages
    # each replica's position in its period is checkpointed (sync/adaptive.py): mid-run checkpoints combine
    _config(sync_every=4, local_steps="adaptive", checkpoint_dir=str(tmp_path), checkpoint_every=4)
    _config(sync_every=4, local_steps="adaptive", checkpoint_dir=str(tmp_path), checkpoint_every=0)


def test_adaptive_with_fragments_is_refused_naming_local_steps():
    with pytest.raises(RuntimeConfigError, match=r"^--local-steps adaptive with --fragments 2: fragments sync at "
                                                 r"fixed step offsets, which per-replica step counts break$"):
        _config(sync_every=4, fragments=2, local_steps="adaptive")


def test_the_first_periods_are_shared_by_the_gpus_peaks():
    mixed = load_cluster("examples/clusters/mixed-gpus-3x2.yaml")  # A100 312, V100 125, T4 65 TFLOP/s
    prior = RuntimeConfig.of(mixed, np.array([[0, 2, 4]]), steps=8, sync_every=4,
                             local_steps="adaptive").sync_options(0).heterogeneity.local_steps_prior_s
    assert prior == pytest.approx((1 / 312e12, 1 / 125e12, 1 / 65e12), rel=1e-9)
    assert _config(sync_every=4).sync_options(0).heterogeneity.local_steps_prior_s is None
    # a replica of 2 stages (A100 then T4; V100 then V100): its slowest device, the same on both stages
    staged = RuntimeConfig.of(mixed, np.array([[0, 2], [4, 3]]), steps=8, sync_every=4, local_steps="adaptive")
    for stage in range(2):
        assert staged.sync_options(stage).heterogeneity.local_steps_prior_s == pytest.approx(
            (1 / 65e12, 1 / 125e12), rel=1e-9)
