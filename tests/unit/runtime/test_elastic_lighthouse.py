"""The lighthouse's join timeout: a group that heartbeats but has not asked for the quorum (a restarted
group still loading) is left for the next quorum before the groups that asked reach their quorum timeout."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest

from geotrain.runtime.elastic.lighthouse import join_timeout_s

pytest.importorskip("torchft")


def test_a_healthy_group_that_never_asks_does_not_hold_the_quorum_past_the_askers_timeout():
    from torchft._torchft import LighthouseClient, LighthouseServer

    quorum_timeout_s = 3.0
    server = LighthouseServer(bind="127.0.0.1:0", min_replicas=1,
                              join_timeout_ms=int(join_timeout_s(quorum_timeout_s) * 1000),
                              quorum_tick_ms=20, heartbeat_timeout_ms=60_000)
    try:
        address = server.address()
        late = LighthouseClient(address, connect_timeout=timedelta(seconds=5))
        late.heartbeat("late_group")  # healthy for the next minute, and never asks
        askers = [LighthouseClient(address, connect_timeout=timedelta(seconds=5)) for _ in range(2)]
        started = time.monotonic()
        with ThreadPoolExecutor(2) as pool:  # torchft forms a quorum of a majority of the heartbeating groups
            quorums = list(pool.map(lambda i: askers[i].quorum(replica_id=f"asking_group_{i}",
                                                               timeout=timedelta(seconds=quorum_timeout_s)), range(2)))
        waited = time.monotonic() - started
    finally:
        server.shutdown()
    for quorum in quorums:
        assert sorted(m.replica_id for m in quorum.participants) == ["asking_group_0", "asking_group_1"]
    assert join_timeout_s(quorum_timeout_s) - 0.2 <= waited < quorum_timeout_s  # it waited for the late one, not forever
