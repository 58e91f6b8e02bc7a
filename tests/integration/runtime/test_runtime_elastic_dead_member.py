"""A quorum member that dies between the quorum and its process group (issue #45), on real torchft: a Lighthouse and
two Managers in this process, each wired as an elastic group's (runtime/elastic/peers.py watch_quorums). Group 1 asks
for the quorum, then "dies" as the launcher sees it (note_dead) and never comes to the rendezvous; group 0's
configuration fails at once with PeerDied instead of waiting out its process group's timeout (before: gloo's
rendezvous timed out after --comm-timeout, 120 s by default)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import torch.distributed as dist

from geotrain.runtime.elastic.peers import PeerDied, note_dead, watch_quorums

pytest.importorskip("torchft")
COMM_TIMEOUT = timedelta(seconds=60)
"""The process group's timeout: what group 0 waited at the rendezvous without the dead list (the test's own
timeout is below it, so a wait fails the test)."""


def _store() -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", 0, None, True, timeout=COMM_TIMEOUT, wait_for_workers=False)


def _manager(group: int, lighthouse: str, pg) -> object:
    from torchft import Manager

    own = _store()  # the group's own store (its rank 0 hosts it), where its Manager server registers
    return Manager(pg=pg, load_state_dict=lambda _: None, state_dict=lambda: {}, min_replica_size=1,
                   use_async_quorum=False, timeout=COMM_TIMEOUT, quorum_timeout=COMM_TIMEOUT,
                   connect_timeout=COMM_TIMEOUT, rank=0, world_size=1, store_addr="127.0.0.1", store_port=own.port,
                   lighthouse_addr=lighthouse, replica_id=f"geotrain_group_{group}", hostname="127.0.0.1",
                   heartbeat_interval=timedelta(milliseconds=100), init_sync=False), own


@pytest.mark.timeout(45)
def test_a_member_dead_before_the_rendezvous_fails_the_survivor_s_configuration_at_once():
    from torchft import ProcessGroupGloo
    from torchft._torchft import LighthouseServer

    lighthouse = LighthouseServer(bind="127.0.0.1:0", min_replicas=1, join_timeout_ms=30_000, quorum_tick_ms=50,
                                  heartbeat_timeout_ms=30_000)
    launcher = _store()
    pgs = [ProcessGroupGloo(timeout=COMM_TIMEOUT) for _ in range(2)]
    managers = [_manager(g, lighthouse.address(), pgs[g]) for g in range(2)]
    for g, (manager, _) in enumerate(managers):
        watch_quorums(manager, pgs[g], launcher, g, 0, COMM_TIMEOUT.total_seconds())
    released = threading.Event()

    def dies(store, rank, world_size):  # group 1 got the quorum; its process ends before the rendezvous
        note_dead(launcher, 1)
        released.wait()
        raise RuntimeError("dead")

    pgs[1]._create_pg = dies
    other = threading.Thread(target=managers[1][0].start_quorum, daemon=True)
    other.start()
    try:
        managers[0][0].start_quorum()  # returns once the configuration failed (torchft reports the error)
        error = managers[0][0].errored()
        assert error is not None and isinstance(error.original_exception, PeerDied), error
        assert "geotrain_group_1:" in str(error.original_exception)
    finally:
        released.set()
        other.join(timeout=10)
        for manager, _ in managers:
            manager.shutdown(wait=True)
        lighthouse.shutdown()
