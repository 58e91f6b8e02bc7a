"""`geotrain bench netlab`: configured vs measured bandwidth and latency per link class of a real lab
(network namespaces + htb on this machine; Linux, root). With `--crosscheck`: the example DDP and
GPipe scripts under the emulator and in the lab, same devices and bytes, seconds per step."""

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
    parser.add_argument("--crosscheck", action="store_true",
                        help="run examples/ddp_train.py and examples/pipeline_train.py emulated and shaped, "
                             "same devices")
    parser.add_argument("--steps", type=int, default=4,
                        help="--crosscheck: steps per script (the first is not counted)")
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

    if args.steps < 2:
        raise NetlabArgsError(f"--steps must be >= 2 (step 0 is not counted), got {args.steps}")
    if args.seconds <= 0 or args.pings < 1:
        raise NetlabArgsError(f"--seconds must be > 0 and --pings >= 1, got {args.seconds}, {args.pings}")
    cluster, devices = lab_devices(args, default_devices)
    if args.crosscheck:
        return _crosscheck(args, cluster, devices)
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


def crosscheck_cases(steps: int) -> list[Any]:
    """The example scripts of this repository: DDP (two sizes) and GPipe (4 micro-batches of 1 MB)."""
    from pathlib import Path

    from geotrain.cli.netlab_cmd import NetlabArgsError
    from geotrain.netlab.crosscheck import CrossCheckCase

    examples = Path(__file__).resolve().parents[3] / "examples"
    if not (examples / "ddp_train.py").is_file():
        raise NetlabArgsError(f"--crosscheck: the example scripts are not in {examples} (a source checkout is needed)")
    n = str(steps)
    return [CrossCheckCase("DDP MLP hidden 1024", str(examples / "ddp_train.py"), ("--steps", n, "--hidden", "1024")),
            CrossCheckCase("DDP MLP hidden 2048", str(examples / "ddp_train.py"), ("--steps", n, "--hidden", "2048")),
            CrossCheckCase("GPipe, 4 micro-batches of 1 MB", str(examples / "pipeline_train.py"),
                           ("--steps", n, "--hidden", "1024", "--batch", "1024", "--microbatches", "4"))]


def _crosscheck(args: Any, cluster: Any, devices: list[int]) -> int:
    from dataclasses import asdict

    from geotrain.cli.output import Output
    from geotrain.netlab.crosscheck import cross_check

    rows = cross_check(cluster, devices, crosscheck_cases(args.steps), nic_gbps=args.nic_gbps)
    out = Output(json_mode=args.json)
    if args.json:
        out.emit_json({"cluster": cluster.name, "devices": devices,
                       "rows": [{**asdict(r), "ratio": r.ratio, "losses_equal": r.losses_equal} for r in rows]})
        return 0
    out.table(f"emulated vs shaped (netlab), {cluster.name}, devices {devices}: seconds per step, median of steps "
              f"1..{args.steps - 1}", ["script", "emulated s", "shaped s", "emulated / shaped", "losses equal"],
              [[r.label, f"{r.emulated_s:.3f}", f"{r.shaped_s:.3f}", f"{100 * (r.ratio - 1):+.1f}%",
                "yes" if r.losses_equal else "no"] for r in rows])
    return 0
