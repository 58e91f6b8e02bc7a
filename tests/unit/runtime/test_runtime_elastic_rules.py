"""Which elastic runs of pipeline S > 1 are accepted, and the one line each unsupported one is refused with;
how the launcher judges a replica group of S stage processes by their exits."""

from __future__ import annotations

import numpy as np
import pytest

from geotrain.cluster import load_cluster
from geotrain.runtime import RuntimeConfig, RuntimeConfigError
from geotrain.runtime.elastic.rules import elastic_refusal, sleeps_gpu_speed
from paths import ROOT
from two_gpus import TWO_GPUS_YAML

CLUSTER = load_cluster(str(ROOT / "tests" / "data" / "wan-2x2.yaml"))
ELASTIC = {"elastic": True, "time_scale": 0.0}
S2R2 = [[0, 2], [1, 3]]


def test_an_elastic_plan_of_two_stages_is_accepted_with_both_sync_modes_and_kill_chaos():
    for extra in ({}, {"sync_every": 3}, {"chaos": "kill-site:every=5s,site=1", "min_replicas": 2},
                  {"split": "params"}, {"time_scale": 1.0},  # emulated links: each stage process on its device
                  {"sync_every": 4, "fragments": 2, "sync_delay": 1, "sync_moments": True, "dp_codec": "int8-block"},
                  {"sync_every": 3, "local_steps": "adaptive"},  # the group's stages take one split
                  {"chaos": "partition:site=1,at=5s,for=2s"},  # its stages cut, offline and back together
                  {"netlab": True, "chaos": "kill-site:every=5s,site=1"},  # each stage in its device's namespace
                  {"netlab": True, "chaos": "partition:site=1,at=5s,for=2s"}):  # the links between the sites cut
        config = RuntimeConfig.of(CLUSTER, S2R2, **{**ELASTIC, **extra})
        assert (config.stages, config.replicas) == (2, 2) and elastic_refusal(config) is None


@pytest.mark.parametrize("settings, words", [
    ({"schedule": "1f1b"}, "schedule '1f1b': elastic groups of S = 2 stages run 'gpipe' only"),
    ({"split": "time"}, "schedule.split 'time': elastic groups of S = 2 stages need a split"),
    ({"schedule": "interleaved-1f1b"}, "elastic runs have one stage per group"),
])
def test_what_stays_unsupported_with_two_stages_is_refused_in_one_line(settings, words):
    with pytest.raises(RuntimeConfigError) as caught:
        RuntimeConfig.of(CLUSTER, S2R2, **{**ELASTIC, **settings})
    text = str(caught.value)
    assert text.startswith("--elastic: ") and words in text and "\n" not in text


def test_the_same_settings_stay_accepted_with_one_stage():
    for settings in ({"schedule": "1f1b"}, {"netlab": True}):
        assert elastic_refusal(RuntimeConfig.of(CLUSTER, [[0, 1]], **{**ELASTIC, **settings})) is None


SHARDED = {"shards": np.array([[[0, 1], [2, 3]]]), "sync_every": 4}
"""A 1 x 2 plan of 2 devices per slot (plan --shards 2), each slot one region's 2 devices."""


def test_an_elastic_sharded_plan_runs_diloco_with_kill_and_partition_chaos():
    accepted = RuntimeConfig.of(CLUSTER, [[0, 2]], **ELASTIC, **SHARDED, chaos="kill-site:every=5s,site=1")
    emulated = RuntimeConfig.of(CLUSTER, [[0, 2]], **{**ELASTIC, **SHARDED, "time_scale": 1.0})
    streaming = RuntimeConfig.of(CLUSTER, [[0, 2]], **ELASTIC, **SHARDED, fragments=2, sync_delay=1, sync_moments=True,
                                 dp_codec="int8-block")
    assert accepted.layout.k == 2 and elastic_refusal(accepted) is None and elastic_refusal(emulated) is None
    assert elastic_refusal(streaming) is None
    adaptive = RuntimeConfig.of(CLUSTER, [[0, 2]], **ELASTIC, **{**SHARDED, "sync_every": 3}, local_steps="adaptive",
                                chaos="kill-site:every=5s,site=1")  # each group's shards agree on one split
    assert elastic_refusal(adaptive) is None
    cut = RuntimeConfig.of(CLUSTER, [[0, 2]], **ELASTIC, **SHARDED, chaos="partition:site=1,at=5s,for=2s")
    assert elastic_refusal(cut) is None  # the group's K processes cut, offline and back together
    lab = RuntimeConfig.of(CLUSTER, [[0, 2]], **ELASTIC, **SHARDED, netlab=True)  # each shard in its own namespace
    assert elastic_refusal(lab) is None
    lab_cut = RuntimeConfig.of(CLUSTER, [[0, 2]], **ELASTIC, **SHARDED, netlab=True, chaos="partition:at=1s,for=1s")
    assert elastic_refusal(lab_cut) is None  # the links between the sites cut, the group's own left up


def test_stop_after_and_batch_shares_are_accepted_where_built_and_refused_in_one_line_elsewhere(tmp_path):
    ok = [{"stop_after": 3}, {"stop_after": 4, "sync_every": 2, "checkpoint_dir": "ckpt"}, {"batch_shares": "1,3"},
          {"stop_after": 6, "sync_every": 3, "local_steps": "adaptive", "checkpoint_dir": "ckpt", "resume": True},
          {"sync_every": 3, "local_steps": "adaptive", "sync_delay": 1, "sync_moments": True}]
    for extra in ok:
        assert elastic_refusal(RuntimeConfig.of(CLUSTER, [[0, 2]], **ELASTIC, **extra)) is None
    refused = [({"stop_after": 3, "sync_every": 2}, "--sync-every 2 stop at outer-round ends only"),
               ({"stop_after": 4, "sync_every": 3, "local_steps": "adaptive"}, "--sync-every 3 stop at outer-round "
                                                                               "ends only"),
               ({"batch_shares": "measured"}, "schedule.batch_shares 'measured': not built yet for elastic groups")]
    gpus = tmp_path / "two.yaml"  # 'measured' starts from the GPUs' speeds
    gpus.write_text(TWO_GPUS_YAML)
    for extra, words in refused:
        with pytest.raises(RuntimeConfigError) as caught:
            RuntimeConfig.of(load_cluster(str(gpus)), [[0, 1]], **ELASTIC, **extra)
        assert str(caught.value).startswith("--elastic: ") and words in str(caught.value)


def test_a_group_of_stages_fails_when_one_stage_fails_and_finishes_when_all_have():
    from geotrain.runtime.elastic.group import EXIT_GROUP_ERROR
    from geotrain.runtime.elastic.launch import group_code

    ranks = [3, 4]  # group 1 of S = 2 behind the lighthouse (rank 0)
    assert group_code([None, 0, 0, None, None], ranks) is None
    assert group_code([None, None, None, 0, None], ranks) is None  # stage 0 done, stage 1 still writing
    assert group_code([None, None, None, None, -9], ranks) == -9  # one stage killed: the group failed
    assert group_code([None, None, None, 1, EXIT_GROUP_ERROR], ranks) == EXIT_GROUP_ERROR
    # a stage SIGKILLed and its sibling's "no quorum" that followed (seen in one poll): a failure, restarted
    assert group_code([None, None, None, -9, EXIT_GROUP_ERROR], ranks) == -9
    assert group_code([None, None, None, EXIT_GROUP_ERROR, -15], ranks) == -15
    assert group_code([None, 1, 1, 0, 0], ranks) == 0


def test_a_groups_records_merge_its_stages_with_the_last_stages_loss_and_one_digest_of_all_stages():
    import hashlib

    from geotrain.runtime.elastic.summary import merge_stage_records

    links = {"sent_bytes": 10.0, "inter_region_bytes": 4.0, "emulated_s": 1.5}
    stage0 = [{"step": 4, "loss": None, "synced": True, "params_sha256": "a0", "batch_sum": 7},
              {"step": 5, "loss": None, "synced": True, "params_sha256": "a1", "batch_sum": 9, **links}]
    stage1 = [{"step": 5, "loss": 2.5, "synced": True, "params_sha256": "b1", "batch_sum": 9, "sent_bytes": 3.0,
               "inter_region_bytes": 2.0, "emulated_s": 1.25}]
    merged = merge_stage_records([stage0, stage1])
    assert [r["step"] for r in merged] == [5]  # a step one stage lacks is left out
    assert merged[0]["loss"] == 2.5 and merged[0]["batch_sum"] == 9
    # what the group's processes sent, summed; the latest of their emulated clocks
    assert (merged[0]["sent_bytes"], merged[0]["inter_region_bytes"], merged[0]["emulated_s"]) == (13.0, 6.0, 1.5)
    assert merged[0]["stage_params_sha256"] == ["a1", "b1"]
    assert merged[0]["params_sha256"] == hashlib.sha256(b"a1b1").hexdigest()
    assert merge_stage_records([stage0]) is stage0  # S = 1: as they are


def test_elastic_runs_take_a_codec_or_a_plans_codecs_but_not_an_exchange_of_its_own():
    """A codec of geotrain.codecs (--dp-codec, or a plan's per-stage codecs) runs on torchft's group
    (geotrain.sync.elastic); PowerSGD, its own exchange, is refused in one line naming it."""
    config = RuntimeConfig.of(load_cluster("seed-geo"), [[0, 8]], elastic=True, dp_codecs=("int4-block",))
    assert str(config.sync_options(0).exchange.codec) == "int4-block"
    assert str(RuntimeConfig.of(CLUSTER, [[0, 1]], **ELASTIC, dp_codec="int8-block").comm.dp_codec) == "int8-block"
    with pytest.raises(RuntimeConfigError) as refused:
        RuntimeConfig.of(CLUSTER, [[0, 1]], **ELASTIC, dp_codec="powersgd")
    assert str(refused.value) == ("--elastic: codec 'powersgd' is its own exchange (not a codec of geotrain.codecs): "
                                  "elastic groups run a codec reducer on torchft's group; use a codec such as int8-block")

ASYNC = {**ELASTIC, "sync_every": 3, "outer_sync": "async"}


def test_elastic_async_is_accepted_with_kill_and_partition_chaos_checkpoints_and_emulated_links():
    """Elastic async (flat or hierarchical) writes, resumes from and stops at checkpoints named by the equal
    schedule's step, at any step (not only multiples of H: runtime/elastic/async_checkpoint.py), and merges AdamW's
    second moments with --sync-moments (an elected host serves its copy's: runtime/elastic/async_group.py), and takes
    --fragments flat or hierarchical (a region's server in fragments: runtime/elastic/async_regions.py)."""
    for extra in ({}, {"chaos": "kill-site:every=5s,site=0", "min_replicas": 2}, {"checkpoint_dir": "ckpt"},
                  {"checkpoint_dir": "ckpt", "checkpoint_every": 4, "resume": True, "stop_after": 7},
                  {"time_scale": 1.0}, {"time_scale": 0.1, "outer_sync": "async-hierarchical"},
                  {"checkpoint_dir": "ckpt", "checkpoint_every": 5, "stop_after": 7,
                   "outer_sync": "async-hierarchical"},
                  {"chaos": "partition:site=1,at=5s,for=2s"},
                  {"sync_moments": True, "chaos": "kill-site:every=5s,site=host", "checkpoint_dir": "ckpt"},
                  {"sync_moments": True, "outer_sync": "async-hierarchical"},
                  {"chaos": "partition:at=1s,for=1s", "time_scale": 0.1, "outer_sync": "async-hierarchical"},
                  {"fragments": 2, "sync_moments": True, "chaos": "kill-site:every=5s,site=host"},
                  {"fragments": 2, "outer_sync": "async-hierarchical", "chaos": "kill-site:every=5s,site=host"},
                  {"netlab": True, "time_scale": 0.0, "chaos": "kill-site:every=5s,site=host"}):
        assert elastic_refusal(RuntimeConfig.of(CLUSTER, [[0, 1]], **{**ASYNC, **extra})) is None


def test_elastic_async_on_stages_or_shards_runs_flat_and_hierarchical():
    """Elastic asynchronous groups of S x K > 1 processes (runtime/elastic/async_group.py, Positions): a plan of 2
    stages, or of 2 shards per slot, runs --outer-sync async or async-hierarchical (each position the client of its
    region's server for it: runtime/elastic/async_regions.py) with kill chaos, checkpoints (one shard per position) and
    emulated links (the group's own groups on its devices' links), moment sync (each position's [parameters | v])
    and fragments (each position's own)."""
    for assignment, extra in (([[0, 2], [1, 3]], {}), ([[0, 2]], {"shards": SHARDED["shards"]})):
        plan = assignment if not extra else extra["shards"][..., 0]
        for outer_sync in ("async", "async-hierarchical"):
            settings = {**ASYNC, **extra, "outer_sync": outer_sync}
            config = RuntimeConfig.of(CLUSTER, plan, **{**settings, "chaos": "kill-site:every=5s,site=host"})
            assert elastic_refusal(config) is None
            resumed = RuntimeConfig.of(CLUSTER, plan, **{**settings, "checkpoint_dir": "ckpt", "checkpoint_every": 4,
                                                         "resume": True, "stop_after": 7})
            assert elastic_refusal(resumed) is None
            emulated = RuntimeConfig.of(CLUSTER, plan, **{**settings, "time_scale": 0.1, "sync_moments": True,
                                                          "fragments": 2, "fragment_split": "layers"})
            assert elastic_refusal(emulated) is None


def test_a_partition_with_adaptive_local_steps_runs():
    """The cut group rejoins at a sync, or after the launch's last sync takes a finished peer's final parameters
    (runtime/elastic/late.py): no split brain, so the pair runs, as kills do."""
    adaptive = {**ELASTIC, "sync_every": 3, "local_steps": "adaptive"}
    for chaos in ("partition:site=1,at=1s,for=3s", "kill-site:every=100s,first=1s,site=1,count=1"):
        assert elastic_refusal(RuntimeConfig.of(CLUSTER, [[0, 1]], **adaptive, chaos=chaos)) is None


@pytest.mark.parametrize("plan, settings, words", [
    (S2R2, {}, "(not built yet: a plan of 2 stages); use S = 1"),
    ([[0, 2]], {"batch_shares": "1,3"}, "(not built yet: batch shares '1,3'); use --batch-shares equal"),
    ([[0, 2]], {"dp_hierarchical": True}, "(not built yet: --dp-hierarchical, regions as its workers on a quorum)"),
])
def test_elastic_onebit_adam_runs_groups_of_one_process_weighing_1_and_refuses_the_rest_in_one_line(plan, settings,
                                                                                                    words):
    onebit = {**ELASTIC, "optimizer": "onebit-adam"}
    for extra in ({}, {"chaos": "kill-site:every=5s,site=1", "min_replicas": 1}, {"checkpoint_dir": "ckpt"}):
        assert elastic_refusal(RuntimeConfig.of(CLUSTER, [[0, 2]], **onebit, **extra)) is None
    with pytest.raises(RuntimeConfigError) as caught:
        RuntimeConfig.of(CLUSTER, plan, **onebit, **settings)
    text = str(caught.value)
    assert text.startswith("--elastic: --optimizer onebit-adam: elastic 1-bit Adam runs groups of one process on "
                           "CPU, each weighing 1 ") and text.endswith(words) and "\n" not in text


def test_emulate_gpu_speed_at_time_scale_zero_runs_on_elastic_async_groups_only():
    """No emulated clock counts a GPU's slowness at --time-scale 0: elastic asynchronous groups sleep it out, at any
    time scale (runtime/slowdown.py gpu_speed_faults); any other run at 0 is refused in one line."""
    mixed = load_cluster(str(ROOT / "examples" / "clusters" / "mixed-gpus-3x2.yaml"))
    for outer_sync, time_scale in (("async", 0.0), ("async-hierarchical", 0.0), ("async", 0.1)):
        config = RuntimeConfig.of(mixed, [[0, 2, 4]], **{**ASYNC, "outer_sync": outer_sync, "time_scale": time_scale},
                                  emulate_gpu_speed=True)
        assert config.compute_scale()[4] == pytest.approx(312 / 65) and sleeps_gpu_speed(config)
    # a group of 2 FSDP2 shard processes: each sleeps out its own device's speed
    sharded = RuntimeConfig.of(mixed, [[0, 2]], **{**ASYNC, **SHARDED, "time_scale": 0.0}, emulate_gpu_speed=True)
    assert sharded.layout.k == 2 and elastic_refusal(sharded) is None and sleeps_gpu_speed(sharded)
    for settings in ({"time_scale": 0.0}, ELASTIC, {**ELASTIC, "sync_every": 3}, {**ASYNC, "elastic": False}):
        with pytest.raises(RuntimeConfigError) as caught:
            RuntimeConfig.of(mixed, [[0, 2, 4]], **settings, emulate_gpu_speed=True)
        assert "time_scale 0.0 runs without emulation" in str(caught.value) and "\n" not in str(caught.value)


def test_a_kill_of_the_global_models_host_needs_an_elastic_async_run():
    """kill-site site=host names the group hosting the asynchronous server (moved by elections); a synchronous
    elastic run has no such host: refused in one line."""
    spec = "kill-site:every=5s,count=1,site=host;kill-site:every=5s,count=2"
    for outer_sync in ("async", "async-hierarchical"):
        assert elastic_refusal(RuntimeConfig.of(CLUSTER, [[0, 1]], **{**ASYNC, "outer_sync": outer_sync},
                                                chaos=spec)) is None
    for settings in (ELASTIC, {**ELASTIC, "sync_every": 3}):
        with pytest.raises(RuntimeConfigError) as caught:
            RuntimeConfig.of(CLUSTER, [[0, 1]], **settings, chaos=spec)
        assert str(caught.value).startswith(f"--elastic: reliability.chaos {spec!r}: site=host kills the host of the "
                                            f"global model's server, which only --outer-sync async or "
                                            f"async-hierarchical has")
