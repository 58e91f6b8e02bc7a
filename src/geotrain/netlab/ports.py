"""A lab device's link as a switch: its bridge port set down (a partition: the device is cut off from
every other device and from the lab's control address) and up again, and how a process inside the
device's namespace sees it (the interface's carrier, as a host sees its cable unplugged).

    set_port(lab.topology.lab_namespace, "gt1p", up=False)    # cut lab device 1 off
    has_carrier("gt1")                                         # inside device 1's namespace: False

A port down is a real partition for TCP: nothing arrives and nothing is refused (no reset), so the
peers learn of it only by their timeouts; established connections resume after `up=True` if neither
side gave up meanwhile.
"""

from __future__ import annotations

import fcntl
import socket
import struct

from pyroute2 import IPRoute

from geotrain.netlab.topology import NetLabError

_SIOCGIFFLAGS = 0x8913
_IFF_RUNNING = 0x40  # the kernel's carrier (RFC 2863 operational state) of the interface


def set_port(lab_namespace: str, port_ifname: str, up: bool) -> None:
    """Set bridge port `port_ifname` (in `lab_namespace`) up or down."""
    with IPRoute(netns=lab_namespace, flags=0) as ipr:
        index = ipr.link_lookup(ifname=port_ifname)
        if not index:
            raise NetLabError(f"netlab: no port {port_ifname!r} in namespace {lab_namespace}")
        ipr.link("set", index=index[0], state="up" if up else "down")


def has_carrier(ifname: str) -> bool:
    """Whether interface `ifname` of this thread's network namespace has a carrier (its veth peer, the
    bridge port, is up). NetLabError if there is no such interface here."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            reply = fcntl.ioctl(sock.fileno(), _SIOCGIFFLAGS, struct.pack("256s", ifname.encode()))
        except OSError as exc:
            raise NetLabError(f"netlab: interface {ifname!r} not found in this namespace: {exc.strerror}") from None
    flags = struct.unpack_from("H", reply, 16)[0]
    return bool(flags & _IFF_RUNNING)
