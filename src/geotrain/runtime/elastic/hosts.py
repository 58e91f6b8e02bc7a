"""Where an elastic run's processes live: all on this host's loopback (`LocalHosts`), or each replica group
in the netlab namespace of its plan device, over really shaped TCP (`LabHosts`, `--netlab`).

    with group_hosts(config) as hosts:                      # builds the lab (--netlab), removes it at exit
        store = hosts.store(timeout)                       # the launcher's bookkeeping store
        spec = hosts.target(context, g, group_main, args, name, r)   # a supervisor rank for group g's rank r
        hosts.set_cut(store, {1})                          # a partition: group 1's links cut, the others' healed

In a lab, group rank r of replica group g (S x K processes: r = stage x K + shard) runs in the namespace of lab
rank g x S x K + r, its own plan device (links.process_device), with GLOO_SOCKET_IFNAME set to its lab interface,
advertising its lab address 10.77.<region>.<k+1> to torchft (Manager, TCPStore, the checkpoint server); the group's
own store is on its rank 0's address (the group's pipeline and FSDP2 traffic on the site's lab links, each
position's outer sync on the links between the sites). The Lighthouse and the launcher's store live in the lab
namespace itself, on its control address (netlab.topology): every group reaches them unshaped, as in the
emulation, where the quorum RPCs are not on emulated links. A cut of a group cuts the links between its S x K devices (a
site) and the rest of the lab (netlab.cuts): its traffic to its peers, the Lighthouse and the store stops, with no
error (TCP retransmits), until the heal, while its own pipeline and FSDP2 traffic flows on between its devices.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from datetime import timedelta
from typing import Any

from geotrain.procs import Target
from geotrain.runtime.config import RuntimeConfig
from geotrain.runtime.elastic.links import LOCAL_HOST, GroupNet, group_devices, set_cut
from geotrain.runtime.elastic.stage import group_size


class LocalHosts:
    """Every process on this host's loopback; a cut is the emulated link state (runtime/elastic/links.py)."""

    control = LOCAL_HOST
    """The address of the Lighthouse and of the launcher's store."""

    def __init__(self, config: RuntimeConfig) -> None:
        self.config = config

    def __enter__(self) -> LocalHosts:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def store(self, timeout: timedelta) -> Any:
        from torch.distributed import TCPStore

        return TCPStore(LOCAL_HOST, 0, None, True, timeout=timeout, wait_for_workers=False)

    def target(self, context: Any, group: int | None, fn: Callable[..., Any], args: tuple[Any, ...],
               name: str, rank: int = 0) -> Target:
        """The supervisor rank running `fn(*args)` for group rank `rank` of replica group `group` (None: the
        Lighthouse)."""
        return Target(context, fn, args, name)

    def net(self, group: int, rank: int = 0) -> GroupNet:
        return GroupNet()

    def set_cut(self, store: Any, groups: Collection[int]) -> None:
        """Cut the links of `groups`, heal every other group's."""
        set_cut(store, [device for g in groups for device in group_devices(self.config, g)])


class LabHosts(LocalHosts):
    """Each replica group in its plan device's lab namespace (see the module doc); enter it to build the lab.
    NetLabError at once (before any process starts) where labs cannot be built (not root)."""

    def __init__(self, config: RuntimeConfig) -> None:
        from geotrain.netlab import NetLab
        from geotrain.netlab.build import check_can_build

        check_can_build()
        super().__init__(config)
        self.size = group_size(config)  # lab rank g x size + r: group g's rank r, on its own device
        self.lab = NetLab(config.cluster, [d for g in range(config.replicas) for d in group_devices(config, g)])
        self.control = self.lab.control_address

    def __enter__(self) -> LabHosts:
        self.lab.up()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.lab.__exit__(*exc)

    def store(self, timeout: timedelta) -> Any:
        """The store's server and the launcher's connection to it open inside the lab namespace (they stay
        there; the launcher's thread comes back)."""
        from geotrain.netlab.processes import thread_in_namespace

        with thread_in_namespace(self.lab.topology.lab_namespace):
            return super().store(timeout)

    def target(self, context: Any, group: int | None, fn: Callable[..., Any], args: tuple[Any, ...],
               name: str, rank: int = 0) -> Target:
        from geotrain.netlab.processes import run_in_namespace

        if group is None:
            return Target(context, run_in_namespace, (self.lab.topology.lab_namespace, {}, fn, *args), name)
        device = self.lab.devices[group * self.size + rank]
        return Target(context, run_in_namespace,
                      (device.namespace, {"GLOO_SOCKET_IFNAME": device.ifname}, fn, *args), name)

    def net(self, group: int, rank: int = 0) -> GroupNet:
        device, head = self.lab.devices[group * self.size + rank], self.lab.devices[group * self.size]
        return GroupNet(store_host=self.control, advertise=device.address, ifname=device.ifname,
                        group_host=head.address)

    def set_cut(self, store: Any, groups: Collection[int]) -> None:
        """Cut each of `groups` off from the rest of the lab (each its own site), heal every other group."""
        self.lab.set_cut([range(g * self.size, (g + 1) * self.size) for g in sorted(groups)])


def group_hosts(config: RuntimeConfig) -> LocalHosts:
    """LabHosts with `--netlab` (the lab is built when the `with` block starts, removed when it ends), else
    LocalHosts."""
    return LabHosts(config) if config.reliability.netlab else LocalHosts(config)
