"""`--chaos partition:...`: the spec parser, its seeded schedule, and the link state the groups read."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from geotrain.cluster import load_cluster
from geotrain.runtime import RuntimeConfig, RuntimeConfigError
from geotrain.runtime.elastic import ChaosSpecError, Cut, Kill, Partition, kill_schedule, parse_chaos, partition_schedule
from geotrain.runtime.elastic.links import emulates_links, process_device, read_cut, set_cut
from fake_store import DictStore
from paths import ROOT

CLUSTER = load_cluster(str(ROOT / "tests" / "data" / "wan-2x2.yaml"))


def test_partition_specs_parse_to_their_numbers():
    assert parse_chaos("partition:site=2,at=30s,for=10s") == (Partition(30.0, 10.0, 2),)
    assert parse_chaos("partition:for=500ms,every=1m,count=3") == (Partition(60.0, 0.5, None, 60.0, 3),)
    assert parse_chaos("partition:at=5,for=2,every=20s;kill-site:every=7s") == (
        Partition(5.0, 2.0, None, 20.0), parse_chaos("kill-site:every=7s")[0])


@pytest.mark.parametrize("spec, words", [
    ("partition:site=1,at=5s", "needs for=DURATION"),
    ("partition:site=1,for=5s", "needs at=DURATION or every=DURATION"),
    ("partition:at=5s,for=0s", "partition for: duration must be a number > 0"),
    ("partition:at=5s,for=10s,every=10s", "every must be more than for (10 s"),
    ("partition:at=5s,for=1s,site=x", "partition site: must be an integer >= 0"),
    ("partition:at=5s,for=1s,count=0", "partition count: must be an integer >= 1"),
    ("partition:at=5s,for=1s,for=2s", "for given twice"),
    ("partition:at=5s,for=1s,first=2s", "is not one of site=, at=, for=, every=, count="),
])
def test_bad_partition_specs_are_one_line_naming_the_part(spec, words):
    with pytest.raises(ChaosSpecError) as caught:
        parse_chaos(spec)
    assert words in str(caught.value) and "\n" not in str(caught.value)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(["site=1", "at=2s", "for=1s", "for=3", "every=5s", "every=1s", "count=2",
                                 "at=-1", "x=1", "site=", ""]), max_size=6))
def test_any_partition_spec_parses_or_is_one_line_and_heals_before_the_next_cut(parts):
    try:
        faults = parse_chaos("partition:" + ",".join(parts))
    except ChaosSpecError as exc:
        assert "\n" not in str(exc)
        return
    cuts = partition_schedule(faults, 3, seed=1, horizon_s=60.0)
    assert cuts and all(0 <= c.group < 3 and math.isfinite(c.at_s) and c.heal_s > c.at_s for c in cuts)
    assert all(a.heal_s < b.at_s for a, b in zip(cuts, cuts[1:]))  # one fault: never two cuts at once


def test_the_partition_schedule_is_a_function_of_the_seed_and_fixed_sites_stay():
    faults = parse_chaos("partition:at=5s,for=2s,every=10s")
    one, again, other = (partition_schedule(faults, 4, seed, 100.0) for seed in (3, 3, 4))
    assert one == again and one != other
    assert [(c.at_s, c.heal_s) for c in one] == [(5.0 + 10 * i, 7.0 + 10 * i) for i in range(10)]
    assert partition_schedule(parse_chaos("partition:site=1,at=4s,for=3s"), 2, 0) == [Cut(4.0, 1, 7.0)]
    mixed = parse_chaos("partition:site=1,at=4s,for=3s;kill-site:every=10s,site=0,count=1")
    assert kill_schedule(mixed, 2, 0) == [Kill(10.0, 0)] and partition_schedule(mixed, 2, 0) == [Cut(4.0, 1, 7.0)]



class _Hosts:
    """The launcher's hosts, keeping the groups each `set_cut` left cut."""

    def __init__(self) -> None:
        self.states: list[set[int]] = []

    def set_cut(self, store: object, groups: dict[int, float]) -> None:
        self.states.append(set(groups))


@pytest.mark.parametrize("first_look_s", [4.0, 7.5, 12.0])
def test_a_cut_lasts_its_duration_from_when_the_launcher_makes_it_however_late(first_look_s):
    # a launcher held up past the heal time (a loaded machine starting processes) once cut and healed in one look:
    # a partition of one poll, which the group never noticed (no rejoin); now it heals `for` seconds after the cut
    from geotrain.runtime.elastic.launch import _partitions, _Watch

    watch, hosts, codes = _Watch(2, first=1, restarts=[0, 0]), _Hosts(), (None, None, None)
    cuts = partition_schedule(parse_chaos("partition:site=1,at=4s,for=3s"), 2, 0)
    cut = []
    for now in (first_look_s, first_look_s + 2.9, first_look_s + 3.0, first_look_s + 9.0):
        _partitions(None, watch, cuts, (None, hosts), now, codes)  # type: ignore[arg-type]
        cut.append(set(watch.cut))
    assert cut == [{1}, {1}, set(), set()] and hosts.states == [{1}, set()]  # 3 s cut, from the first look on
    assert watch.partitions == 1 and len(watch.healed_at[1]) == 1

def test_a_partition_needs_the_emulating_backend_which_elastic_runs_then_use_at_any_time_scale():
    plain = RuntimeConfig.of(CLUSTER, [[0, 2]], elastic=True, time_scale=0.0, chaos="kill-site:every=5s")
    cut = RuntimeConfig.of(CLUSTER, [[0, 2]], elastic=True, time_scale=0.0, chaos="partition:site=1,at=1s,for=1s")
    scaled = RuntimeConfig.of(CLUSTER, [[0, 2]], elastic=True, time_scale=1.0)
    assert (emulates_links(plain), emulates_links(cut), emulates_links(scaled)) == (False, True, True)
    with pytest.raises(RuntimeConfigError, match="chaos partition: site must be a replica group in 0..1, got 2"):
        RuntimeConfig.of(CLUSTER, [[0, 2]], elastic=True, chaos="partition:site=2,at=1s,for=1s")


def test_each_process_of_a_group_emulates_its_own_slot_position_s_device():
    import numpy as np

    shards = np.array([[[0, 1], [4, 5]], [[2, 3], [6, 7]]])  # 2 stages x 2 replicas x 2 shards on lab-2x4
    config = RuntimeConfig.of(load_cluster(str(ROOT / "examples" / "clusters" / "lab-2x4.yaml")), shards[..., 0],
                              elastic=True, shards=shards, sync_every=4)
    # group rank s x K + k of group g: device shards[s, g, k]
    assert [[process_device(config, g, r) for r in range(4)] for g in range(2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [process_device(RuntimeConfig.of(CLUSTER, [[0, 2]], elastic=True), g, 0) for g in range(2)] == [0, 2]



def test_the_link_state_cuts_and_heals_devices_and_the_backend_refuses_a_cut_group():
    from geotrain.emulate.clock import RankClock
    from geotrain.emulate.network import EmulatedNetwork, LinkDown
    from geotrain.emulate.state import EmulationState

    store = DictStore()
    assert read_cut(store) == frozenset()
    set_cut(store, [2])
    assert read_cut(store) == frozenset({2})
    state = EmulationState(EmulatedNetwork.from_cluster(CLUSTER, 0.0), (0, 1, 2), 0, RankClock(0.0),
                           cut_devices=lambda: read_cut(store))
    state.check_links((0, 1), "allreduce")  # the cut device is not a member: delivered
    state.check_links((2,), "allreduce")  # alone: nothing crosses a link
    with pytest.raises(LinkDown, match=r"allreduce among devices \[0, 2\] not delivered: links cut \(partition\) at "
                                       r"device\(s\) \[2\]"):
        state.check_links((0, 2), "allreduce")
    set_cut(store, [])
    state.check_links((0, 2), "allreduce")
    with pytest.raises(LinkDown, match="at a member, when it was issued"):  # healed since: all members fail alike
        state.check_links((0, 2), "allreduce", cut_seen=True)
