"""The rules between the runtime config and geotrain.sync: every stage's gradient sync is checked when
the config is built (one line naming the stage), streaming DiLoCo's settings enter the checkpoint
identity, and an overlapped sync cannot be checkpointed."""

import numpy as np
import pytest

from geotrain.cluster import load_cluster
from geotrain.runtime import RuntimeConfig, RuntimeConfigError

CLUSTER = load_cluster("seed-datacenter")
ASSIGNMENT = np.array([[0, 1], [2, 3]])


def _config(**keys) -> RuntimeConfig:
    return RuntimeConfig.of(CLUSTER, ASSIGNMENT, steps=8, **keys)


def test_sync_options_carry_each_stages_codec_and_the_streaming_settings():
    config = _config(sync_every=4, fragments=2, sync_delay=1, sync_mix=0.5, dp_codecs=("int8-block", "fp16"))
    first, second = config.sync_options(0), config.sync_options(1)
    assert (str(first.exchange.codec), str(second.exchange.codec)) == ("int8-block", "fp16")
    assert (first.streaming.fragments, first.streaming.delay, first.streaming.mix) == (2, 1, 0.5)
    assert first.outer.sync_every == 4


def test_an_overlapped_sync_combines_with_checkpoints(tmp_path):
    # a checkpoint keeps what a posted exchange delivered (sync/settle.py): an exchange in flight is no refusal
    _config(sync_every=4, fragments=2, sync_delay=1, checkpoint_dir=str(tmp_path), checkpoint_every=2)
    _config(sync_every=4, fragments=2, sync_delay=0, checkpoint_dir=str(tmp_path), checkpoint_every=2)


def test_a_sync_no_implementation_runs_is_refused_at_config_time_naming_its_keys_and_stage():
    _config(sync_every=4, sync_delay=1, dp_hierarchical=True)  # the hierarchical exchange is posted (built)
    with pytest.raises(RuntimeConfigError, match=r"^optim.sync_delay, comm.dp_codec \(stage 1\): "
                                                 r"delay 1 overlaps the exchange, which only a codec of "
                                                 r"geotrain.codecs can \(codec 'powersgd'"):
        _config(sync_every=4, sync_delay=1, dp_codecs=("none", "powersgd"))
    _config(optimizer="onebit-adam", dp_hierarchical=True)  # 1-bit Adam between regions (built)


def test_streaming_settings_are_part_of_the_checkpoint_identity_only_when_set():
    blocking = _config(sync_every=4).identity()
    assert "sync_mix" not in blocking and "fragments" not in blocking
    mixed = _config(sync_every=4, fragments=2, sync_mix=0.5).identity()
    assert (mixed["fragments"], mixed["sync_delay"], mixed["sync_mix"]) == (2, 0, 0.5)
    assert mixed != _config(sync_every=4, fragments=2, sync_mix=0.25).identity()


def test_local_evaluation_is_for_one_stage_and_lets_an_overlapped_sync_run_with_a_final_checkpoint(tmp_path):
    with pytest.raises(RuntimeConfigError, match=r"^--eval-local with a plan of 2 pipeline stages: a replica scores "
                                                 r"its own weights on one rank: one pipeline stage only$"):
        _config(eval_every=4, eval_local=True)
    one_stage = RuntimeConfig.of(CLUSTER, np.array([[0, 1, 2, 3]]), steps=8, sync_every=4, sync_delay=2,
                                 eval_every=4, eval_local=True, checkpoint_dir=str(tmp_path), checkpoint_every=0)
    assert one_stage.data.eval_local and one_stage.checkpoint.checkpoint_every == 0


def test_the_asynchronous_servers_merge_and_staleness_power_reach_the_sync_options_and_need_async():
    one_stage = dict(sync_every=4, outer_sync="async", async_merge="heloco", async_staleness_power=0)
    config = RuntimeConfig.of(CLUSTER, np.array([[0, 1, 2, 3]]), steps=8, **one_stage)
    heterogeneity = config.sync_options(0).heterogeneity
    assert (heterogeneity.async_merge, heterogeneity.async_staleness_power) == ("heloco", 0.0)
    with pytest.raises(RuntimeConfigError, match="async_merge"):
        _config(sync_every=4, async_merge="heloco")
    with pytest.raises(RuntimeConfigError, match="async_staleness_power"):
        _config(sync_every=4, outer_sync="async", async_staleness_power=-1)


def test_asynchronous_moment_sync_reaches_the_sync_options_and_refuses_moment_syncs():
    """Every asynchronous push carries the moments (geotrain.sync.async_moments): --moment-syncs N is refused."""
    config = RuntimeConfig.of(CLUSTER, np.array([[0, 1, 2, 3]]), steps=8, sync_every=4, outer_sync="async",
                              sync_moments=True)
    assert config.sync_options(0).outer.sync_moments
    with pytest.raises(RuntimeConfigError, match=r"^optim.moment_syncs counts synchronous outer syncs: with "
                                                 r"optim.outer_sync async-hierarchical every push carries the moments"):
        _config(sync_every=4, outer_sync="async-hierarchical", sync_moments=True, moment_syncs=1)
