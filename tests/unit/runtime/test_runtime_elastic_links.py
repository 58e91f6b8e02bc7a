"""The emulated links of elastic asynchronous groups' TCP messages (runtime/elastic/links.py SocketPacing): each message
takes latency + 8 x bytes / bandwidth between its two devices, slept x the time scale, and counts in its process's
bytes; a client's link (runtime/elastic/elected.py) paces its request and the reply to the host's published device.
A partition (links.CutHold) holds a message whose either end is cut until the heal, at most --comm-timeout."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from geotrain.cluster.io import parse_cluster_text
from geotrain.emulate.network import EmulatedNetwork
from geotrain.runtime.config import RuntimeConfig
from geotrain.runtime.elastic.elected import ElectedLink, HeldModel, Tier, publish_host
from geotrain.runtime.elastic.links import CutHold, SocketPacing, cut_hold, message_bytes, set_cut, socket_pacing
from geotrain.sync.async_socket import ServerSilent
from geotrain.sync.elastic import QuorumLost
from geotrain.sync.async_wire import HEADER_BYTES
from fake_store import DictStore
from runtime_2x2 import CLUSTER_YAML

CLUSTER = parse_cluster_text(CLUSTER_YAML)  # devices 0, 1 east; 2, 3 west: 0.01 Gbit/s and 20 ms between, 10 / 0.1 in
SCALE = 0.5


def _pacing(device: int) -> tuple[SocketPacing, list[float]]:
    slept: list[float] = []
    return SocketPacing(EmulatedNetwork.from_cluster(CLUSTER, SCALE), CLUSTER.region_of, device, slept.append), slept


def test_a_message_takes_latency_plus_its_bytes_over_the_bandwidth_slept_at_the_time_scale_and_counted():
    pacing, slept = _pacing(0)
    gradient = torch.zeros(1000)
    nbytes = HEADER_BYTES + 4000
    assert message_bytes(gradient) == nbytes and message_bytes(None) == HEADER_BYTES
    across = 0.020 + 8 * nbytes / 0.01e9  # east -> west, from the cluster file's figures
    inside = 0.0001 + 8 * HEADER_BYTES / 10e9
    assert pacing.carry(0, 2, gradient) == pytest.approx(across, rel=1e-12)
    assert pacing.carry(1, 0, None) == pytest.approx(inside, rel=1e-12)
    assert pacing.carry(0, 0, gradient) == 0.0  # a client in its host's process: no link
    assert slept == pytest.approx([SCALE * across, SCALE * inside])
    carried = pacing.take()
    assert carried == pytest.approx({"sent_bytes": nbytes + HEADER_BYTES, "inter_region_bytes": nbytes,
                                     "link_s": across + inside})
    assert pacing.take() == {"sent_bytes": 0.0, "inter_region_bytes": 0.0, "link_s": 0.0}


def test_groups_pace_their_messages_only_with_emulated_links():
    config = RuntimeConfig.of(CLUSTER, [[2, 0]], elastic=True, time_scale=0.25, sync_every=3, outer_sync="async")
    pacing = socket_pacing(config, 0)
    assert pacing is not None and pacing.device == 2 and pacing.network.time_scale == 0.25
    assert socket_pacing(RuntimeConfig.of(CLUSTER, [[2, 0]], elastic=True, time_scale=0.0, sync_every=3,
                                          outer_sync="async"), 0) is None


def test_a_clients_request_and_reply_take_the_links_to_the_hosts_published_device():
    """Client 1 on device 2 (west) of a host on device 0 (east): its request (the gradient) and the reply (the model)
    each sleep their own transfer; the host's own client (device 0) sleeps nothing."""
    from geotrain.optim.delayed_nesterov import DelayedNesterov
    from geotrain.sync.async_server import OuterServer
    from geotrain.sync.async_socket import SocketServer

    store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=10), wait_for_workers=False)
    tier = Tier("async/", (0, 1), 0, 1, 0.1, 10.0, b"key")
    host = SocketServer(OuterServer(torch.zeros(500), DelayedNesterov(1, 1.0, 0.0, 0.0), [], 2), "127.0.0.1", b"key")
    try:
        publish_host(store, tier, 0, host, 0)
        (own, own_slept), (far, far_slept) = _pacing(0), _pacing(2)
        links = [ElectedLink(store, tier, c, HeldModel(torch.zeros(500)), lambda epoch: host, True, (c, 0), pacing,
                             pacing.device) for c, pacing in ((0, own), (1, far))]
        for link in links:
            link.exchange(None, False)  # joins
        links[1].exchange(torch.ones(500), False)
        model = HEADER_BYTES + 2000
        assert own_slept == [] and own.take()["sent_bytes"] == 0.0
        assert far_slept == pytest.approx([SCALE * far.message_s(2, 0, HEADER_BYTES), SCALE * far.message_s(0, 2, model),
                                           SCALE * far.message_s(2, 0, model), SCALE * far.message_s(0, 2, model)])
        assert far.take()["inter_region_bytes"] == HEADER_BYTES + 3 * model
        # the host's own client waits out any hold on its own server; a remote one ends at the timeout
        assert links[0].connection.timeout_s is None and links[1].connection.timeout_s == 10.0
    finally:
        host.close()



def _hold(store: DictStore, heal_after: int | None, timeout_s: float = 10.0) -> tuple[CutHold, list[float]]:
    """A CutHold on a fake clock that each poll's sleep advances; the store's cut healed after `heal_after` polls."""
    now, polls = [0.0], []

    def sleep(seconds: float) -> None:
        polls.append(seconds)
        now[0] += seconds
        if len(polls) == heal_after:
            set_cut(store, [])

    return CutHold(timeout_s, poll_s=0.5, clock=lambda: now[0], sleep=sleep), polls


def test_a_message_whose_either_end_is_cut_waits_for_the_heal_and_counts_the_wait():
    store = DictStore()
    hold, polls = _hold(store, heal_after=3)
    assert hold.hold(store, 2, 0) == 0.0 and polls == []  # no link state yet: nothing is cut
    set_cut(store, [0])
    assert hold.hold(store, 1, 3) == 0.0 and hold.hold(store, 0, 0) == 0.0  # other devices; one device's own ends
    assert polls == [] and hold.take() == {"cut_wait_s": 0.0}
    assert hold.hold(store, 2, 0) == 1.5 and polls == [0.5] * 3  # the host's end cut: three polls to the heal
    set_cut(store, [2])
    hold2, _ = _hold(store, heal_after=1)
    assert hold2.hold(store, 2, 0) == 0.5  # the client's own end cut
    assert hold.take() == {"cut_wait_s": 1.5} and hold.take() == {"cut_wait_s": 0.0}


def test_a_cut_past_the_comm_timeout_is_a_silent_host_and_ends_the_client_with_no_election():
    store = DictStore()
    set_cut(store, [0])
    hold, polls = _hold(store, heal_after=None, timeout_s=2.0)
    with pytest.raises(ServerSilent, match="links of device 0 stayed cut .* --comm-timeout 2 s"):
        hold.hold(store, 2, 0)
    assert hold.take()["cut_wait_s"] == pytest.approx(2.5)
    link = ElectedLink(store, Tier("async/", (0, 1), 0, 1, 0.1, 2.0, b"key"), 1, HeldModel(None), lambda e: None, True,
                       device=2, cuts=hold)
    link.host_device, link.connection = 0, object()  # connected to epoch 0's host, whose links stay cut
    with pytest.raises(QuorumLost, match="client 1 of async: the links of device 0 stayed cut"):
        link.exchange(torch.ones(4), False)
    assert not store.check(["async/vote/1/1"])  # no vote: the host is alive, only cut


def test_only_a_run_with_a_partition_holds_its_messages():
    kwargs = {"elastic": True, "sync_every": 3, "outer_sync": "async", "comm_timeout_s": 7.0}
    assert cut_hold(RuntimeConfig.of(CLUSTER, [[0, 2]], **kwargs)) is None
    assert cut_hold(RuntimeConfig.of(CLUSTER, [[0, 2]], **kwargs, chaos="kill-site:every=5s,site=0")) is None
    hold = cut_hold(RuntimeConfig.of(CLUSTER, [[0, 2]], **kwargs, chaos="partition:site=1,at=1s,for=1s"))
    assert hold is not None and hold.timeout_s == 7.0
