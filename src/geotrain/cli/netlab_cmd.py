"""`geotrain netlab up|run|down|list`: a cluster's devices as network namespaces with really shaped
links on this Linux machine (root). See docs/history/netlab.md.

    geotrain netlab up   --cluster C [--devices 0,1,8,9 | --plan P.json]   # build, hold until Ctrl-C
    geotrain netlab run  --cluster C [--devices ...|--plan P] -- SCRIPT.py [ARGS]   (or -- -m MODULE ...)
    geotrain netlab down --all [--include-live]                            # remove crashed labs
    geotrain netlab list
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from geotrain.cli.arg_types import bandwidth_gbps

from geotrain.errors import GeotrainError


class NetlabArgsError(GeotrainError, ValueError):
    """Bad netlab command-line options."""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("netlab", help="real shaped links: one network namespace per device (Linux, root)",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    children = parser.add_subparsers(dest="netlab_command", metavar="ACTION", required=True)
    up = children.add_parser("up", help="build a lab and hold it until Ctrl-C/SIGTERM (or --hold seconds)")
    add_lab_arguments(up)
    up.add_argument("--hold", type=float, metavar="SECONDS", help="tear down after this long instead of waiting")
    up.set_defaults(handler=run_up)
    run = children.add_parser("run", help="run a torch.distributed script, one process per device, inside a lab")
    add_lab_arguments(run)
    run.add_argument("--timeout", type=float, metavar="SECONDS", help="stop every rank after this long (exit 124)")
    run.add_argument("command", nargs=argparse.REMAINDER, metavar="-- SCRIPT.py [ARGS] | -- -m MODULE [ARGS]")
    run.set_defaults(handler=run_script_cmd)
    down = children.add_parser("down", help="remove leftover labs of dead owners (SIGKILLed, crashed)")
    down.add_argument("--all", action="store_true", required=True, help="every lab whose owner process is gone")
    down.add_argument("--include-live", action="store_true", help="also labs whose owner still runs")
    down.set_defaults(handler=run_down)
    listing = children.add_parser("list", help="labs present on this machine")
    listing.set_defaults(handler=run_list)


def add_lab_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cluster", required=True, metavar="FILE|PRESET", help="cluster preset or YAML/JSON file")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--devices", metavar="D0,D1,...", help="cluster device indices; rank i plays devices[i] "
                                                              "(default: every device; bench: two per region)")
    which.add_argument("--plan", metavar="PLAN.json", help="plan file: rank s*R + r plays assignment[s][r]")
    parser.add_argument("--nic-gbps", type=bandwidth_gbps, metavar="GBPS",
                        help="cap each device's total outgoing traffic (one NIC shared by all its peers); unset: no cap")


def lab_devices(args: Any, default: Callable[[Any], list[int]] | None = None) -> tuple[Any, list[int]]:
    """(cluster, device list) from --cluster and --devices/--plan; neither: `default(cluster)`, or
    every device."""
    from geotrain.cluster import load_cluster
    from geotrain.cluster.devices import check_device_list
    from geotrain.cli.device_args import rank_devices

    cluster = load_cluster(args.cluster)
    devices = rank_devices(args.plan, args.devices, cluster.n_devices)
    if devices is None:
        return cluster, default(cluster) if default is not None else list(range(cluster.n_devices))
    return cluster, check_device_list(devices, cluster.n_devices)


def _describe(lab: Any) -> tuple[list[str], list[list[str]]]:
    topology = lab.topology
    rows = []
    for device in lab.devices:
        peers = [f"{topology.rate_bps[device.rank, j] / 1e9:g}" for j in range(len(lab.devices)) if j != device.rank]
        rows.append([str(device.rank), f"{device.device} {device.name}", topology.region_names[device.region],
                     device.namespace, device.ifname, device.address, " ".join(peers)])
    return ["rank", "device", "region", "namespace", "interface", "address", "Gbit/s to other ranks"], rows


def run_up(args: Any) -> int:
    from geotrain.cli.output import Output
    from geotrain.netlab import NetLab

    out = Output()
    cluster, devices = lab_devices(args)
    with NetLab(cluster, devices, nic_gbps=args.nic_gbps) as lab:
        columns, rows = _describe(lab)
        out.table(f"netlab {lab.prefix} ({cluster.name}); lab namespace {lab.topology.lab_namespace}", columns, rows)
        out.text(_latency_note(lab))
        if args.nic_gbps is not None:
            out.text(f"NIC: each device's outgoing traffic shares {args.nic_gbps:g} Gbit/s")
        out.text(f"enter a device: ip netns exec {lab.devices[0].namespace} bash; Ctrl-C tears it down")
        sys.stdout.flush()
        if args.hold is not None:
            time.sleep(args.hold)
        else:
            signal.pause()
    return 0


def _latency_note(lab: Any) -> str:
    if lab.latency_shaped:
        return "latency: shaped with netem (one-way cluster latency per device pair)"
    return "latency: NOT shaped (this kernel has no netem); bandwidth is shaped, latency is the host's own"


def run_script_cmd(args: Any) -> int:
    from geotrain.netlab import NetLab, run_script, worst_exit_code

    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise NetlabArgsError("netlab run: give the script after `--`: -- SCRIPT.py [ARGS] or -- -m MODULE [ARGS]")
    argv = [sys.executable, *command]
    cluster, devices = lab_devices(args)
    with NetLab(cluster, devices, nic_gbps=args.nic_gbps) as lab:
        print(f"netlab {lab.prefix}: {len(devices)} ranks; {_latency_note(lab)}", file=sys.stderr, flush=True)
        results = run_script(lab, argv, timeout_s=args.timeout)
    code = worst_exit_code(results)
    if code:
        failed = [f"rank {r.rank}: {'timed out' if r.returncode is None else f'exit {r.returncode}'}"
                  for r in results if r.returncode != 0]
        print("netlab run: " + ", ".join(failed), file=sys.stderr)
    return code


def run_down(args: Any) -> int:
    from geotrain.netlab import sweep_stale_labs

    removed = sweep_stale_labs(include_live=args.include_live)
    print(f"removed {len(removed)} namespaces" + (f": {' '.join(removed)}" if removed else ""))
    return 0


def run_list(args: Any) -> int:
    from geotrain.cli.output import Output
    from geotrain.netlab.names import lab_namespaces, owner_alive

    rows = [[lab.prefix, str(lab.pid), "yes" if owner_alive(lab) else "no (stale)", str(len(names))]
            for lab, names in sorted(lab_namespaces().items(), key=lambda item: item[0].prefix)]
    Output().table("netlab labs", ["prefix", "owner pid", "owner alive", "namespaces"], rows)
    return 0
