"""Traffic shaping of one interface through pyroute2: an htb class per destination, netem if present.

    root htb 1:  (unclassified traffic -- ARP, anything not to a lab peer -- goes to 1:1, unshaped)
      class 1:<0x100+j>  rate = ceil = b(i, j), selected by a u32 filter on peer j's address
        leaf tbf <0x2000+j>:  cuts packets longer than 1 ms of the link into frames (links < ~65 Mbit/s)
          netem <0x1000+j>:  delay a(i, j)        (only where the kernel has netem; else the leaf)
      (during a partition, netlab.cuts adds class 1:3, which drops, and its filters ahead of these)

Rates are the cluster file's bandwidths, which the emulator, the cost models and `geotrain probe` all
read as payload (TCP goodput) bit/s; htb counts whole Ethernet frames, so every class is given
rate x WIRE_PER_PAYLOAD (1514 wire bytes per 1448 payload bytes at MTU 1500 with TCP timestamps;
measured before this correction: goodput 95.5-96% of the htb rate), and a TCP stream then gets the
file's bandwidth.

rate == ceil: a class never borrows, so every destination sees exactly its own link, whatever the
others do. With a NIC limit (`nic_bps`), the peer classes hang under one class 1:2 of rate = ceil =
the NIC; each peer is guaranteed NIC / peers and may borrow up to min(b(i, j), NIC): one stream gets
its link's rate (capped by the NIC), concurrent streams share the NIC.

Granularity: htb lets a packet out whenever its bucket is not empty and charges it afterwards, so a
message that finds the bucket full after an idle spell gets (bucket + one packet) through at line
rate. Buckets are 1 ms of the rate (GRANULE_S, at least one frame). Where one of TCP's
segmentation-offloaded packets (up to 64 KiB) holds more than SEGMENT_ABOVE_S of the link (links under
~65 Mbit/s), a tbf leaf that never limits (10x the class's ceil) cuts packets longer than 1 ms into
frames, since tbf segments any packet longer than its bucket. Faster links keep whole packets (at most
8 ms of link), since cutting costs host CPU per frame: on 2 shared cores it slowed a 100 Mbit/s GPipe
run by 0.1-0.2 s per step (docs/history/netlab.md). (Before: 64 KiB buckets
and whole 64 KiB packets let the first ~95 kB of a burst of messages through at once: at 5 Mbit/s each
98 kB pipeline message arrived up to 150 ms early after an idle spell; docs/history/netlab.md.)
"""

from __future__ import annotations

import errno
from collections.abc import Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

ETH_P_IP = 0x0800
ROOT_HANDLE = 0x10000
DEFAULT_CLASS = 0x10001
NIC_CLASS = 0x10002
UNSHAPED_RATE_BPS = 32e9
SHAPE_PRIO = 2
"""The shaping filters' priority (netlab.cuts' filters go first)."""
QUANTUM_BYTES = 65536
MTU_BYTES = 1500  # the lab's veths keep the kernel default
FRAME_BYTES = MTU_BYTES + 14  # one full Ethernet frame on the wire
GSO_MAX_BYTES = 65536  # the largest packet TCP hands a veth (segmentation offload)
GRANULE_S = 1e-3  # the link time one bucket holds, and a cut packet at most
SEGMENT_ABOVE_S = 8e-3  # links where a whole 64 KiB packet holds more than this get packets cut
SEGMENTER_SPEEDUP = 10.0  # the tbf leaf's rate / the class's ceil: it cuts packets, never limits
SEGMENTER_LIMIT_BYTES = 10_000 * FRAME_BYTES  # the tbf leaf's queue (htb's default leaf: 1000 packets)
WIRE_PER_PAYLOAD = (MTU_BYTES + 14) / (MTU_BYTES - 20 - 20 - 12)  # Ethernet / IPv4, TCP + timestamps
_NETEM_MISSING = (errno.ENOENT, errno.EOPNOTSUPP, errno.EINVAL)


@dataclass(frozen=True)
class PeerShape:
    """Traffic to `address`: at most `rate_bps` bit/s, delayed `delay_s` seconds (if netem exists)."""

    address: str
    rate_bps: float
    delay_s: float


def burst_bytes(wire_rate_bps: float) -> int:
    """htb bucket size: GRANULE_S worth of the (wire) rate, at least one frame."""
    return max(FRAME_BYTES, int(wire_rate_bps / 8 * GRANULE_S))


def whole_packet_bytes(wire_rate_bps: float) -> int:
    """The longest packet a class of this (wire) rate sends whole: GRANULE_S of the rate, but more
    than one frame (frames are never cut); longer packets are cut into frames."""
    return max(2 * FRAME_BYTES - 1, int(wire_rate_bps / 8 * GRANULE_S))


def needs_segmenter(wire_ceil_bps: float) -> bool:
    """Whether TCP's largest packets (GSO_MAX_BYTES) hold more than SEGMENT_ABOVE_S of this class."""
    return wire_ceil_bps / 8 * SEGMENT_ABOVE_S < GSO_MAX_BYTES


def netem_available(ipr: IPRoute, probe_ifname: str = "netem-probe") -> bool:
    """Whether this kernel has netem: try to attach one to a throw-away veth (detect, never assume;
    this kernel has no `dummy` links). `ipr` should be bound to a lab namespace, so the probe
    touches nothing else."""
    ipr.link("add", ifname=probe_ifname, kind="veth", peer={"ifname": f"{probe_ifname}p"})
    index = ipr.link_lookup(ifname=probe_ifname)[0]
    try:
        ipr.tc("add", "netem", index, 0x10000, delay=1000)
        return True
    except NetlinkError as exc:
        if exc.code in _NETEM_MISSING:
            return False
        raise
    finally:
        ipr.link("del", index=index)


def shape_egress(ipr: IPRoute, ifindex: int, peers: Sequence[PeerShape], with_delay: bool,
                 nic_bps: float | None = None) -> None:
    """Install the htb tree of the module docstring on interface `ifindex` of `ipr`'s namespace;
    `nic_bps` None: no NIC limit."""
    ipr.tc("add", "htb", ifindex, ROOT_HANDLE, default=DEFAULT_CLASS & 0xFFFF)
    add_class(ipr, ifindex, DEFAULT_CLASS, UNSHAPED_RATE_BPS)
    parent = ROOT_HANDLE
    if nic_bps is not None:
        add_class(ipr, ifindex, NIC_CLASS, nic_bps)
        parent = NIC_CLASS
    for j, peer in enumerate(peers):
        classid = ROOT_HANDLE | (0x100 + j)
        ceil_bps = peer.rate_bps if nic_bps is None else min(peer.rate_bps, nic_bps)
        if nic_bps is None:
            add_class(ipr, ifindex, classid, peer.rate_bps)
        else:
            add_class(ipr, ifindex, classid, nic_bps / len(peers), ceil_bps, parent)
        leaf_parent = classid
        wire_ceil = min(ceil_bps * WIRE_PER_PAYLOAD, UNSHAPED_RATE_BPS)
        if needs_segmenter(wire_ceil):
            segmenter = (0x2000 + j) << 16
            rate = min(wire_ceil * SEGMENTER_SPEEDUP, UNSHAPED_RATE_BPS)
            ipr.tc("add", "tbf", ifindex, segmenter, parent=classid, rate=f"{int(rate)}bit",
                   burst=whole_packet_bytes(wire_ceil), limit=SEGMENTER_LIMIT_BYTES)
            leaf_parent = segmenter | 1  # tbf's one class holds its child qdisc
        if with_delay and peer.delay_s > 0:
            ipr.tc("add", "netem", ifindex, (0x1000 + j) << 16, parent=leaf_parent,
                   delay=int(round(peer.delay_s * 1e6)), limit=100000)
        ipr.tc("add-filter", "u32", ifindex, parent=ROOT_HANDLE, prio=SHAPE_PRIO, protocol=ETH_P_IP, target=classid,
               keys=[f"0x{int(IPv4Address(peer.address)):08x}/0xffffffff+16"])


def add_class(ipr: IPRoute, ifindex: int, classid: int, rate_bps: float, ceil_bps: float | None = None,
              parent: int = ROOT_HANDLE) -> None:
    """An htb class guaranteed `rate_bps` of payload, borrowing up to `ceil_bps` (default: no
    borrowing); htb is given the wire rates (x WIRE_PER_PAYLOAD, within htb's 32-bit field)."""
    ceil_bps = rate_bps if ceil_bps is None else ceil_bps
    rate_bps = min(rate_bps * WIRE_PER_PAYLOAD, UNSHAPED_RATE_BPS)
    ceil_bps = min(ceil_bps * WIRE_PER_PAYLOAD, UNSHAPED_RATE_BPS)
    ipr.tc("add-class", "htb", ifindex, classid, parent=parent, rate=f"{int(rate_bps)}bit",
           ceil=f"{int(ceil_bps)}bit", burst=burst_bytes(rate_bps), cburst=burst_bytes(ceil_bps),
           quantum=QUANTUM_BYTES)
