"""An elastic run reports failures, chaos and rejoins as they happen, naming the replica group's site."""

import json

from geotrain.cluster import load_cluster
from geotrain.runtime import RuntimeConfig
from geotrain.runtime.elastic.group import failure_file
from geotrain.runtime.elastic.launch import _failure_reason, _say_rejoins, _Watch, group_sites


class FakeStore:
    def __init__(self, values):
        self.values = {k: v.encode() for k, v in values.items()}

    def check(self, keys):
        return all(k in self.values for k in keys)

    def get(self, key):
        return self.values[key]


def test_each_group_is_named_by_the_site_of_its_stage_0_device():
    config = RuntimeConfig.of(load_cluster("seed-geo"), [[0, 8, 16], [1, 9, 17]])
    assert group_sites(config) == ("region0", "region1", "region2")


def test_rejoins_are_reported_once_each_as_they_appear():
    lines = []
    watch = _Watch(3, sites=("oregon", "virginia", "tokyo"), on_event=lines.append)
    watch.say(1, "failed (killed by SIGKILL): restart 1 of 3")
    store = FakeStore({"rejoins": "1", "rejoin/1": json.dumps({"group": 1, "step": 11, "t": 0.0, "seconds": 9.3})})
    _say_rejoins(store, watch)
    _say_rejoins(store, watch)  # nothing new
    assert lines == ["replica group 1 (virginia) failed (killed by SIGKILL): restart 1 of 3",
                     "replica group 1 (virginia) rejoined at step 11 (recovered from a live peer in 9.3 s)"]


def test_a_failed_groups_line_names_the_error_its_process_wrote_once(tmp_path):
    """A group process that ends with an unexpected error writes it in one line (group.failure_file); the launcher's
    "failed (...)" line names it (before: only "exited with status 1", the log being in a temporary directory), and
    a restarted group's own failure is not named by the old one's."""
    (tmp_path / failure_file(1, 1)).write_text("ValueError: Default process group has not been initialized\n")
    assert _failure_reason(tmp_path, 1, 1) == ("exited with status 1: ValueError: Default process group has not "
                                               "been initialized")
    assert _failure_reason(tmp_path, 1, 1) == "exited with status 1"
    assert _failure_reason(tmp_path, 0, -9) == _failure_reason(tmp_path, 0, -9) != ""
