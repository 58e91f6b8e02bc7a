"""netlab.cuts: what a cut refuses before touching the kernel, and how a process reads its interface's cut state (the
cuts themselves, root: tests/integration/netlab/test_netlab_elastic_partition.py and ..._pipeline.py)."""

from __future__ import annotations

import pytest

from geotrain.cluster import load_cluster
from geotrain.netlab.cuts import is_cut, set_cut
from geotrain.netlab.names import LabName
from geotrain.netlab.topology import NetLabError, lab_topology
from paths import ROOT

CLUSTER = load_cluster(str(ROOT / "tests" / "data" / "wan-2x2.yaml"))


def test_a_lab_rank_in_two_cut_sites_is_refused_in_one_line():
    topology = lab_topology(CLUSTER, [0, 1, 2, 3], LabName(pid=1, tag="beef"))
    with pytest.raises(NetLabError) as caught:
        set_cut(topology, [[1, 2], [2, 3]], frozenset())
    assert "a lab rank in two cut sites" in str(caught.value) and "\n" not in str(caught.value)


def test_an_interface_without_a_cut_reads_uncut_and_an_unknown_one_is_one_line():
    assert is_cut("lo") is False
    with pytest.raises(NetLabError) as caught:
        is_cut("gt-nonesuch")
    assert "'gt-nonesuch' not found" in str(caught.value) and "\n" not in str(caught.value)
