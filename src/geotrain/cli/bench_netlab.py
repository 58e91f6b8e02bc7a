"""`geotrain bench netlab`: configured vs measured bandwidth and latency per link class of a real lab
(network namespaces + htb on this machine; Linux, root)."""

from __future__ import annotations

import argparse
from typing import Any

NAME = "netlab"
HELP = ("real shaped links (netlab): configured vs measured TCP goodput and latency per link class "
        "(inside each region, between each region pair); needs root")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from geotrain.cli.netlab_cmd import add_lab_arguments

    add_lab_arguments(parser)
    parser.add_argument("--seconds", type=float, default=0.5, help="each transfer lasts about this long at the configured rate")
    parser.add_argument("--pings", type=int, default=20, help="one-byte TCP round trips per link class (median)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def default_devices(cluster: Any) -> list[int]:
    """The first two devices of every region: enough for one pair of every link class."""
    return [int(d) for g in range(cluster.n_regions) for d in cluster.devices_in_region(g)[:2]]


def run(args: Any) -> int:
    from dataclasses import asdict

    from geotrain.cli.netlab_cmd import NetlabArgsError, lab_devices
    from geotrain.cli.output import Output
    from geotrain.netlab import NetLab
    from geotrain.netlab.linkcheck import check_links

    if args.seconds <= 0 or args.pings < 1:
        raise NetlabArgsError(f"--seconds must be > 0 and --pings >= 1, got {args.seconds}, {args.pings}")
    cluster, devices = lab_devices(args, default_devices)
    with NetLab(cluster, devices, nic_gbps=args.nic_gbps) as lab:
        rows = check_links(lab, args.seconds, args.pings)
        latency_shaped = lab.latency_shaped
    out = Output(json_mode=args.json)
    if args.json:
        out.emit_json({"cluster": cluster.name, "devices": devices, "latency_shaped": latency_shaped,
                       "rows": [asdict(row) for row in rows]})
        return 0
    out.table(f"netlab {cluster.name}: configured vs measured (TCP goodput; latency = median RTT / 2)",
              ["link class", "ranks", "MB sent", "conf. Gbit/s", "meas. Gbit/s", "meas./conf.", "conf. ms", "meas. ms"],
              [[r.label, f"{r.sender}->{r.receiver}", f"{r.n_bytes / 1e6:.1f}", f"{r.configured_gbps:.3f}",
                f"{r.measured_gbps:.3f}", f"{r.measured_gbps / r.configured_gbps:.3f}", f"{r.configured_ms:g}",
                f"{r.measured_ms:.3f}"] for r in rows])
    out.text("latency: shaped with netem" if latency_shaped else
             "latency: NOT shaped (no netem in this kernel): measured ms is the host's own stack")
    return 0
