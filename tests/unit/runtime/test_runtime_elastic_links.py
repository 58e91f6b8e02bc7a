"""The emulated links of elastic asynchronous groups' TCP messages (runtime/elastic/links.py SocketPacing): each message
takes latency + 8 x bytes / bandwidth between its two devices, slept x the time scale, and counts in its process's
bytes; a client's link (runtime/elastic/elected.py) paces its request and the reply to the host's published device."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from geotrain.cluster.io import parse_cluster_text
from geotrain.emulate.network import EmulatedNetwork
from geotrain.runtime.config import RuntimeConfig
from geotrain.runtime.elastic.elected import ElectedLink, HeldModel, Tier, publish_host
from geotrain.runtime.elastic.links import SocketPacing, message_bytes, socket_pacing
from geotrain.sync.async_wire import HEADER_BYTES
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
        links = [ElectedLink(store, tier, c, HeldModel(torch.zeros(500)), lambda epoch: host, True, (c, 0), pacing)
                 for c, pacing in ((0, own), (1, far))]
        for link in links:
            link.exchange(None, False)  # joins
        links[1].exchange(torch.ones(500), False)
        model = HEADER_BYTES + 2000
        assert own_slept == [] and own.take()["sent_bytes"] == 0.0
        assert far_slept == pytest.approx([SCALE * far.message_s(2, 0, HEADER_BYTES), SCALE * far.message_s(0, 2, model),
                                           SCALE * far.message_s(2, 0, model), SCALE * far.message_s(0, 2, model)])
        assert far.take()["inter_region_bytes"] == HEADER_BYTES + 3 * model
    finally:
        host.close()
