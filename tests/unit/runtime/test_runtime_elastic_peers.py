"""The dead-peer signal of an elastic run (runtime/elastic/peers.py): the launcher marks a dead process's torchft
replica id, a quorum's roll call fails at once (PeerDied) when a missing member is dead, and with every member alive
it returns as soon as they all posted; the process group is then built by its class's own method."""

from __future__ import annotations

import threading
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch.distributed as dist

from geotrain.runtime.elastic.peers import (DeadPeers, PeerDied, QuorumGuard, QuorumMembers, announce, note_dead,
                                            roll_call)


@pytest.fixture
def store():
    """A real TCPStore (its wait with a timeout is what the roll call polls with), under a quorum-like prefix."""
    master = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=10), wait_for_workers=False)
    return dist.PrefixStore("q/7/0", master)


def test_the_launcher_marks_the_replica_id_a_group_announced_and_a_restart_announces_a_live_one(store):
    note_dead(store, 0)  # never announced (died before its Manager existed): in no quorum, nothing marked
    announce(store, 1, "geotrain_group_1:aaa")
    peers = DeadPeers(store)
    assert peers.first_dead(["geotrain_group_0:zzz", "geotrain_group_1:aaa"]) is None
    note_dead(store, 1)
    announce(store, 1, "geotrain_group_1:bbb")  # its restarted process
    assert peers.first_dead(["geotrain_group_0:zzz", "geotrain_group_1:aaa"]) == "geotrain_group_1:aaa"
    assert peers.first_dead(["geotrain_group_0:zzz", "geotrain_group_1:bbb"]) is None


def test_a_roll_call_whose_missing_member_is_dead_fails_at_once_not_at_the_timeout(store):
    looked = []

    def dead():
        looked.append(1)
        return "geotrain_group_1:aaa" if len(looked) >= 2 else None  # noted dead while the survivor waits

    # without the dead list the roll call would wait out its timeout: TimeoutError, not PeerDied
    with pytest.raises(PeerDied, match="geotrain_group_1:aaa"):
        roll_call(store, 0, 2, dead, timeout_s=30.0, poll_s=0.05)
    assert len(looked) == 2


def test_a_roll_call_of_live_members_returns_once_all_posted_and_a_missing_live_one_times_out(store):
    late = threading.Timer(0.3, lambda: store.set("geotrain-roll-call/1", "1"))  # a slow member: polled, not dead
    late.start()
    roll_call(store, 0, 2, lambda: None, timeout_s=30.0, poll_s=0.05)
    late.join()
    roll_call(store, 2, 1, lambda: None, timeout_s=0.0)  # a quorum of one waits for nobody
    with pytest.raises(TimeoutError, match="--comm-timeout 0.2 s"):
        roll_call(store, 0, 4, lambda: None, timeout_s=0.2, poll_s=0.05)  # rank 3 never posts


def test_the_manager_client_keeps_each_quorum_s_replica_ids_and_the_guard_checks_them_around_the_class_group(store):
    class Client:
        def _quorum(self, **kwargs):
            return SimpleNamespace(replica_ids=["geotrain_group_0:a", "geotrain_group_1:b"], **kwargs)

        def should_commit(self, *args):
            return True

    manager = SimpleNamespace(_client=Client())
    members = QuorumMembers.install(manager)
    assert manager._client._quorum(step=3).step == 3 and members.ids == ("geotrain_group_0:a", "geotrain_group_1:b")
    assert manager._client.should_commit(0, 3, True) is True  # the rest goes to torchft's client

    class Group:
        def configure(self, *args):
            self.configured = args

        def _create_pg(self, store, rank, world_size):
            return ("built", rank, world_size)

    group, asked = Group(), []
    QuorumGuard(group, members, lambda ids: asked.append(ids), timeout_s=5.0).install()
    store.set("geotrain-roll-call/1", "1")
    group.configure("addr", "geotrain_group_0", 0, 2)
    assert group.configured == ("addr", "geotrain_group_0", 0, 2)  # the class's configure, after one look
    assert asked == [members.ids]
    assert group._create_pg(store, 0, 2) == ("built", 0, 2) and len(asked) == 1  # all there: no second look
    dead = QuorumGuard(Group(), members, lambda ids: ids[1], timeout_s=5.0, poll_s=0.05).install()
    with pytest.raises(PeerDied, match="geotrain_group_1:b"):  # already marked: before connecting to its store
        dead.pg.configure("addr", "geotrain_group_0", 0, 2)
    with pytest.raises(PeerDied):  # marked while the survivor waits at the roll call
        dead.pg._create_pg(store, 0, 3)
