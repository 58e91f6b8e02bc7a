"""`train --elastic --netlab`: which settings it refuses, and where the processes live without a lab
(the netlab run itself: tests/integration/netlab/test_netlab_elastic_partition.py, root)."""

from __future__ import annotations

import pytest

from geotrain.cluster import load_cluster
from geotrain.runtime import RuntimeConfig, RuntimeConfigError
from geotrain.runtime.elastic.hosts import LabHosts, LocalHosts, group_hosts
from geotrain.runtime.elastic.links import GroupNet, emulates_links
from paths import ROOT

CLUSTER = load_cluster(str(ROOT / "tests" / "data" / "wan-2x2.yaml"))


@pytest.mark.parametrize("settings, words", [
    ({"netlab": True}, "reliability.netlab is an elastic run's setting: it needs reliability.elastic"),
    ({"elastic": True, "netlab": True, "time_scale": 1.0},
     "--elastic: reliability.netlab: the lab shapes the links itself; emulation.time_scale 1.0 would add"),
    ({"elastic": True, "netlab": True, "time_scale": 0.0, "lighthouse": "10.0.0.1:29510"},
     "--elastic: reliability.netlab: the Lighthouse runs inside the lab; drop --lighthouse"),
])
def test_netlab_refuses_what_it_cannot_honour_in_one_line(settings, words):
    with pytest.raises(RuntimeConfigError) as caught:
        RuntimeConfig.of(CLUSTER, [[0, 2]], **settings)
    assert words in str(caught.value) and "\n" not in str(caught.value)


def test_a_netlab_partition_cuts_real_links_so_nothing_is_emulated():
    spec = "partition:site=1,at=1s,for=1s"
    lab = RuntimeConfig.of(CLUSTER, [[0, 2]], elastic=True, netlab=True, time_scale=0.0, chaos=spec)
    emulated = RuntimeConfig.of(CLUSTER, [[0, 2]], elastic=True, time_scale=0.0, chaos=spec)
    assert (emulates_links(lab), emulates_links(emulated)) == (False, True)


def test_without_netlab_every_process_stays_on_the_loopback():
    config = RuntimeConfig.of(CLUSTER, [[0, 2]], elastic=True, time_scale=0.0)
    with group_hosts(config) as hosts:
        assert type(hosts) is LocalHosts and not isinstance(hosts, LabHosts)
        assert hosts.control == "127.0.0.1"
        assert hosts.net(1) == GroupNet("127.0.0.1", "127.0.0.1", None)


def test_netlab_without_root_is_one_line_before_anything_starts(monkeypatch):
    from geotrain.netlab import NetLabError

    config = RuntimeConfig.of(CLUSTER, [[0, 2]], elastic=True, netlab=True, time_scale=0.0)
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    with pytest.raises(NetLabError, match="netlab: needs root"):
        group_hosts(config)
