"""A failed replica group restarts in a pre-started spare process; its old slot starts the next spare."""

from geotrain.cluster import load_cluster
from geotrain.runtime import RuntimeConfig
from geotrain.runtime.elastic.launch import _Watch
from geotrain.runtime.elastic.spares import SPARES, spare_count, spare_key


class FakeSupervisor:
    def __init__(self):
        self.restarted = []

    def restart(self, ranks, spec=None):
        self.restarted.append((list(ranks), spec))


class FakeStore:
    def __init__(self):
        self.values, self.deleted = {}, []

    def set(self, key, value):
        self.values[key] = value

    def delete_key(self, key):
        self.deleted.append(key)
        return self.values.pop(key, None) is not None


def test_a_failed_group_runs_in_the_waiting_spare_and_its_old_slot_becomes_the_next_spare():
    supervisor, store = FakeSupervisor(), FakeStore()
    watch = _Watch(2, first=1, restarts=[0, 0], spares=[3], spare_spec=lambda rank: ("spare", rank))
    watch.restart(supervisor, store, 1)  # group 1 (rank 2) fails: spare 3 takes it over
    assert store.values == {spare_key(3): "1"} and watch.ranks(1) == [3] and watch.spares == [2]
    assert supervisor.restarted == [([2], ("spare", 2))]
    watch.restart(supervisor, store, 1)  # and again: the new spare in rank 2 takes it, rank 3 waits anew
    assert store.values[spare_key(2)] == "1" and watch.ranks(1) == [2] and watch.spares == [3]
    assert spare_key(3) in store.deleted and spare_key(3) not in store.values  # the next spare there waits afresh
    assert supervisor.restarted[-1] == ([3], ("spare", 3))
    watch.spares.clear()  # no spare left (one died): the group's process starts anew
    watch.restart(supervisor, store, 0)
    assert supervisor.restarted[-1] == ([1], None) and watch.ranks(0) == [1]


def test_spares_run_for_one_process_groups_that_are_restarted():
    cluster = load_cluster("seed-geo")
    assert spare_count(RuntimeConfig.of(cluster, [[0, 1, 2, 3]], elastic=True)) == SPARES == 1
    assert spare_count(RuntimeConfig.of(cluster, [[0, 1, 2, 3]], elastic=True, max_restarts=0)) == 0
    two_stages = RuntimeConfig.of(cluster, [[0, 1], [2, 3]], elastic=True, time_scale=0.0)
    assert spare_count(two_stages) == 0  # S = 2: a group is two processes
