"""The positions of an elastic asynchronous group of several processes (runtime/elastic/async_positions.py): their
tiers' store prefixes and the copy versions position (0, 0) votes with, per start of the group."""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist

from geotrain.runtime.elastic.async_positions import GroupPositions, position_prefix


def test_position_0_reads_the_copy_versions_its_groups_other_positions_published_in_this_start_only():
    store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=10), wait_for_workers=False)
    assert [position_prefix(r) for r in range(3)] == ["async/", "async/position1/", "async/position2/"]
    first, second, third = (GroupPositions(store, 1, 0, rank, 3) for rank in range(3))
    assert first.versions() == []  # none joined yet
    second.publish(4)
    first.publish(99)  # position (0, 0) votes with its own copy: it publishes nothing
    assert first.versions() == [4]
    third.publish(6)
    second.publish(5)
    assert first.versions() == [5, 6]
    assert GroupPositions(store, 1, 1, 0, 3).versions() == []  # the group's restart: its old copies are gone
    assert GroupPositions(store, 0, 0, 0, 3).versions() == []  # another group's
    assert GroupPositions(store, 1, 0, 0, 1).least(7) == 7  # a group of one process agrees with itself
    # async-hierarchical: the copies of the global model (a region host's link) publish apart, and the group votes
    # none while a position holds no copy of it
    upstream = [GroupPositions(store, 1, 0, rank, 3, "global/") for rank in range(3)]
    upstream[1].publish(2)
    assert upstream[0].versions() == [2] and upstream[0].complete_versions() is None
    upstream[2].publish(3)
    assert upstream[0].complete_versions() == [2, 3] and first.versions() == [5, 6]
