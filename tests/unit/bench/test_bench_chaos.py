"""bench chaos: goodput is useful samples per second relative to the reference row; bad options refused."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from geotrain.bench.chaos import ChaosBenchConfig, ChaosBenchError, async_useful_samples, goodput


def test_goodput_is_samples_per_second_relative_to_the_reference():
    assert goodput(6400, 80.0, 6400, 80.0) == 1.0
    assert goodput(6400, 100.0, 6400, 80.0) == pytest.approx(0.8)
    assert goodput(3200, 40.0, 6400, 100.0) == pytest.approx(1.25)


@pytest.mark.parametrize("key", ["steps", "batch_size", "seq_len", "checkpoint_every", "kills"])
def test_counts_below_one_are_refused_naming_the_option(key):
    with pytest.raises(ChaosBenchError, match=f"{key} must be an integer >= 1"):
        ChaosBenchConfig(**{key: 0})


def test_rows_come_in_order_with_goodput_against_their_reference_and_kills_every_quarter(monkeypatch):
    """The fifteen rows of run_chaos_bench, with the runs stubbed: the first is failure-free; the failing rows
    kill every T = a quarter of the reference's training seconds; goodput uses each row's reference; the last eight
    are the adaptive recipe (elastic), asynchronous updates restarted from checkpoints and asynchronous updates, flat
    and hierarchical, on elastic groups (at time scale 0, the first kill the global model's host's) on mixed GPUs,
    each pair with its own reference and kill rate."""
    import geotrain.bench.chaos as chaos
    import geotrain.data

    asked = []

    def elastic_row(label, config, spec, tokens, time_scale=0.0, recipe=None):
        asked.append(("elastic", spec, time_scale) + ((recipe.get("local_steps", recipe.get("outer_sync")),)
                                                      if recipe else ()))
        seconds = 80.0 if spec is None else 100.0
        return chaos.ChaosRow(label, 1.0, config.steps, 0, 0 if spec is None else 3, [], 2.0, seconds, 6400, 0,
                              0 if spec is None else 2), None

    def sync_row(label, config, kill_times_s, tokens, ckpt_dir, hold_s=0.0, recipe=None):
        asked.append(("sync", kill_times_s, hold_s) + ((recipe["outer_sync"],) if recipe else ()))
        seconds = (90.0 if not kill_times_s else 150.0) if recipe is None else (40.0 if not kill_times_s else 50.0)
        return chaos.ChaosRow(label, 1.0, config.steps, len(kill_times_s), len(kill_times_s), [], 2.0, seconds, 6400,
                              len(kill_times_s))

    monkeypatch.setattr(chaos, "elastic_row", elastic_row)
    monkeypatch.setattr(chaos, "sync_row", sync_row)
    monkeypatch.setattr(geotrain.data, "world_tokens", lambda seed: None)
    rows = chaos.run_chaos_bench(ChaosBenchConfig(kills=3))
    assert [r.label for r in rows][0] == "elastic, no failures" and rows[0].global_restarts == 0
    assert asked[1] == ("elastic", "kill-site:every=20.000s,count=3", 0.0)
    # the partition row and its reference on the emulating backend (its link state), links ~free
    assert asked[2] == ("elastic", None, chaos.LINK_STATE_TIME_SCALE)
    assert asked[3] == ("elastic", "partition:every=20.000s,for=10.000s,count=3", chaos.LINK_STATE_TIME_SCALE)
    assert asked[5] == ("sync", [20.0, 40.0, 60.0], 0.0)
    assert asked[6] == ("sync", [20.0, 40.0, 60.0], 10.0)  # relaunched once the partition heals
    assert asked[7:] == [("elastic", None, chaos.LINK_STATE_TIME_SCALE, "adaptive"),
                         ("elastic", "kill-site:every=20.000s,count=3", chaos.LINK_STATE_TIME_SCALE, "adaptive"),
                         ("sync", [], 0.0, "async"), ("sync", [10.0, 20.0, 30.0], 0.0, "async"),
                         *[step for outer in ("async", "async-hierarchical") for step in (
                             ("elastic", None, 0.0, outer),
                             ("elastic", "kill-site:every=20.000s,count=1,site=host;kill-site:every=20.000s,"
                                         "first=40.000s,count=2", 0.0, outer))]]
    assert rows[7].label == "elastic adaptive (hetero-4x1), no failures"
    assert rows[9].label == "async+ckpt (hetero-4x1), no failures"
    assert rows[10].label == "async+ckpt restart (hetero-4x1), kill a site every 10.0 s"
    assert rows[11].label == "elastic async (hetero-4x1), no failures"
    assert rows[12].label == "elastic async (hetero-4x1), kill a site every 20.0 s"
    assert rows[14].label == "elastic async-hierarchical (hetero-4x1), kill a site every 20.0 s"
    assert [r.goodput for r in rows] == pytest.approx([1.0, 0.8, 1.0, 0.8, 1.0, 0.6, 0.6, 1.0, 0.8, 1.0, 0.8, 1.0, 0.8,
                                                       1.0, 0.8])
    assert [r.global_restarts for r in rows] == [0, 0, 0, 0, 0, 3, 3, 0, 0, 0, 3, 0, 0, 0, 0]
    # --json's rows (asdict): the elections beside the restarts and recoveries
    assert {"goodput", "global_restarts", "recoveries", "val_loss", "elections"} <= set(asdict(rows[12]))
    assert rows[12].elections == 2


def test_netlab_adds_two_rows_on_real_links_with_goodput_against_the_netlab_reference(monkeypatch):
    """With netlab the seven rows are followed by the netlab reference and the same partitions in the lab (then
    the two adaptive rows)."""
    import geotrain.bench.chaos as chaos
    import geotrain.data

    asked = []

    def elastic_row(label, config, spec, tokens, time_scale=0.0, netlab=False, recipe=None):
        asked.append((spec, netlab))
        seconds = {(None, False): 80.0, (None, True): 120.0}.get((spec, netlab), 150.0)
        return chaos.ChaosRow(label, 1.0, config.steps, 0, 0, [], 2.0, seconds, 6400, 0), None

    def sync_row(label, config, kill_times_s, tokens, ckpt_dir, hold_s=0.0, recipe=None):
        return chaos.ChaosRow(label, 1.0, config.steps, 0, 0, [], 2.0, 90.0, 6400, 0)

    monkeypatch.setattr(chaos, "elastic_row", elastic_row)
    monkeypatch.setattr(chaos, "sync_row", sync_row)
    monkeypatch.setattr(geotrain.data, "world_tokens", lambda seed: None)
    rows = chaos.run_chaos_bench(ChaosBenchConfig(kills=2, netlab=True))
    assert len(rows) == 17 and rows[0].label == "elastic, no failures"
    assert asked[4:6] == [(None, True), ("partition:every=20.000s,for=10.000s,count=2", True)]
    assert rows[7].label == "elastic (netlab), no failures" and rows[8].label.startswith("elastic (netlab), partition")
    assert [r.goodput for r in rows[7:9]] == pytest.approx([1.0, 0.8])
    assert len(chaos.run_chaos_bench(ChaosBenchConfig(kills=2))) == 15  # opt-in


def test_async_useful_samples_are_the_final_global_models_updates_times_h_times_the_batch():
    # 4 replicas, 60 steps at H = 5: the budget's 48 outer gradients of 5 steps x 4 sequences
    assert async_useful_samples(48, 5, 4) == 960 == 60 * 4 * 4
    # a run restarted from a checkpoint whose final model holds fewer updates counts only those
    assert async_useful_samples(47, 5, 4) == 940


def test_a_mixed_gpu_entry_adds_its_pair_of_rows_against_its_own_reference(monkeypatch):
    """One more MixedGpuRows entry (here elastic streaming) is one more pair of rows: its reference, then kills every
    T' (a quarter of that reference's seconds, drawn sites), goodput against it."""
    import geotrain.bench.chaos as chaos
    import geotrain.data

    asked = []

    def elastic_row(label, config, spec, tokens, time_scale=0.0, netlab=False, recipe=None):
        asked.append((label, spec, recipe and recipe.get("fragments")))
        seconds = 80.0 if spec is None else 100.0
        return chaos.ChaosRow(label, 1.0, config.steps, 0, 0, [], 2.0, seconds, 6400 if spec is None else 6000, 0), None

    def sync_row(label, config, kill_times_s, tokens, ckpt_dir, hold_s=0.0, recipe=None):
        return chaos.ChaosRow(label, 1.0, config.steps, 0, 0, [], 2.0, 90.0, 6400, 0)

    monkeypatch.setattr(chaos, "elastic_row", elastic_row)
    monkeypatch.setattr(chaos, "sync_row", sync_row)
    monkeypatch.setattr(chaos, "MIXED_GPU_ROWS", (*chaos.MIXED_GPU_ROWS,
                                                  chaos.MixedGpuRows("elastic streaming", {"fragments": 5}, True)))
    monkeypatch.setattr(geotrain.data, "world_tokens", lambda seed: None)
    rows = chaos.run_chaos_bench(ChaosBenchConfig(kills=2))
    assert len(rows) == 17
    assert asked[-2:] == [("elastic streaming (hetero-4x1), no failures", None, 5),
                          ("elastic streaming (hetero-4x1), kill a site every 20.0 s",
                           "kill-site:every=20.000s,count=2", 5)]
    assert rows[-1].goodput == pytest.approx((6000 / 100.0) / (6400 / 80.0))


def test_an_asynchronous_restart_row_counts_the_final_global_models_samples(monkeypatch, tmp_path):
    """sync_row with ASYNC_RECIPE: useful samples are the final global model's updates x H x the batch (the run's
    report), not steps x batch x replicas; a synchronous row's are the latter."""
    from types import SimpleNamespace

    import geotrain.bench.chaos as chaos
    import geotrain.runtime

    updates = {"value": 47}
    launched = []

    def launch(run, progress=None, tokens=None):
        launched.append(run)
        progress(0, run.run.steps)
        progress(1, run.run.steps)
        return SimpleNamespace(report=SimpleNamespace(global_updates=updates["value"], validation=((60, 2.5),)))

    monkeypatch.setattr(geotrain.runtime, "launch", launch)
    config = ChaosBenchConfig(steps=60)
    row = chaos.sync_row("async", config, [], None, tmp_path / "a", recipe=chaos.ASYNC_RECIPE)
    assert launched[0].optim.outer_sync == "async" and launched[0].optim.sync_every == 5
    assert launched[0].cluster.name == "hetero-4x1"
    # a restart row's workers beat from Python threads: 1.5 s; an elastic row's groups (Rust threads): 0.5 s
    assert (launched[0].reliability.heartbeat_timeout_s, launched[0].reliability.heartbeat_interval_s) == (1.5, 0.3)
    elastic = chaos._runtime_config(config, True, "elastic").reliability
    assert (elastic.heartbeat_timeout_s, elastic.heartbeat_interval_s) == (0.5, 0.1)
    assert row.samples == 47 * 5 * config.batch_size and row.val_loss == 2.5
    updates["value"] = None
    assert chaos.sync_row("sync", config, [], None, tmp_path / "b").samples == 60 * config.batch_size * 4
