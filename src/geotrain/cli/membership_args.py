"""`geotrain plan --exclude-devices IDS` / `--membership FILE`: plan on the live devices only (re-planning
after a device is lost for good; docs/history/fault_tolerance.md, "Re-planning")."""

from __future__ import annotations

import argparse
from typing import Any

from geotrain.cluster import Cluster
from geotrain.cluster.devices import DeviceListError
from geotrain.cluster.membership import Membership, parse_device_names, read_membership_file


def add_membership_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("membership (re-plan without lost devices)")
    ways = group.add_mutually_exclusive_group()
    ways.add_argument("--exclude-devices", metavar="IDS", default=None,
                      help="comma list of devices to leave out (names as the cluster file names them, or indices); "
                           "the plan's assignment still names full-cluster devices and records the excluded ones")
    ways.add_argument("--membership", metavar="FILE", default=None,
                      help="JSON/YAML list of the live devices (names or indices); every other device is left out")


def membership_of(args: Any, cluster: Cluster) -> Membership | None:
    """The live devices the arguments name, or None (every device) without either flag."""
    if args.exclude_devices is not None:
        names = parse_device_names(args.exclude_devices)
        if not names:
            raise DeviceListError(f"--exclude-devices: expected a comma list of device names or indices, "
                                  f"got {args.exclude_devices!r:.60}")
        return Membership.excluding(cluster, names, "--exclude-devices")
    if args.membership is not None:
        return Membership.listing(cluster, read_membership_file(args.membership), args.membership)
    return None
