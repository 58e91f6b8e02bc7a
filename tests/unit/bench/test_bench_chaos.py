"""bench chaos: goodput is useful samples per second relative to the reference row; bad options refused."""

from __future__ import annotations

import pytest

from geotrain.bench.chaos import ChaosBenchConfig, ChaosBenchError, goodput


def test_goodput_is_samples_per_second_relative_to_the_reference():
    assert goodput(6400, 80.0, 6400, 80.0) == 1.0
    assert goodput(6400, 100.0, 6400, 80.0) == pytest.approx(0.8)
    assert goodput(3200, 40.0, 6400, 100.0) == pytest.approx(1.25)


@pytest.mark.parametrize("key", ["steps", "batch_size", "seq_len", "checkpoint_every", "kills"])
def test_counts_below_one_are_refused_naming_the_option(key):
    with pytest.raises(ChaosBenchError, match=f"{key} must be an integer >= 1"):
        ChaosBenchConfig(**{key: 0})


def test_rows_come_in_order_with_goodput_against_their_reference_and_kills_every_quarter(monkeypatch):
    """The nine rows of run_chaos_bench, with the runs stubbed: the first is failure-free; the failing rows
    kill every T = a quarter of the reference's training seconds; goodput uses each row's reference; the last two
    are the adaptive recipe on mixed GPUs (its own reference and kill rate)."""
    import geotrain.bench.chaos as chaos
    import geotrain.data

    asked = []

    def elastic_row(label, config, spec, tokens, time_scale=0.0, adaptive=False):
        asked.append(("elastic", spec, time_scale) + (("adaptive",) if adaptive else ()))
        seconds = 80.0 if spec is None else 100.0
        return chaos.ChaosRow(label, 1.0, config.steps, 0, 0 if spec is None else 3, [], 2.0, seconds, 6400, 0), None

    def sync_row(label, config, kill_times_s, tokens, ckpt_dir, hold_s=0.0):
        asked.append(("sync", kill_times_s, hold_s))
        seconds = 90.0 if not kill_times_s else 150.0
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
                         ("elastic", "kill-site:every=20.000s,count=3", chaos.LINK_STATE_TIME_SCALE, "adaptive")]
    assert rows[7].label == "elastic adaptive (hetero-4x1), no failures"
    assert [r.goodput for r in rows] == pytest.approx([1.0, 0.8, 1.0, 0.8, 1.0, 0.6, 0.6, 1.0, 0.8])
    assert [r.global_restarts for r in rows] == [0, 0, 0, 0, 0, 3, 3, 0, 0]


def test_netlab_adds_two_rows_on_real_links_with_goodput_against_the_netlab_reference(monkeypatch):
    """With netlab the seven rows are followed by the netlab reference and the same partitions in the lab (then
    the two adaptive rows)."""
    import geotrain.bench.chaos as chaos
    import geotrain.data

    asked = []

    def elastic_row(label, config, spec, tokens, time_scale=0.0, netlab=False, adaptive=False):
        asked.append((spec, netlab))
        seconds = {(None, False): 80.0, (None, True): 120.0}.get((spec, netlab), 150.0)
        return chaos.ChaosRow(label, 1.0, config.steps, 0, 0, [], 2.0, seconds, 6400, 0), None

    def sync_row(label, config, kill_times_s, tokens, ckpt_dir, hold_s=0.0):
        return chaos.ChaosRow(label, 1.0, config.steps, 0, 0, [], 2.0, 90.0, 6400, 0)

    monkeypatch.setattr(chaos, "elastic_row", elastic_row)
    monkeypatch.setattr(chaos, "sync_row", sync_row)
    monkeypatch.setattr(geotrain.data, "world_tokens", lambda seed: None)
    rows = chaos.run_chaos_bench(ChaosBenchConfig(kills=2, netlab=True))
    assert len(rows) == 11 and rows[0].label == "elastic, no failures"
    assert asked[4:6] == [(None, True), ("partition:every=20.000s,for=10.000s,count=2", True)]
    assert rows[7].label == "elastic (netlab), no failures" and rows[8].label.startswith("elastic (netlab), partition")
    assert [r.goodput for r in rows[7:9]] == pytest.approx([1.0, 0.8])
    assert len(chaos.run_chaos_bench(ChaosBenchConfig(kills=2))) == 9  # opt-in
