"""A torchft-reconfigured emulated group lets go of its real gloo group when torchft aborts or shuts it down:
gloo's abort leaves the connections open, and only freeing the group closes them, which is how a member blocked in
a collective with this process learns at once that it failed (held, it waited out --comm-timeout)."""

from __future__ import annotations

import gc
import weakref

import pytest

from geotrain.cluster import cluster_from_dict
from geotrain.emulate.network import EmulatedNetwork, EmulationError
from geotrain.emulate.torchft_groups import TorchftGroups


class FakeGloo:
    """Stands for dist.ProcessGroupGloo: counts its abort / shutdown calls."""

    def __init__(self, *args: object) -> None:
        self.calls: list[str] = []

    def abort(self) -> None:
        self.calls.append("abort")

    def shutdown(self) -> None:
        self.calls.append("shutdown")


class FakeStore:
    def __init__(self) -> None:
        self.values: dict[str, str] = {}

    def set(self, key: str, value: str) -> None:
        self.values[key] = value

    def get(self, key: str) -> bytes:
        return self.values[key].encode()


@pytest.mark.parametrize("how", ["abort", "shutdown"])
def test_an_aborted_or_shut_down_group_frees_its_gloo_group_and_refuses_more_work(monkeypatch, how):
    import torch.distributed as dist

    monkeypatch.setattr(dist, "ProcessGroupGloo", FakeGloo)
    cluster = cluster_from_dict({"name": "t1", "regions": [{"name": "a", "devices": 1}], "links": []})
    groups = TorchftGroups(EmulatedNetwork.from_cluster(cluster, time_scale=0.0), 0)
    group = groups.create(FakeStore(), 0, 1, None)
    inner = group.inner
    freed = weakref.ref(inner)
    getattr(group, how)()
    assert inner.calls == [how]  # gloo's own abort / shutdown first
    del inner
    gc.collect()
    assert freed() is None  # no reference left, though TorchftGroups keeps the group for its records
    assert groups.groups == [group] and group.devices == [0]
    with pytest.raises(EmulationError, match=f"allreduce on a group torchft aborted or shut down"):
        group.inner.allreduce
    getattr(group, how)()  # twice: nothing more
